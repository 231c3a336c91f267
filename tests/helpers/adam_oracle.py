"""How strata's CPU Adam is held to torch.optim.Adam / AdamW.

strata performs torch 1.13's Adam step operation for operation (cpu_adam/adam_ref.c), so against torch 1.x (Debian's
python3-torch, which the suite runs on) results must be bit-identical. torch 2 rounds differently: its first moment
is exp_avg.lerp_(grad, 1 - beta1) and its CPU kernels fuse multiply-adds, a last-bit difference per step that
training then carries, and Adam's normalisation can turn into a whole update for a weight whose gradient is
near zero. Against torch 2 the same checks hold within a tolerance a wrong formula or a missed step would still
exceed (one step moves every weight by about lr = 1e-3), and say so."""
import torch

EXACT = int(torch.__version__.split(".")[0]) < 2
RTOL, ATOL = 1e-3, 2e-4
HOW = "bit-identical" if EXACT else "within rtol %g, atol %g (torch %s rounds Adam differently from 1.13)" % (
    RTOL, ATOL, torch.__version__)


def same_tensor(a, b):
    return torch.equal(a, b) if EXACT else torch.allclose(a.float(), b.float(), rtol=RTOL, atol=ATOL)


def same_float(a, b):
    return a == b if EXACT else abs(a - b) <= ATOL + RTOL * abs(b)

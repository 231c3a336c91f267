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


def first_difference(got, want):
    """'name[index]: got vs want' of the first element of dict got that differs bitwise from dict want's, or None."""
    for name, w in want.items():
        a, b = got[name].reshape(-1), w.reshape(-1)
        diff = (a.view(torch.int32) != b.view(torch.int32)).nonzero()
        if len(diff):
            i = diff[0].item()
            return "%s[%d]: %r vs %r" % (name, i, a[i].item(), b[i].item())
    return None


def stage3_steps(params, opt, steps, gas, world, micro_loss):
    """Plain PyTorch over every rank's micro-batches with the gradients summed in ZeRO stage 3's order: each
    micro-batch's gradients summed over the ranks (as the reduce-scatter at its hand-off does), those sums
    accumulated over the micro-batches (as strata's fp32 gradient store does), then one opt.step(). micro_loss(step,
    micro, rank) runs the forward and returns the loss, which is scaled by 1 / (gas x world) as DeepSpeed averages."""
    for step in range(steps):
        store = None
        for micro in range(gas):
            summed = None
            for r in range(world):
                for p in params:
                    p.grad = None
                (micro_loss(step, micro, r) / (gas * world)).backward()
                g = [p.grad.clone() for p in params]
                summed = g if summed is None else [a + b for a, b in zip(summed, g)]
            store = summed if store is None else [a + b for a, b in zip(store, summed)]
        for p, g in zip(params, store):
            p.grad = g
        opt.step()
        opt.zero_grad(set_to_none=True)

"""How strata's CPU Adam is held to torch.optim.Adam / AdamW: bit for bit, on every torch and every machine.

strata performs the Adam step of the torch that runs operation for operation (cpu_adam/adam_ref.c): torch 1.x's
first moment exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1), or torch 2's exp_avg.lerp_(grad, 1 - beta1), chosen
when strata.torch makes an engine (python/strata/torch/_torch_formula.py), and the correctly rounded square root. So
its results equal torch.optim's bit for bit wherever torch's CPU float32 sqrt is correctly rounded too (EXACT):
Debian's torch 1.13 (the floor), and PyPI's torch 2.x on the Intel machines the suite has run on, where MKL takes
its AVX2 path (the suite sets MKL_ENABLE_INSTRUCTIONS=AVX2). Where it is not (PyPI's torch 2.15 on an AMD EPYC: a
fifth of strata's 8192 probes differ, whatever MKL_ENABLE_INSTRUCTIONS, ATEN_CPU_CAPABILITY or MKL_CBWR say),
oracle() makes the torch optimizer compute its sqrt correctly rounded during its step, and nothing else:
torch.optim's own code stays the oracle, with that one rounding fixed, and the comparison stays bit for bit. HOW
says which, and is printed once.

Why not a tolerance there: a one-unit difference in Adam's denominator does not stay small through training. A
parameter whose gradient is zero but for rounding (the attention key's bias: softmax ignores a shift) moves by about
lr a step, its direction the sign of that noise, so once the weights differ anywhere the noise and the direction
differ too. Measured on that EPYC against torch.optim as it is, in one run of each test: weights apart by up to
3.4e-6 after 20 steps (py_torch_engine), 4.3e-3 with Adam's L2 decay (py_offload_adam), a bf16 unit (2.4e-4), a loss
by 8e-6 relative (the fp32 runs' largest in the attention key's bias); a tolerance above those also passes a wrong
lr or a missed step. With the sqrt fixed, every such test is bit-identical there."""
import math
import struct
import types

import torch

import strata_test as T
from strata.torch._torch_formula import torch_sqrt_differs

LERP = int(torch.__version__.split(".")[0]) >= 2  # torch's first moment: exp_avg.lerp_ (2.x) or mul_().add_() (1.x)
SQRT_DIFFERS = torch_sqrt_differs()  # of strata's 8192 probes, how many torch's CPU sqrt rounds otherwise than IEEE
EXACT = SQRT_DIFFERS == 0
if EXACT:
    HOW = "bit-identical (torch %s, whose CPU sqrt is IEEE's here)" % torch.__version__
else:
    HOW = ("bit-identical (torch %s's optimizer with its sqrt correctly rounded: its CPU sqrt is not IEEE's here, "
           "%d of 8192 probes differ)" % (torch.__version__, SQRT_DIFFERS))
print("against torch.optim: %s" % HOW)

_torch_sqrt = torch.Tensor.sqrt
_calls = [0]  # oracle() steps' square roots taken correctly rounded


def ieee_sqrt(x):
    """The correctly rounded float32 square root on any torch: through float64, whose root is within a unit of its
    last place on every torch tried, and a float64 root that close rounds to the correctly rounded float32 one (a
    float32's root lies at least 2^-50 of itself from a float32 rounding boundary). check_ieee_sqrt tests it."""
    return _torch_sqrt(x.double()).float()


def check_ieee_sqrt():
    """ieee_sqrt gives the float nearest the exact root on strata's sqrt probe and on roots next to rounding
    boundaries (x = (m + 1/2)^2 and its neighbours, m a float's significand)."""
    x = torch.rand(8192, generator=torch.Generator().manual_seed(0x5eed))
    m = torch.arange(1 << 23, (1 << 23) + 4096, dtype=torch.float64)
    near = ((m + 0.5) ** 2 * 2.0 ** -46).float()
    near = torch.cat([near, torch.nextafter(near, near + 1), torch.nextafter(near, near - 1)])
    for what, v in (("strata's probe", x), ("roots next to a rounding boundary", near)):
        want = [struct.unpack("f", struct.pack("f", math.sqrt(e)))[0] for e in v.tolist()]
        off = sum(g != w for g, w in zip(ieee_sqrt(v).tolist(), want))
        T.check(off == 0, "the oracle's sqrt is correctly rounded (%s)" % what, "%d of %d differ" % (off, v.numel()),
                0)


def _sqrt(self):
    if self.dtype == torch.float32 and self.device.type == "cpu":
        _calls[0] += 1
        return ieee_sqrt(self)
    return _torch_sqrt(self)


def oracle(opt):
    """opt, a torch optimizer that strata is compared with: as it is where EXACT, else its step() from now on
    computes torch.Tensor.sqrt (the call torch's single-tensor Adam takes its denominator from) and
    torch._foreach_sqrt of CPU float32 tensors correctly rounded. step stays a bound method, so a scheduler built
    on opt (torch counts its steps through step.__func__) wraps it as it wraps torch's."""
    if EXACT:
        return opt
    step = opt.step

    def ieee_step(self, *args, **kwargs):
        saved = torch.Tensor.sqrt, torch._foreach_sqrt
        torch.Tensor.sqrt = _sqrt
        torch._foreach_sqrt = lambda tensors: [_sqrt(t) for t in tensors]
        try:
            return step(*args, **kwargs)
        finally:
            torch.Tensor.sqrt, torch._foreach_sqrt = saved
    opt.step = types.MethodType(ieee_step, opt)
    return opt


def _calls_line():
    return "against torch.optim: the oracle's steps took the square roots of %d tensors correctly rounded" % _calls[0]


if not EXACT:
    T.at_done(_calls_line)


def same_tensor(a, b):
    return torch.equal(a, b)


def same_float(a, b):
    return a == b


def first_difference(got, want):
    """'name[index]: got vs want' of the first element of dict got that differs bitwise from dict want's, or None."""
    for name, w in want.items():
        a, b = got[name].reshape(-1), w.reshape(-1)
        diff = (a.view(torch.int32) != b.view(torch.int32)).nonzero()
        if len(diff):
            i = diff[0].item()
            return "%s[%d]: %r vs %r" % (name, i, a[i].item(), b[i].item())
    return None


def adamw_reference(params, grads, lr, betas, eps, wd, bias_correction=True, sqrt=ieee_sqrt):
    """torch.optim.AdamW's single-tensor step (torch/optim/adam.py) operation for operation, the first moment as the
    running torch updates it, the bias corrections optional (as DeepSpeedCPUAdam's bias_correction), the square root
    correctly rounded (sqrt=torch.sqrt gives torch's own: tests/py_torch_formula.py checks that this is then
    torch.optim.AdamW bit for bit). Steps params (tensors) in place through grads, a list of lists of tensors."""
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    for step, gs in enumerate(grads, 1):
        for p, g, (m, v) in zip(params, gs, state):
            p.mul_(1 - lr * wd)
            if LERP:
                m.lerp_(g, 1 - betas[0])
            else:
                m.mul_(betas[0]).add_(g, alpha=1 - betas[0])
            v.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
            bc1 = 1 - betas[0] ** step if bias_correction else 1.0
            bc2 = 1 - betas[1] ** step if bias_correction else 1.0
            denom = (sqrt(v) / math.sqrt(bc2)).add_(eps)
            p.addcdiv_(m, denom, value=-lr / bc1)


def stage3_steps(params, opt, steps, gas, world, micro_loss):
    """Plain PyTorch over every rank's micro-batches with the gradients summed in ZeRO stage 3's order: each
    micro-batch's gradients summed over the ranks (as the reduce-scatter at its hand-off does), those sums
    accumulated over the micro-batches (as strata's fp32 gradient store does), then one opt.step() (opt: oracle()'s).
    micro_loss(step, micro, rank) runs the forward and returns the loss, which is scaled by 1 / (gas x world) as
    DeepSpeed averages."""
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

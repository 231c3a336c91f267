"""How strata's CPU Adam is held to torch.optim.Adam / AdamW: bit for bit, on every torch.

strata performs the Adam step of the torch that runs operation for operation (cpu_adam/adam_ref.c): torch 1.x's
first moment exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1), or torch 2's exp_avg.lerp_(grad, 1 - beta1), chosen
when strata.torch makes an engine (python/strata/torch/_torch_formula.py). So results must be bit-identical on the
floor torch (Debian's 1.13) and on today's (PyPI's 2.x) alike."""
import torch

HOW = "bit-identical (torch %s)" % torch.__version__
LERP = int(torch.__version__.split(".")[0]) >= 2  # torch's first moment: exp_avg.lerp_ (2.x) or mul_().add_() (1.x)


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

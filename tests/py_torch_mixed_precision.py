"""bf16 and fp16 through strata.torch on the CPU, against torch's own mixed-precision recipe.

The oracle is plain torch: fp32 master weights; a compute copy, model.to(bf16 or fp16), that holds them rounded to
nearest even (its buffers and frozen parameters cast too, as DeepSpeed's module.bfloat16() / .half() casts them);
forward and backward in that copy; each micro-batch's gradients converted to fp32 and summed (strata's fp32 gradient
store); for fp16 the loss taken in fp32 (DeepSpeed's loss.float()), divided by the accumulation steps and multiplied
by the loss scale, the summed gradients multiplied by float(1 / scale) (torch's GradScaler unscales so; strata's Adam
reads grad * grad_scale), a step with an inf or NaN gradient skipped, and the scale updated by DeepSpeed's rule as
strata implements it (engine/step/train_step.c: halve after `hysteresis` overflows, double after loss_scale_window
good steps, a static fp16.loss_scale never changes); then torch.optim.AdamW on the masters and masters -> copy.

strata's fp32 master weights (engine.fp32_state_dict()), its losses, its step results (skipped, loss_scale, Adam's
step count) and the model's state_dict() (the masters rounded) must equal the oracle's. Bit for bit where torch's
AdamW arithmetic is strata's (tests/helpers/adam_oracle.py: strata follows the running torch's first-moment formula)
and torch's float32 sqrt is correctly rounded; that is checked at start, because PyPI torch's CPU sqrt is not on
MKL's AVX-512 path (about 0.7% of results one ulp low; the suite sets MKL_ENABLE_INSTRUCTIONS=AVX2, where it is), so
AdamW's denominator would differ from strata's exact one in a few elements, which training then carries: there the
checks hold within rtol 1e-3, atol 2e-4 (a fifth of one step's move at lr 1e-3), and say so. Adam is nearly blind to a gradient's scale, so a wrong unscale is caught by the bitwise run (Debian's torch
1.13), not by the tolerance.

Models: a small MLP (Linear, GELU, Linear) and a transformer-ish stack (Embedding + an fp32 position buffer, two
blocks of LayerNorm + Linear with a residual, a final LayerNorm, a frozen gain, a head), in bf16 and in fp16, with
gradient accumulation 2. torch 1.x has no fp16 Linear / LayerNorm kernels on the CPU (nor has the oracle), so there
fp16 runs a model of elementwise products and sums; torch 2 runs all three in fp16.

fp16: a dynamic scale through two planned overflow steps (an input 1e4 times larger: the half gradients overflow)
with hysteresis 2 (the first keeps the scale, the second halves it), then growth after loss_scale_window = 2 good
steps; a static scale kept through an overflow; a loss computed in fp16 at the default scale 2^16, whose gradient
overflows fp16 unless the loss is scaled in fp32; engine.backward's scaling seen at the model's output; a plain
loss.backward() refused.

torch.autocast("cpu", bfloat16) works as in torch, and is checked against torch doing the same autocast: inside the
blocks' forward or around engine(x), with strata in fp32 (autocast computes on bf16 copies of the lent fp32 weights,
its cache keyed by the parameter, and their gradients come back in fp32) and in bf16 (the lent weights are bf16
already), and inside blocks under reentrant checkpointing (recomputed in backward, autocast state restored).
"""
import copy
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint  # noqa: E402
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch._torch_formula import torch_sqrt_differs  # noqa: E402

GAS = 2
HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
V, D, SEQ = 16, 32, 6  # the transformer-ish model: vocabulary, width, sequence


# strata's own probe of torch's CPU sqrt (python/strata/torch/_torch_formula.py): 0 where it is correctly rounded (AdamW's
# denominator then equals strata's). The suite runs with MKL_ENABLE_INSTRUCTIONS=AVX2, where it is.
EXACT = torch_sqrt_differs() == 0
RTOL, ATOL = 1e-3, 2e-4
HOW = "bit-identical" if EXACT else (
    "within rtol %g, atol %g: torch %s's float32 sqrt is not correctly rounded, strata's is" % (RTOL, ATOL,
                                                                                               torch.__version__))


def same_float(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b if EXACT or math.isinf(b) else abs(a - b) <= ATOL + RTOL * abs(b)


def first_difference(got, want):
    """'name[index]: got vs want' of the first element outside HOW, or None."""
    for name, w in want.items():
        a, b = got[name].float().reshape(-1), w.float().reshape(-1)
        if EXACT:
            bad = (a.view(torch.int32) != b.view(torch.int32)).nonzero()
        else:
            bad = ((a - b).abs() > ATOL + RTOL * b.abs()).nonzero()
        if len(bad):
            i = bad[0].item()
            return "%s[%d]: %r vs %r" % (name, i, a[i].item(), b[i].item())
    return None


def half_kernels(dtype):
    """Whether nn.Linear and nn.LayerNorm compute in dtype on this torch's CPU (torch 1.x has no fp16 kernels)."""
    try:
        x = torch.ones(2, 4, dtype=dtype)
        F.layer_norm(F.linear(x, torch.ones(4, 4, dtype=dtype)), (4,))
        return True
    except RuntimeError:
        return False


# ------------------------------------------------------------------ models

class MLP(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))


class Elementwise(nn.Module):
    """x @ w.T + b as a broadcast product and a sum: what fp16 can compute on torch 1.x's CPU."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / math.sqrt(n_in))
        self.bias = nn.Parameter(torch.randn(n_out) * 0.1)

    def forward(self, x):
        return (x.unsqueeze(-2) * self.weight).sum(-1) + self.bias


class ElementwiseMLP(nn.Sequential):
    def __init__(self):
        super().__init__(Elementwise(8, 32), Elementwise(32, 8))

    def forward(self, x):
        h = self[0](x)
        return self[1](h + 0.25 * h * h)


class Block(nn.Module):
    def __init__(self, autocast):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.fc = nn.Linear(D, D)
        self.autocast = autocast  # run the forward under torch.autocast("cpu", bfloat16)

    def forward(self, x):
        if self.autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return x + self.fc(self.ln(x))
        return x + self.fc(self.ln(x))


class Stack(nn.Module):
    """Embedding + an fp32 buffer, blocks, LayerNorm, a frozen gain, a head: a transformer without attention."""

    def __init__(self, autocast=False, checkpoint=False):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.register_buffer("pos", torch.randn(SEQ, D) * 0.1)
        self.blocks = nn.ModuleList([Block(autocast), Block(autocast)])
        self.ln_f = nn.LayerNorm(D)
        self.gain = nn.Parameter(1 + 0.1 * torch.randn(D), requires_grad=False)
        self.head = nn.Linear(D, V)
        self.checkpoint = checkpoint

    def forward(self, idx):
        x = self.emb(idx) + self.pos
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=True) if self.checkpoint else b(x)
        return self.head(self.ln_f(x) * self.gain)


def mse(out, y):
    return F.mse_loss(out.float(), y)


def xent(out, y):
    return F.cross_entropy(out.float().reshape(-1, V), y.reshape(-1))


def mse_half(out, y):
    """A loss computed in the half dtype, as a model's own loss may be."""
    return ((out - y.to(out.dtype)) ** 2).mean()


def vector_batches(seed, n, big=()):
    """n micro-batches of (x, y) for the MLPs; micro-batches in `big` get inputs 1e4 times larger."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
        out.append((x * 1e4 if i in big else x, y))
    return out


def token_batches(seed, n):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, V, (3, SEQ), generator=g), torch.randint(0, V, (3, SEQ), generator=g))
            for _ in range(n)]


# ------------------------------------------------------------------ the oracle

class LossScale:
    """strata's fp16 loss scale (engine/step/train_step.c update_loss_scale), which is DeepSpeed's."""

    def __init__(self, fp16):
        self.static = fp16.get("loss_scale", 0) > 0
        self.scale = fp16["loss_scale"] if self.static else float(2 ** fp16.get("initial_scale_power", 16))
        self.window = fp16.get("loss_scale_window", 1000)
        self.hysteresis = fp16.get("hysteresis", 2)
        self.min = fp16.get("min_loss_scale", 1.0)
        self.left, self.good = self.hysteresis, 0

    def update(self, overflow):
        if self.static:
            return
        if overflow:
            self.good = 0
            self.left -= 1
            if self.left <= 0:
                self.scale = max(self.scale / 2, self.min)
                self.left = self.hysteresis
        else:
            self.good += 1
            if self.good >= self.window:
                self.scale *= 2
                self.good = 0
                self.left = self.hysteresis


class Recipe:
    """torch's mixed precision by hand: fp32 masters, a compute copy in dtype, AdamW on the masters."""

    def __init__(self, model, dtype, fp16=None, autocast_outside=False):
        self.master = copy.deepcopy(model)
        self.params = [p for p in self.master.parameters() if p.requires_grad]
        self.copy = copy.deepcopy(model).to(dtype)
        self.copies = [p for p in self.copy.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, **HP)
        self.scaler = LossScale(fp16) if fp16 is not None else None
        self.autocast_outside = autocast_outside
        self.store = None
        self.steps = 0  # AdamW steps taken
        self.out_grads = []

    def scale(self):
        return self.scaler.scale if self.scaler else 1.0

    def micro(self, x, y, loss_fn):
        for p in self.copies:
            p.grad = None
        out = forward(self.copy, x, self.autocast_outside)
        out.register_hook(lambda g: self.out_grads.append(g.detach().clone()))
        loss = loss_fn(out, y)
        scaled = loss.float() / GAS
        if self.scaler:
            scaled = scaled * self.scaler.scale
        scaled.backward()
        grads = [p.grad.float() for p in self.copies]
        self.store = grads if self.store is None else [a + b for a, b in zip(self.store, grads)]
        return loss.item()

    def step(self):
        """(skipped, loss scale after the step, AdamW's step count)."""
        overflow = self.scaler is not None and not all(torch.isfinite(g).all() for g in self.store)
        if not overflow:
            inv = 1.0 / self.scale()
            for p, g in zip(self.params, self.store):
                p.grad = g * inv if inv != 1.0 else g
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.steps += 1
            with torch.no_grad():
                for c, p in zip(self.copies, self.params):
                    c.copy_(p)  # round to nearest even
        if self.scaler:
            self.scaler.update(overflow)
        self.store = None
        return overflow, self.scale(), self.steps

    def masters(self):
        return {n: p.detach() for n, p in self.master.named_parameters() if p.requires_grad}


def forward(model, x, autocast_outside):
    if autocast_outside:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)
    return model(x)


def config(precision, fp16=None):
    doc = {"optimizer": {"type": "AdamW", "params": {"lr": HP["lr"], "betas": list(HP["betas"]), "eps": HP["eps"],
                                                      "weight_decay": HP["weight_decay"]}},
           "gradient_accumulation_steps": GAS}
    if precision == "bf16":
        doc["bf16"] = {"enabled": True}
    elif precision == "fp16":
        doc["fp16"] = dict(fp16 or {}, enabled=True)
    return doc


# ------------------------------------------------------------------ one run against the oracle

def run(what, make, precision, batches, loss_fn, fp16=None, autocast_outside=False, expect_skips=None):
    """Trains make() through strata and through the recipe on the same batches (GAS micro-batches a step) and
    checks every step. Returns the engine, which the caller closes."""
    dtype = HALF[precision]
    model = make()
    autocast_used = autocast_outside or any(getattr(m, "autocast", False) for m in model.modules())
    recipe = Recipe(model, dtype, fp16, autocast_outside)
    fp16_cfg = dict(fp16 or {})
    engine = strata.torch.initialize(model=model, config=config(precision, fp16_cfg), device="cpu")[0]
    computed = set()  # the dtypes of the floating-point outputs of every module
    handles = [m.register_forward_hook(lambda mod, args, out: computed.update(
        t.dtype for t in (out if isinstance(out, tuple) else (out,)) if t.is_floating_point()))
        for m in model.modules()]
    got_out_grads = []
    losses, want_losses, results, want_results = [], [], [], []
    first_bad = None
    worst, unequal, last = 0.0, 0, len(batches) // GAS - 1  # the masters' largest difference; unequal at the end
    for step in range(len(batches) // GAS):
        for micro in range(GAS):
            x, y = batches[step * GAS + micro]
            if dtype != torch.float32 and x.is_floating_point():
                x = x.to(dtype)  # casting inputs is the trainer's business (fp16.auto_cast is refused)
            out = forward(engine, x, autocast_outside)
            out.register_hook(lambda g: got_out_grads.append(g.detach().clone()))
            loss = loss_fn(out, y)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
            want_losses.append(recipe.micro(x, y, loss_fn))
        r = engine.last_step
        results.append((r["skipped"], r["loss_scale"], r["step"]))
        want_results.append(recipe.step())
        got, want = engine.fp32_state_dict(), recipe.masters()
        diff = first_difference(got, want)
        for n, w in want.items():
            worst = max(worst, (got[n] - w).abs().max().item())
            unequal += (got[n].view(torch.int32) != w.view(torch.int32)).sum().item() if step == last else 0
        if diff and first_bad is None:
            first_bad = "after step %d: %s" % (step, diff)
    for h in handles:
        h.remove()
    if not autocast_used:
        T.check(computed == {dtype}, "%s: every module computes in %s (parameters lent in it; buffers and frozen "
                "parameters cast to it)" % (what, precision), sorted(str(d) for d in computed), str(dtype))
    bad = [i for i, (a, b) in enumerate(zip(losses, want_losses)) if not same_float(a, b)]
    T.check(not bad, "%s: every loss %s to the recipe's" % (what, HOW), bad and (bad[0], losses[bad[0]]),
            bad and want_losses[bad[0]])
    T.check(first_bad is None, "%s: fp32 master weights after every step %s to AdamW's" % (what, HOW), first_bad)
    T.check(results == want_results, "%s: each step's (skipped, loss scale, Adam step) as the recipe's" % what,
            results, want_results)
    if expect_skips is not None:
        T.check([s for s, _, _ in want_results] == expect_skips, "%s: the recipe overflows where planned" % what,
                [s for s, _, _ in want_results], expect_skips)
    if not any(s for s, _, _ in want_results):
        # The recipe's output gradients are loss scale / GAS times the loss's: a wrong factor is far off.
        off = [i for i, (a, b) in enumerate(zip(got_out_grads, recipe.out_grads)) if not (
            torch.equal(a, b) if EXACT else (a.float() - b.float()).norm() <= 1e-2 * b.float().norm())]
        T.check(len(got_out_grads) == len(recipe.out_grads) and not off, "%s: engine.backward's gradient at the "
                "model's output (loss scale %g / GAS %d times the loss's) %s to the recipe's" % (
                    what, recipe.scale(), GAS, HOW), off[:3], "none differ")
    sd = model.state_dict()
    want_sd = recipe.copy.state_dict()
    wrong = [k for k in want_sd if sd[k].dtype != want_sd[k].dtype or (EXACT and not torch.equal(sd[k], want_sd[k]))]
    T.check(not wrong, "%s: state_dict() gives the compute copy (masters rounded to %s, buffers and frozen "
            "parameters in it)" % (what, precision), wrong[:3], "none differ")
    print("%s: losses %.5f .. %.5f, steps %s; masters: max |strata - torch| %.3g, %d of %d elements not "
          "bit-identical at the end" % (what, losses[0], losses[-1], results, worst, unequal,
                                        sum(w.numel() for w in recipe.masters().values())))
    return engine


def mixed_precision(seed):
    for precision in ("bf16", "fp16"):
        dtype = HALF[precision]
        full = half_kernels(dtype)
        fp16 = {"loss_scale": 0, "initial_scale_power": 8} if precision == "fp16" else None
        if full:
            torch.manual_seed(seed)
            run("%s MLP" % precision, MLP, precision, vector_batches(seed, 8), mse, fp16).close()
            torch.manual_seed(seed)
            run("%s stack" % precision, Stack, precision, token_batches(seed, 8), xent, fp16).close()
        else:
            print("%s: torch %s has no %s Linear / LayerNorm kernels on the CPU (nor has the recipe): the elementwise "
                  "model only" % (precision, torch.__version__, precision))
        torch.manual_seed(seed)
        run("%s elementwise MLP" % precision, ElementwiseMLP, precision, vector_batches(seed, 8), mse, fp16).close()


def fp16_scaling(seed):
    make = MLP if half_kernels(torch.float16) else ElementwiseMLP
    name = make.__name__
    # Steps 1 and 2 overflow (their second micro-batch's input is 1e4 times larger): hysteresis 2 keeps the scale at
    # the first and halves it at the second; two good steps (loss_scale_window 2) double it again.
    torch.manual_seed(seed)
    dynamic = {"loss_scale": 0, "initial_scale_power": 8, "loss_scale_window": 2, "hysteresis": 2}
    engine = run("fp16 %s dynamic scale with overflows" % name, make, "fp16", vector_batches(seed, 12, big={3, 5}),
                 mse, dynamic, expect_skips=[False, True, True, False, False, False])
    T.check(engine.global_steps == 6, "fp16: skipped steps count as global steps (DeepSpeed's)", engine.global_steps, 6)
    engine.close()
    torch.manual_seed(seed)
    run("fp16 %s static scale 1024 with an overflow" % name, make, "fp16", vector_batches(seed, 6, big={2}), mse,
        {"loss_scale": 1024}, expect_skips=[False, True, False]).close()
    # A loss computed in fp16 at the default scale 2^16: scaled in fp16, the gradient it gets back is 1 x 2^16 before
    # the division by GAS, inf in fp16, and every step would overflow; in fp32 (DeepSpeed's loss.float()) it is 2^15.
    # Small inputs and targets keep the scaled gradients of the weights within fp16 at that scale.
    torch.manual_seed(seed)
    small = [(x * 0.1, y * 0.1) for x, y in vector_batches(seed, 6)]
    run("fp16 %s loss computed in fp16, scale 2^16" % name, make, "fp16", small, mse_half, {"loss_scale": 0},
        expect_skips=[False, False, False]).close()

    # A plain loss.backward() would give gradients loss_scale times too large: refused, naming engine.backward.
    torch.manual_seed(seed)
    model = make()
    engine = strata.torch.initialize(model=model, config=config("fp16", {"initial_scale_power": 8}),
                                     device="cpu")[0]
    x, y = vector_batches(seed, 1)[0]
    T.check_raises(strata.StateError, "call engine.backward(loss)",
                   lambda: mse(engine(x.half()), y).backward(), "fp16: a plain loss.backward()")
    loss = mse(engine(x.half()), y)
    engine.backward(loss)
    engine.step()
    T.check(all(p.data.numel() == 0 for p in model.parameters()), "fp16: after the refusal engine.backward works and "
            "the parameters are empty again")
    engine.close()


def autocast(seed):
    """torch.autocast("cpu", bfloat16) with strata in fp32 and in bf16, against torch doing the same autocast."""
    for precision in ("fp32", "bf16"):
        for inside in (True, False):
            torch.manual_seed(seed)
            where = "inside the blocks' forward" if inside else "around engine(x)"
            run("autocast %s, strata %s" % (where, precision), lambda: Stack(autocast=inside), precision,
                token_batches(seed, 6), xent, autocast_outside=not inside).close()
    torch.manual_seed(seed)
    run("autocast inside checkpointed blocks (recomputed in backward), strata fp32",
        lambda: Stack(autocast=True, checkpoint=True), "fp32", token_batches(seed, 6), xent).close()


def model_dtype_refused():
    """A model built in bf16 (or fp16) under a config that computes in another dtype is refused, naming the section
    to add: strata would otherwise train it in fp32 without a word. An fp32 model takes a half config (its compute
    copy), and a bf16 model a bf16 config."""
    for dtype, section in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        T.check_raises(strata.ConfigError, '{"%s": {"enabled": true}}' % section, lambda: strata.torch.initialize(
            model=torch.nn.Linear(4, 4).to(dtype), config={}, device="cpu"), "a %s model under an fp32 config" % dtype)
    T.check_raises(strata.ConfigError, "bfloat16 but the config computes in float16", lambda: strata.torch.initialize(
        model=torch.nn.Linear(4, 4).bfloat16(), config={"fp16": {"enabled": True}}, device="cpu"),
        "a bf16 model under an fp16 config")
    for model, config in ((torch.nn.Linear(4, 4), {"bf16": {"enabled": True}}),
                          (torch.nn.Linear(4, 4).bfloat16(), {"bf16": {"enabled": True}})):
        engine = strata.torch.initialize(model=model, config=config, device="cpu")[0]
        T.check(engine.dtype == torch.bfloat16, "a %s model under a bf16 config computes in bf16" %
                str(next(model.parameters()).dtype), engine.dtype, torch.bfloat16)
        engine.close()


def main():
    seed = T.seed()
    print("torch %s; against the recipe: %s" % (torch.__version__, HOW))
    mixed_precision(seed)
    fp16_scaling(seed)
    autocast(seed)
    model_dtype_refused()
    T.done()


if __name__ == "__main__":
    main()

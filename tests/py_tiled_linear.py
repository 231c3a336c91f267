"""strata.torch.TiledLinear: a linear layer as a grid of tiles, each a strata module of its own, with nn.Linear's bits.

- Alone, against nn.Linear on fresh random inputs (several shapes, uneven splits, with and without bias, 2-D and 3-D
  inputs): the same initial values for the same seed, and the same output, input gradient, weight gradient and bias
  gradient, bit for bit where exact_products' probe passes (asserted on MKL in strict reproducibility mode, which
  the suite sets), else within rounding, with the warning that says so (naming MKL_CBWR=AUTO,STRICT on MKL: checked
  in a child without it).
- Under strata.torch: a model with a TiledLinear inside a block (carved out of the block's unit) and a TiledLinear
  head trains 3 steps with the same losses and fp32 weights as the same model with nn.Linear (bit for bit where the
  probe passes); each tile is a strata module; at a device budget below the untiled head's needs, the untiled
  model is refused and the tiled one trains.
- Built under strata.torch.zero_init: the values of a plain construction.
- Bad input: splits out of range, DeepSpeed arguments strata's tiles cannot honour, a copy from another shape, an
  input of the wrong width: each refused naming it.
"""
import os
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
import torch.nn as nn  # noqa: E402
import strata  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch import TiledLinear  # noqa: E402
from strata.torch._tiled_linear import exact_products  # noqa: E402

SEED = T.seed()
EXACT = exact_products(torch.device("cpu"))
MKL = "BLAS_INFO=mkl" in torch.__config__.show()
STRICT = MKL and "STRICT" in os.environ.get("MKL_CBWR", "").upper()  # the suite sets MKL_CBWR=AUTO,STRICT
print("torch %s: exact_products %s (%s)" % (torch.__version__, EXACT,
                                            "MKL, MKL_CBWR=%s" % os.environ.get("MKL_CBWR") if MKL else "not MKL"))
T.check(EXACT or not STRICT, "MKL in strict reproducibility mode passes the probe", EXACT, True)
if MKL:
    # Without that mode MKL may fail the probe (torch 2.15's does): then a tiled layer warns, naming the setting.
    CHILD = ("import warnings, torch; from strata.torch import TiledLinear; "
             "from strata.torch._tiled_linear import exact_products\n"
             "with warnings.catch_warnings(record=True) as w:\n"
             "    warnings.simplefilter('always'); TiledLinear(8, 8, in_splits=2)\n"
             "print(exact_products(torch.device('cpu')), '|'.join(str(m.message) for m in w))")
    env = dict(os.environ)
    env.pop("MKL_CBWR", None)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    verdict, _, message = out.stdout.strip().partition(" ")
    T.check(out.returncode == 0 and verdict in ("True", "False"), "the child without MKL_CBWR ran", out.stderr[-400:])
    print("without MKL_CBWR: exact_products %s" % verdict)
    T.check((verdict == "False") == ("MKL_CBWR=AUTO,STRICT" in message),
            "without MKL_CBWR a layer names MKL_CBWR=AUTO,STRICT exactly when the probe fails", message, verdict)


def full_weight(t):
    return torch.cat([torch.cat([m.weight for m in row], 1) for row in t.linears], 0)


def full_grad(t):
    return torch.cat([torch.cat([m.weight.grad for m in row], 1) for row in t.linears], 0)


def same(got, want, what, exact=EXACT):
    """Equal bits where the probe passed, else within fp32 rounding of products of this size."""
    if exact:
        T.check(torch.equal(got, want), what + ": the same bits", (got - want).abs().max().item(), 0.0)
    else:
        scale = want.abs().max().item() or 1.0
        T.check(torch.allclose(got, want, rtol=1e-5, atol=1e-5 * scale), what + ": within rounding",
                (got - want).abs().max().item(), "<= %g" % (1e-5 * scale))


def check_alone(i, o, si, so, bias, lead, device="cpu"):
    what = "%s: %dx%d in %dx%d tiles, bias %s, input %s" % (device, o, i, so, si, bias, list(lead) + [i])
    exact = exact_products(torch.device(device))
    torch.manual_seed(SEED)
    plain = nn.Linear(i, o, bias=bias).to(device)
    torch.manual_seed(SEED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiled = TiledLinear(i, o, bias=bias, in_splits=si, out_splits=so).to(device)
    warned = any("within rounding" in str(w.message) for w in caught)
    T.check(warned == (not EXACT and (si > 1 or so > 1)), what + ": warns exactly when the bits differ", warned,
            not EXACT)
    T.check(torch.equal(full_weight(tiled), plain.weight) and (not bias or torch.equal(tiled.bias, plain.bias)),
            what + ": nn.Linear's initial values for the same seed")
    x = torch.randn(*lead, i).to(device)
    dy = torch.randn(*lead, o).to(device)
    xp, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yp, yt = plain(xp), tiled(xt)
    yp.backward(dy)
    yt.backward(dy)
    same(yt, yp, what + ", output", exact)
    same(xt.grad, xp.grad, what + ", input gradient", exact)
    same(full_grad(tiled), plain.weight.grad, what + ", weight gradient", exact)
    if bias:
        same(tiled.bias.grad, plain.bias.grad, what + ", bias gradient", exact)


# Built on the CPU (the CPU generator's values) and moved: on a GPU machine (tools/gpu/items.sh) cuBLAS's products too.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
for device in DEVICES:
    if device != "cpu":
        print("%s: exact_products %s" % (device, exact_products(torch.device(device))))
    for shape in ((64, 96, 3, 4, True, (5, 7)), (300, 1000, 4, 7, True, (2, 33)), (257, 131, 1, 5, False, (40,)),
                  (512, 2048, 8, 8, True, (4, 128)), (96, 64, 6, 1, True, (3, 10))):
        check_alone(*shape, device=device)

# ---------------------------------------------------------------- under strata.torch
IN_VOCAB, VOCAB, WIDTH, STEPS = 256, 2048, 64, 3  # the head, VOCAB x WIDTH, is the largest layer


class Net(nn.Module):
    def __init__(self, tiled):
        super().__init__()
        self.embed = nn.Embedding(IN_VOCAB, WIDTH)
        linear = (lambda i, o, **kw: TiledLinear(i, o, in_splits=2, out_splits=4, **kw)) if tiled else nn.Linear
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(WIDTH), linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                                  nn.Linear(4 * WIDTH, WIDTH)) for _ in range(2))
        self.head = (TiledLinear(WIDTH, VOCAB, bias=False, in_splits=2, out_splits=8) if tiled
                     else nn.Linear(WIDTH, VOCAB, bias=False))

    def forward(self, ids, targets):
        x = self.embed(ids)
        for b in self.blocks:
            x = x + b(x)
        return nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def build(tiled):
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Net(tiled)


def untiled_names(weights, model):
    """The tiled model's fp32 weights under the untiled model's names: each TiledLinear's tiles put together."""
    out = dict(weights)
    for name, mod in model.named_modules():
        if isinstance(mod, TiledLinear):
            rows = [torch.cat([out.pop("%s.linears.%d.%d.weight" % (name, o, i)) for i in range(mod.in_splits)], 1)
                    for o in range(mod.out_splits)]
            out[name + ".weight"] = torch.cat(rows, 0)
    return out


def config(budget):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
            "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                  "offload_optimizer": {"device": "cpu"}, "stage3_param_persistence_threshold": 0},
            "strata": {"device_budget_bytes": budget, "prefetch_bytes": 64 << 10}}


def train(tiled, budget):
    model = build(tiled)
    engine, _, _, _ = strata.torch.initialize(model=model, config=config(budget))
    modules = engine.stats().get("modules")
    g = torch.Generator().manual_seed(SEED + 1)
    losses = []
    for _ in range(STEPS):
        loss = engine(torch.randint(0, IN_VOCAB, (2, 16), generator=g), torch.randint(0, VOCAB, (2, 16), generator=g))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    weights = {k: v.clone() for k, v in engine.fp32_state_dict().items()}
    units = len(engine.units)
    engine.close()
    return losses, untiled_names(weights, model) if tiled else weights, units, modules


tiled_model = build(True)
initial = untiled_names({k: v for k, v in tiled_model.state_dict().items()}, tiled_model)
T.check(all(torch.equal(initial[k], v) for k, v in build(False).state_dict().items()),
        "the tiled model's initial values are the untiled one's for the same seed (each TiledLinear draws as the "
        "nn.Linear it stands for)")
head_bytes = VOCAB * WIDTH * 4
roomy, tight = 16 << 20, head_bytes * 3 // 2
want, want_w, want_units, _ = train(False, roomy)
for budget in (roomy, tight):
    got, got_w, got_units, _ = train(True, budget)
    what = "strata.torch, device budget %d KiB" % (budget >> 10)
    if EXACT:
        T.check(got == want, what + ": the untiled model's losses", got, want)
    else:
        T.check(all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(got, want)), what + ": losses within rounding",
                got, want)
    T.check(sorted(got_w) == sorted(want_w), what + ": the same tensors", sorted(set(got_w) ^ set(want_w)), [])
    for k in sorted(want_w):
        if k in got_w and not (torch.equal(got_w[k], want_w[k]) if EXACT else
                               torch.allclose(got_w[k], want_w[k], rtol=1e-3, atol=1e-4)):
            T.check(False, what + ": fp32 weight %s" % k, (got_w[k] - want_w[k]).abs().max().item(), 0.0)
    tiles = 2 * 2 * 4 + 2 * 8
    # untiled units: embed, 2 blocks, head; tiled: embed, 2 blocks (their biases and the rest), the head's tiles
    T.check(got_units == 3 + tiles and want_units == 4, what + ": every tile its own strata module",
            (got_units, want_units), (3 + tiles, 4))
T.check_raises(strata.errors.BudgetError, "device budget", lambda: train(False, tight),
               "the untiled head at a budget the tiled one trains in")

# ---------------------------------------------------------------- zero_init
torch.manual_seed(SEED)
plain = TiledLinear(1024, 1536, in_splits=2, out_splits=3)
torch.manual_seed(SEED)
with strata.torch.zero_init(min_bytes=64 << 10):
    staged = TiledLinear(1024, 1536, in_splits=2, out_splits=3)
T.check(all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), staged.state_dict().values())),
        "built under zero_init: the plain construction's values")
T.check(list(plain.state_dict()) == ["bias", "linears.0.0.weight", "linears.0.1.weight", "linears.1.0.weight",
                                     "linears.1.1.weight", "linears.2.0.weight", "linears.2.1.weight"],
        "DeepSpeed's tile names", list(plain.state_dict()))

# ---------------------------------------------------------------- bad input
E = strata.errors
T.check_raises(E.InvalidArgument, "in_splits must be an int from 1 to 8", lambda: TiledLinear(8, 4, in_splits=0),
               "in_splits 0")
T.check_raises(E.InvalidArgument, "out_splits must be an int from 1 to 4", lambda: TiledLinear(8, 4, out_splits=5),
               "more out_splits than features")
T.check_raises(E.InvalidArgument, "in_features must be a positive int", lambda: TiledLinear(0, 4), "no features")
T.check_raises(E.Unsupported, "input_is_already_split", lambda: TiledLinear(8, 4, input_is_already_split=True),
               "DeepSpeed's split input")
T.check_raises(E.Unsupported, "combine_out_splits", lambda: TiledLinear(8, 4, combine_out_splits=False),
               "DeepSpeed's split output")
T.check_raises(E.Unsupported, "linear_cls=Bilinear", lambda: TiledLinear(8, 4, linear_cls=nn.Bilinear),
               "another linear class")
T.check_raises(E.InvalidArgument, "shape [4, 8], got [4, 9]", lambda: TiledLinear(8, 4).copy_params_from(
    nn.Linear(9, 4)), "a copy from another shape")
T.check_raises(E.InvalidArgument, "has a bias and the other has none", lambda: TiledLinear(8, 4).copy_params_from(
    nn.Linear(8, 4, bias=False)), "a copy without the bias")
T.check_raises(E.InvalidArgument, "last dimension is 7, the layer takes 8", lambda: TiledLinear(8, 4)(
    torch.randn(3, 7)), "an input of the wrong width")
T.done()

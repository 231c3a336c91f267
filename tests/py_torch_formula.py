"""strata.torch follows the Adam update of the torch that runs (python/strata/torch/_torch_formula.py).

Proves, on whichever torch runs this test (the floor, 1.13, and today's, 2.x, each run it):
  1. an engine made by strata.torch.initialize and an OffloadAdam group both take the running torch's first-moment
     formula (strata.adam_first_moment: "lerp" from torch 2.0 on, else "mul_add"), and a config naming one keeps it;
  2. with it, one AdamW step on a large tensor with gradients near zero (where the two formulas part most) gives
     torch.optim.AdamW's weights and moments bit for bit, and the other formula does not (so the choice matters and
     is observed, not assumed);
  3. the square-root check: torch's CPU sqrt is compared with the correctly rounded root here, independently of
     strata's probe, and strata warns (once, naming MKL_ENABLE_INSTRUCTIONS=AVX2) exactly when they differ: run in a
     child with MKL free to take its AVX-512 path (where PyPI's torch rounds sqrt low near ties) and with AVX2.
"""
import math
import os
import struct
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402

torch = T.require_torch()
import strata.torch  # noqa: E402
from strata.torch import _torch_formula  # noqa: E402

WANT = "lerp" if int(torch.__version__.split(".")[0]) >= 2 else "mul_add"
HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def engine_formula(config_strata):
    model = torch.nn.Linear(64, 64)
    engine = strata.torch.initialize(model=model, config={"train_micro_batch_size_per_gpu": 1, "optimizer": {
        "type": "AdamW", "params": {"lr": 1e-3}}, "strata": dict(config_strata)}, device="cpu")[0]
    try:
        return engine.config.document["strata"].get("adam_first_moment")
    finally:
        engine.close()


def one_step(formula, n=300007):
    """(strata's weights, torch.optim.AdamW's) after 3 steps from the same weights and gradients, strata through
    OffloadAdam with the given formula."""
    g = torch.Generator().manual_seed(T.seed())
    init = torch.randn(n, generator=g)
    grads = [torch.randn(n, generator=g) * torch.where(torch.rand(n, generator=g) < 0.3, 1e-7, 1e-2)
             for _ in range(3)]
    ours, theirs = torch.nn.Parameter(init.clone()), torch.nn.Parameter(init.clone())
    opt = strata.torch.OffloadAdam([ours], config={"strata": {"adam_first_moment": formula}}, **HP)
    ref = torch.optim.AdamW([theirs], **HP)
    for grad in grads:
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
    opt.close()
    return ours.detach(), theirs.detach()


def ieee_sqrt_differs(x):
    """Elements where torch's sqrt is not the float nearest the double root (the correctly rounded float root)."""
    got = torch.sqrt(x).tolist()
    return sum(r != struct.unpack("f", struct.pack("f", math.sqrt(v)))[0] for v, r in zip(x.tolist(), got))


def sqrt_child():
    """In a child: (how many of 8192 random floats torch's sqrt rounds otherwise, warnings strata gave at two
    engines' creation)."""
    T.child_process()
    x = torch.rand(8192, generator=torch.Generator().manual_seed(11))
    differs = ieee_sqrt_differs(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            engine_formula({})
    said = [str(w.message) for w in caught if "sqrt" in str(w.message)]
    print("RESULT", differs, len(said), said[0] if said else "", flush=True)


def check_sqrt_warning():
    for mkl in ("", "AVX2"):
        env = dict(os.environ)
        env.pop("MKL_ENABLE_INSTRUCTIONS", None)
        if mkl:
            env["MKL_ENABLE_INSTRUCTIONS"] = mkl
        out = subprocess.run([sys.executable, __file__, "--sqrt-child"], env=env, capture_output=True, text=True,
                             timeout=240)
        line = [s for s in out.stdout.splitlines() if s.startswith("RESULT")]
        T.check(out.returncode == 0 and line, "the sqrt child ran (MKL_ENABLE_INSTRUCTIONS=%r)" % mkl,
                out.stderr[-800:], "RESULT ...")
        if not line:
            continue
        _, differs, said, message = line[0].split(" ", 3)
        differs, said = int(differs), int(said)
        where = "MKL_ENABLE_INSTRUCTIONS=%r, torch's sqrt differs from IEEE in %d of 8192" % (mkl, differs)
        T.check(said == (1 if differs else 0), "strata warns once exactly when torch's CPU sqrt is not IEEE (%s)" %
                where, said, 1 if differs else 0)
        if said:
            T.check("MKL_ENABLE_INSTRUCTIONS=AVX2" in message, "the warning names the setting that fixes it",
                    message, "MKL_ENABLE_INSTRUCTIONS=AVX2")
        if mkl == "AVX2":
            T.check(differs == 0, "with MKL's AVX2 path torch's sqrt is IEEE (the setting the warning names works)",
                    differs, 0)


def main():
    T.check(_torch_formula.torch_adam_formula() == WANT, "the running torch's formula", (
        torch.__version__, _torch_formula.torch_adam_formula()), WANT)
    T.check(engine_formula({}) == WANT, "initialize takes the running torch's Adam formula", engine_formula({}), WANT)
    other = "mul_add" if WANT == "lerp" else "lerp"
    T.check(engine_formula({"adam_first_moment": other}) == other, "a config naming the formula keeps it",
            engine_formula({"adam_first_moment": other}), other)

    sqrt_ok = ieee_sqrt_differs(torch.rand(8192, generator=torch.Generator().manual_seed(3))) == 0
    ours, theirs = one_step(WANT)
    differ = int((ours != theirs).sum())
    if sqrt_ok:
        T.check(differ == 0, "3 AdamW steps with the running torch's formula == torch.optim.AdamW bit for bit",
                "%d of %d weights differ, max |diff| %g" % (differ, ours.numel(), (ours - theirs).abs().max()), 0)
    else:
        print("torch's CPU sqrt is not IEEE in this process (see check_sqrt_warning): the bit-identity of weights is "
              "checked where it is (the tests run with MKL_ENABLE_INSTRUCTIONS=AVX2)")
    wrong, theirs2 = one_step(other)
    apart = int((wrong != theirs2).sum())
    T.check(apart > ours.numel() // 1000, "the other torch's formula does not give this torch's weights",
            "%d of %d differ" % (apart, ours.numel()), "> 0.1%")
    check_sqrt_warning()
    T.done()


if __name__ == "__main__":
    if "--sqrt-child" in sys.argv:
        sqrt_child()
    else:
        main()

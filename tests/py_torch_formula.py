"""strata.torch follows the Adam update of the torch that runs (python/strata/torch/_torch_formula.py).

Proves, on whichever torch runs this test (the floor, 1.13, and today's, 2.x, each run it):
  1. an engine made by strata.torch.initialize and an OffloadAdam group both take the running torch's first-moment
     formula (strata.adam_first_moment: "lerp" from torch 2.0 on, else "mul_add"), and a config naming one keeps it;
  2. with it, three AdamW steps on a large tensor with gradients near zero (where the two formulas part most) give
     torch's update bit for bit, and the other formula does not (so the choice matters and is observed, not
     assumed). torch's update is adam_oracle.adamw_reference, torch.optim.AdamW's single-tensor step operation for
     operation with a correctly rounded sqrt (strata's): with torch's own sqrt it is torch.optim.AdamW bit for bit,
     which is checked, so strata == torch's update holds bit for bit on every machine, whatever torch's sqrt does;
     and strata == torch.optim.AdamW bit for bit, its sqrt correctly rounded where torch's is not (adam_oracle.oracle);
  3. the square-root check: torch's CPU sqrt is compared with the correctly rounded root here, independently of
     strata's probe (and the two must agree), and strata warns (once, naming MKL_ENABLE_INSTRUCTIONS=AVX2) exactly
     when they differ: run in a child with MKL free to take its AVX-512 path and with MKL_ENABLE_INSTRUCTIONS=AVX2.
     Whether that setting makes torch's sqrt IEEE is the machine's, so the test reports it (it does on the Intel
     machines the suite has run on; on an AMD EPYC with PyPI's torch 2.15 neither it nor any other setting tried does).
"""
import math
import os
import struct
import subprocess
import sys
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
import adam_oracle  # noqa: E402

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


def steps_data(seed, n=300007):
    """Initial weights and 3 steps' gradients, a third of them near zero."""
    g = torch.Generator().manual_seed(seed)
    init = torch.randn(n, generator=g)
    grads = [torch.randn(n, generator=g) * torch.where(torch.rand(n, generator=g) < 0.3, 1e-7, 1e-2)
             for _ in range(3)]
    return init, grads


def strata_steps(formula, init, grads):
    """strata's weights after the steps, through OffloadAdam with the given first-moment formula."""
    ours = torch.nn.Parameter(init.clone())
    opt = strata.torch.OffloadAdam([ours], config={"strata": {"adam_first_moment": formula}}, **HP)
    for grad in grads:
        ours.grad = grad.clone()
        opt.step()
    opt.close()
    return ours.detach()


def torch_steps(init, grads, wrap=lambda opt: opt):
    """torch.optim.AdamW's weights after the steps, the optimizer passed through wrap."""
    theirs = torch.nn.Parameter(init.clone())
    ref = wrap(torch.optim.AdamW([theirs], **HP))
    for grad in grads:
        theirs.grad = grad.clone()
        ref.step()
    return theirs.detach()


def reference_steps(init, grads, sqrt):
    """adam_oracle.adamw_reference's weights after the steps, with the given square root."""
    p = init.clone()
    adam_oracle.adamw_reference([p], [[g] for g in grads], HP["lr"], HP["betas"], HP["eps"], HP["weight_decay"],
                                sqrt=sqrt)
    return p


def apart(a, b):
    return "%d of %d differ, max |diff| %g" % (int((a != b).sum()), a.numel(), float((a - b).abs().max()))


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
            T.check("MKL_ENABLE_INSTRUCTIONS=AVX2" in message, "the warning names MKL_ENABLE_INSTRUCTIONS=AVX2",
                    message, "MKL_ENABLE_INSTRUCTIONS=AVX2")
        if mkl == "AVX2":
            print("this machine: with MKL_ENABLE_INSTRUCTIONS=AVX2 torch %s's CPU sqrt %s (%d of 8192 differ), so the "
                  "setting the warning names %s here" % (torch.__version__, "is IEEE's" if differs == 0 else
                                                         "is not IEEE's", differs,
                                                         "works" if differs == 0 else "does not help"))


def main():
    T.check(_torch_formula.torch_adam_formula() == WANT, "the running torch's formula", (
        torch.__version__, _torch_formula.torch_adam_formula()), WANT)
    T.check(engine_formula({}) == WANT, "initialize takes the running torch's Adam formula", engine_formula({}), WANT)
    other = "mul_add" if WANT == "lerp" else "lerp"
    T.check(engine_formula({"adam_first_moment": other}) == other, "a config naming the formula keeps it",
            engine_formula({"adam_first_moment": other}), other)

    differs = ieee_sqrt_differs(torch.rand(8192, generator=torch.Generator().manual_seed(3)))
    T.check((differs == 0) == adam_oracle.EXACT, "this test's probe of torch's CPU sqrt and strata's agree (IEEE or "
            "not)", "%d of 8192 differ here, strata's probe %d" % (differs, adam_oracle.SQRT_DIFFERS),
            "both 0 or both > 0")
    adam_oracle.check_ieee_sqrt()
    init, grads = steps_data(T.seed())
    as_is = torch_steps(init, grads)
    as_torch = reference_steps(init, grads, torch.sqrt)
    T.check(torch.equal(as_torch, as_is), "adam_oracle.adamw_reference with torch's own sqrt == torch.optim.AdamW "
            "as it is, bit for bit (3 steps)", apart(as_torch, as_is), "0 differ")
    want = reference_steps(init, grads, adam_oracle.ieee_sqrt)
    ours = strata_steps(WANT, init, grads)
    T.check(torch.equal(ours, want), "3 AdamW steps with the running torch's formula == torch's update with an IEEE "
            "sqrt, bit for bit", apart(ours, want), "0 differ")
    theirs = torch_steps(init, grads, adam_oracle.oracle)
    T.check(torch.equal(ours, theirs), "3 AdamW steps with the running torch's formula == torch.optim.AdamW, %s" %
            adam_oracle.HOW, apart(ours, theirs), "0 differ")
    print("torch.optim.AdamW as it is: %s from strata's weights" % apart(ours, as_is))
    wrong = strata_steps(other, init, grads)
    T.check(int((wrong != want).sum()) > ours.numel() // 1000, "the other torch's formula does not give this torch's "
            "update", apart(wrong, want), "> 0.1% differ")
    check_sqrt_warning()
    T.done()


if __name__ == "__main__":
    if "--sqrt-child" in sys.argv:
        sqrt_child()
    else:
        main()

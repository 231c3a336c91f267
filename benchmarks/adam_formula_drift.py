#!/usr/bin/env python3
"""How far strata.torch's weights drift from torch.optim.AdamW with each first-moment formula, on the torch that runs.

Tiny random Hugging Face models (tests/helpers/hf_models.py: GPT-2, Llama, Mistral, Mixtral, BERT, T5) train STEPS
steps of accumulation 2 through strata.torch.initialize (ZeRO-3, parameters and optimizer state in host memory) with
strata.adam_first_moment forced to "mul_add" (what strata did before it followed torch 2) and to "lerp", and through
torch.optim.AdamW on the same batches. The table gives each model's largest |strata - torch| over its weights after
step 1 and after the last step, and how many tensors differ at all. On torch 2 "lerp" should be 0 everywhere (with
MKL_ENABLE_INSTRUCTIONS=AVX2, where PyPI torch's sqrt is IEEE; without it MKL's AVX-512 sqrt leaves last-bit
differences, which this shows too); on torch 1.x "mul_add" should be.

    MKL_ENABLE_INSTRUCTIONS=AVX2 build/venv-current/bin/python benchmarks/adam_formula_drift.py [--steps 6] [--json]
"""
import argparse
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "helpers"))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_models as H  # noqa: E402
import strata.torch  # noqa: E402
from strata.torch._torch_formula import torch_sqrt_differs  # noqa: E402

GAS = 2


def train_torch(name, seed, steps, record):
    model = H.build(transformers, name, seed)
    opt = torch.optim.AdamW(model.parameters(), **H.HP)
    for step in range(steps):
        for micro in range(GAS):
            torch.manual_seed(seed * 7 + step * GAS + micro)  # the same dropout draws as strata's run
            (model(**H.batch(transformers, name, seed, step, micro)).loss / GAS).backward()
        opt.step()
        opt.zero_grad()
        if step + 1 in record:
            record[step + 1] = {n: p.detach().clone() for n, p in model.named_parameters()}


def train_strata(name, seed, steps, formula, record):
    model = H.build(transformers, name, seed)
    config = {"train_micro_batch_size_per_gpu": H.BATCH, "gradient_accumulation_steps": GAS,
              "optimizer": H.optimizer_section(), "zero_optimization": {"stage": 3},
              "strata": {"adam_first_moment": formula}}
    engine = strata.torch.initialize(model=model, config=config, device="cpu")[0]
    for step in range(steps):
        for micro in range(GAS):
            torch.manual_seed(seed * 7 + step * GAS + micro)
            engine.backward(engine(**H.batch(transformers, name, seed, step, micro)).loss)
            engine.step()
        if step + 1 in record:
            record[step + 1] = engine.fp32_state_dict()
    engine.close()


def drift(got, want):
    worst = max((got[n] - w).abs().max().item() for n, w in want.items())
    differ = sum(not torch.equal(got[n], w) for n, w in want.items())
    return worst, differ, len(want)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--models", default=",".join(H.NAMES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    H.T.child_process()  # a benchmark, not a test: strata_test's exit rule (hf_models imports it) does not apply
    transformers.logging.set_verbosity_error()
    sqrt_bad = torch_sqrt_differs()
    print("# machine: %s, %d CPUs, python %s" % (platform.processor() or platform.machine(), os.cpu_count(),
                                                 platform.python_version()))
    print("# torch %s, transformers %s; torch's CPU sqrt %s; MKL_ENABLE_INSTRUCTIONS=%s" % (
        torch.__version__, transformers.__version__, "IEEE" if not sqrt_bad else "not IEEE (%d of 8192)" % sqrt_bad,
        os.environ.get("MKL_ENABLE_INSTRUCTIONS", "(unset)")))
    print("# config: ZeRO-3 on the host, accumulation %d, %d steps, AdamW %s, seed %d" % (GAS, args.steps, H.HP,
                                                                                          args.seed))
    print("%-8s %-8s %12s %12s %10s" % ("model", "formula", "step1_max", "last_max", "differ"))
    rows = []
    for name in args.models.split(","):
        want = {1: None, args.steps: None}
        train_torch(name, args.seed, args.steps, want)
        for formula in ("mul_add", "lerp"):
            got = {1: None, args.steps: None}
            train_strata(name, args.seed, args.steps, formula, got)
            first, _, _ = drift(got[1], want[1])
            last, differ, total = drift(got[args.steps], want[args.steps])
            rows.append(dict(model=name, formula=formula, step1_max=first, last_max=last, tensors_differ=differ,
                             tensors=total))
            print("%-8s %-8s %12.3g %12.3g %6d/%-3d" % (name, formula, first, last, differ, total), flush=True)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                          "sqrt_ieee": not sqrt_bad, "rows": rows}))


if __name__ == "__main__":
    main()

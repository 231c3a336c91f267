#!/usr/bin/env python3
"""strata's CPU Adam against PyTorch's torch.optim.AdamW (foreach), in the same run.

1. Agreement: strata_adam_step (through ctypes on libstrata.so, as a drop-in user would call it) and
   torch.optim.AdamW / torch.optim.Adam run a few steps from the same state on the same bf16 gradients;
   master weights, moments and bf16 parameter copies are compared, strata running the first-moment formula of the
   torch that runs (mul_add for 1.x, lerp for 2.x): bit-identical wherever torch's CPU sqrt is IEEE (Debian's
   1.13; PyPI's torch with MKL_ENABLE_INSTRUCTIONS=AVX2), else within the ulps of MKL's AVX-512 sqrt (see main()).
2. Speed: for each size and thread count, `strata bench adam --json` (bf16 gradients -> bf16 parameters)
   and, right after it in this process's run, PyTorch doing the same whole update of a sub-group:
   bf16 gradient -> fp32, unscale, clip_grad_norm_, AdamW foreach step, fp32 -> bf16 parameter copy.
   strata's whole update is its gradient pre-pass (norm and inf/NaN check) plus its one-pass step.

Needs PyTorch (Debian's python3-torch lands in /usr/bin/python3, which may not be the python3 on PATH:
this script re-runs itself with an interpreter that has torch). Without torch it says so and exits 0.
"""
import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time

from torch_python import find_torch_or_skip


def parse_count(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def default_strata_bin():
    here = os.path.dirname(os.path.abspath(__file__))
    for path in [os.environ.get("STRATA_BIN", ""), os.path.join(here, "..", "build", "strata"),
                 shutil.which("strata") or ""]:
        if path and os.path.exists(path):
            return os.path.abspath(path)
    return None


# ctypes mirrors of include/strata.h (STRATA-ADAM section).
FP32, BF16, FP16, NONE = 0, 1, 2, 3
ADAMW, ADAM = 0, 1
MUL_ADD, LERP = 0, 1


class Hparams(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("lr", ctypes.c_double), ("beta1", ctypes.c_double),
                ("beta2", ctypes.c_double), ("eps", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("bias_correction", ctypes.c_bool), ("formula", ctypes.c_int)]


class Tensors(ctypes.Structure):
    _fields_ = [("master", ctypes.c_void_p), ("exp_avg", ctypes.c_void_p), ("exp_avg_sq", ctypes.c_void_p),
                ("grad", ctypes.c_void_p), ("grad_dtype", ctypes.c_int), ("param", ctypes.c_void_p),
                ("param_dtype", ctypes.c_int), ("numel", ctypes.c_size_t)]


class StepArgs(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("grad_scale", ctypes.c_double), ("threads", ctypes.c_int),
                ("skip_nonfinite", ctypes.c_bool), ("on_tile", ctypes.c_void_p), ("on_tile_user", ctypes.c_void_p),
                ("tile_numel", ctypes.c_size_t)]


class StepResult(ctypes.Structure):
    _fields_ = [("skipped", ctypes.c_bool), ("grad_sumsq", ctypes.c_double)]


def ulp_distance(a, b):
    """Elementwise distance in fp32 ulps (ordered integer view)."""
    import torch
    ia, ib = a.view(torch.int32).to(torch.int64), b.view(torch.int32).to(torch.int64)
    ia = torch.where(ia < 0, -(ia & 0x7fffffff), ia)
    ib = torch.where(ib < 0, -(ib & 0x7fffffff), ib)
    return (ia - ib).abs()


def agreement(lib, kind, numel, steps, threads):
    import torch
    torch.manual_seed(1234 + kind)
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    grad_scale = 0.8 / 1024.0
    master0 = torch.randn(numel) * 0.05
    # PyTorch side.
    p = master0.clone().requires_grad_(False)
    opt_cls = torch.optim.AdamW if kind == ADAMW else torch.optim.Adam
    opt = opt_cls([p], foreach=True, **hp)
    # strata side.
    master = master0.clone()
    m, v = torch.zeros(numel), torch.zeros(numel)
    param = torch.empty(numel, dtype=torch.bfloat16)
    formula = LERP if int(torch.__version__.split(".")[0]) >= 2 else MUL_ADD  # the running torch's exp_avg update
    h = Hparams(kind, hp["lr"], hp["betas"][0], hp["betas"][1], hp["eps"], hp["weight_decay"], True, formula)
    for step in range(1, steps + 1):
        grad = (torch.randn(numel) * 1e-3 * 1024).to(torch.bfloat16)
        p.grad = grad.float().mul_(grad_scale)
        opt.step()
        t = Tensors(master.data_ptr(), m.data_ptr(), v.data_ptr(), grad.data_ptr(), BF16, param.data_ptr(), BF16,
                    numel)
        a = StepArgs(step, grad_scale, threads, False, None, None, 0)
        st = lib.strata_adam_step(ctypes.byref(h), ctypes.byref(t), ctypes.byref(a), None)
        if st != 0:
            raise SystemExit("strata_adam_step failed: %d %s" % (st, lib.strata_last_error(None).decode()))
    ulps = ulp_distance(master, p.detach())
    state = opt.state[p]
    m_ulps = ulp_distance(m, state["exp_avg"])
    v_ulps = ulp_distance(v, state["exp_avg_sq"])
    param_diff = (param != p.detach().to(torch.bfloat16)).sum().item()
    return dict(kind="adamw" if kind == ADAMW else "adam", numel=numel, steps=steps,
                master_max_ulps=int(ulps.max()), master_differ=int((ulps > 0).sum()),
                master_max_abs=float((master - p.detach()).abs().max()),
                exp_avg_max_ulps=int(m_ulps.max()), exp_avg_sq_max_ulps=int(v_ulps.max()),
                bf16_param_differ=int(param_diff))


def torch_whole_update(numel, threads, reps):
    """Best seconds of one whole PyTorch update of a sub-group (see the module comment), and of its
    optimizer.step() alone."""
    import torch
    torch.set_num_threads(threads)
    master = torch.rand(numel) * 0.1 - 0.05
    master.grad = torch.zeros(numel)
    grad_bf16 = (torch.rand(numel) * 2e-3 - 1e-3).to(torch.bfloat16)
    param_bf16 = torch.empty(numel, dtype=torch.bfloat16)
    opt = torch.optim.AdamW([master], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=True)
    best, best_step = float("inf"), float("inf")
    with torch.no_grad():
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            master.grad.copy_(grad_bf16)
            master.grad.mul_(1.0 / 1024.0)
            torch.nn.utils.clip_grad_norm_([master], max_norm=1.0)
            t1 = time.perf_counter()
            opt.step()
            t2 = time.perf_counter()
            param_bf16.copy_(master)
            t3 = time.perf_counter()
            if rep > 0:
                best, best_step = min(best, t3 - t0), min(best_step, t2 - t1)
    del opt, master, grad_bf16, param_bf16
    return best, best_step


def main():
    find_torch_or_skip()
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default=default_strata_bin(), help="the strata binary (default $STRATA_BIN)")
    ap.add_argument("--lib", help="libstrata.so (default: next to the binary)")
    ap.add_argument("--sizes", default="16M,64M,256M")
    ap.add_argument("--threads", default="1,%d" % max(1, os.cpu_count() or 1))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--check-numel", type=int, default=1000003)
    ap.add_argument("--check-steps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.strata:
        raise SystemExit("adam_vs_torch: no strata binary: pass --strata or set STRATA_BIN")
    lib_path = args.lib or os.path.join(os.path.dirname(args.strata), "libstrata.so")
    lib = ctypes.CDLL(lib_path)
    lib.strata_adam_step.restype = ctypes.c_int
    lib.strata_last_error.restype = ctypes.c_char_p
    lib.strata_adam_isa.restype = ctypes.c_char_p
    threads = [int(t) for t in args.threads.split(",")]
    sizes = [parse_count(s) for s in args.sizes.split(",")]

    print("# machine: %s, %d CPUs; torch %s (%s); strata %s, kernel %s" % (
        open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip(),
        os.cpu_count(), torch.__version__, sys.executable, args.strata, lib.strata_adam_isa().decode()))
    report = {"torch": torch.__version__, "agreement": [], "speed": []}

    # 1. Agreement. strata fuses a multiply-add exactly where PyTorch's CPU kernels do and takes the running torch's
    # exp_avg formula, so the results are bit-identical wherever torch's sqrt is IEEE. PyPI's torch takes sqrt from
    # MKL, whose AVX-512 path rounds low near ties: there the weights drift by a few ulps (and with Adam's L2 decay the
    # moments too, through the weights), and bf16 copies differ only where such an ulp crosses a bf16 boundary.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from strata.torch._torch_formula import torch_sqrt_differs
    exact = torch_sqrt_differs() == 0
    print("# torch's CPU sqrt is %s" % ("IEEE: bit-identity required" if exact else
                                        "not IEEE here (MKL's AVX-512 path): weights within 1e-7 tolerated"))
    ok = True
    for kind in (ADAMW, ADAM):
        r = agreement(lib, kind, args.check_numel, args.check_steps, threads[-1])
        # A sqrt one unit low moves a weight by about lr * 2^-24 relative per step: far below 1e-7 here, where a
        # wrong formula or a missed step moves every weight by about lr = 1e-3.
        good = r["master_max_abs"] <= 1e-7 and r["bf16_param_differ"] <= max(8, args.check_numel // 2000)
        if exact:
            good = r["master_max_ulps"] == 0 and r["exp_avg_max_ulps"] == 0 and r["exp_avg_sq_max_ulps"] == 0
        identical = r["master_max_ulps"] == 0 and r["exp_avg_max_ulps"] == 0 and r["exp_avg_sq_max_ulps"] == 0 \
            and r["bf16_param_differ"] == 0
        ok &= good
        report["agreement"].append(dict(r, ok=good))
        print("agreement %-5s numel=%d steps=%d: master max %d ulp, max |diff| %.3g (%d elements differ), exp_avg "
              "max %d ulp, exp_avg_sq max %d ulp, bf16 params differ: %d -> %s" % (
                  r["kind"], r["numel"], r["steps"], r["master_max_ulps"], r["master_max_abs"], r["master_differ"],
                  r["exp_avg_max_ulps"], r["exp_avg_sq_max_ulps"], r["bf16_param_differ"],
                  ("ok, bit-identical" if identical else "ok") if good else "MISMATCH"))

    # 2. Speed, strata then PyTorch for each size.
    print("%6s %3s %10s %10s %10s %12s %10s %8s %8s" % ("Melem", "thr", "strata_ms", "+pre_ms", "torch_ms",
                                                        "torch_step_ms", "Mparam/s", "speedup", "#wrong"))
    for n in sizes:
        out = subprocess.run([args.strata, "bench", "adam", "--json", "--sizes", str(n), "--combos", "bf16:bf16",
                              "--threads", args.threads, "--reps", str(args.reps)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit("strata bench adam failed:\n" + out.stderr)
        rows = {r["threads"]: r for r in json.loads(out.stdout)["rows"]}
        for t in threads:
            r = rows[t]
            whole_ms = r["adam_ms"] + r["prepass_ms"]
            torch_s, torch_step_s = torch_whole_update(n, t, args.reps)
            speedup = torch_s * 1e3 / whole_ms
            report["speed"].append(dict(numel=n, threads=t, strata_adam_ms=r["adam_ms"], strata_whole_ms=whole_ms,
                                        torch_ms=torch_s * 1e3, torch_step_ms=torch_step_s * 1e3, speedup=speedup,
                                        ratio=r["ratio"],
                                        ratio_with_prepass=r["ratio_with_prepass"], wrong=r["wrong"]))
            ok &= r["wrong"] == 0
            print("%6d %3d %10.2f %10.2f %10.2f %12.2f %10.0f %8.2f %8d" % (
                n >> 20, t, r["adam_ms"], whole_ms, torch_s * 1e3, torch_step_s * 1e3, n / whole_ms * 1e-3, speedup,
                r["wrong"]))
            sys.stdout.flush()
    if args.json:
        print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

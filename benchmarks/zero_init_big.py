#!/usr/bin/env python3
"""A Llama larger than this machine's RAM, built under strata.torch.zero_init and trained from NVMe (issue 38's proof).

transformers' LlamaForCausalLM of --layers x --hidden (intermediate --intermediate, vocab --vocab; the defaults are
Llama-2-7B's shape: 6.74 billion parameters, 25.1 GiB in fp32) is built in --dtype under zero_init, its tensors
staged on disk under --dir, then strata.torch.initialize puts the parameters and the optimizer state on NVMe (the
same --dir) with the step in backward (no gradient store) and --moments Adam moments, and it trains --steps steps of
--batch x --seq random tokens (the first not timed). Printed: the machine and the resolved config, then one row per
phase (build, initialize, each step) with its seconds, the process's peak RSS so far (VmHWM), the staged bytes, the
NVMe bytes read and written and the disk used under --dir; then tokens/s (the median of the timed steps), the peak
RSS against a quarter of the model's fp32 size, and the losses.

    build/venv-current/bin/python benchmarks/zero_init_big.py --dir /var/tmp/z [--json FILE] [--plain]

--plain then builds the same model without zero_init, in fp32 as transformers does by default (25.1 GiB at the default
shape), in a child whose address space is limited to the machine's RAM less 6 GiB (RLIMIT_AS: a real out-of-memory
kill could take the machine's other work with it): torch's allocator fails there, which is the failure to show. Needs transformers (build/venv-current has it; the script re-runs itself there) and the strata
package of this checkout with build/'s libstrata.so (or $STRATA_LIB).
"""
import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VENV = os.path.join(REPO, "build", "venv-current", "bin", "python")
GIB = 2.0 ** 30


def find_transformers_or_skip():
    try:
        import transformers  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.exists(VENV) and os.path.realpath(VENV) != os.path.realpath(sys.executable) and \
            not os.environ.get("STRATA_BENCH_REEXEC"):
        os.execve(VENV, [VENV] + sys.argv, dict(os.environ, STRATA_BENCH_REEXEC="1"))
    print("SKIP: %s cannot import transformers, nor can %s (tools/run makes that venv)" % (sys.executable, VENV))
    sys.exit(77)


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key))


def ram_bytes():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def disk_used(path, free_at_start):
    """The disk taken since the start: the free space lost (the staging files are unlinked, so no walk sees them;
    other writers on the same disk count too)."""
    return max(0, free_at_start - shutil.disk_usage(path).free)


def add_shape_args(ap):
    """The Llama's shape, Llama-2-7B's by default (llama_config reads them)."""
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=11008)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)


def llama_config(a):
    import transformers
    return transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                                    num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                    num_key_value_heads=a.heads, max_position_embeddings=max(a.seq, 128))


def build(a, staged):
    """The model, built in a.dtype."""
    import torch
    import transformers
    import strata.torch
    torch.manual_seed(a.seed)
    config, default = llama_config(a), torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, a.dtype))  # as from_config(torch_dtype=...) does
    try:
        if not staged:
            return transformers.LlamaForCausalLM(config), None
        with strata.torch.zero_init(staging_dir=a.dir) as z:
            model = transformers.LlamaForCausalLM(config)
        return model, z
    finally:
        torch.set_default_dtype(default)


def engine_config(a):
    off = {"device": "nvme", "nvme_path": a.dir}
    cfg = {"train_micro_batch_size_per_gpu": a.batch,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 3, "offload_param": dict(off), "offload_optimizer": dict(off),
                                 "sub_group_size": a.sub_group},
           "strata": {"backend": "host", "step_in_backward": True, "optimizer_moments": a.moments,
                      "device_budget_bytes": int(a.device_budget * GIB), "host_budget_bytes": int(a.host_budget * GIB)}}
    if a.dtype == "bfloat16":
        cfg["bf16"] = {"enabled": True}
    return cfg


PLAIN_HEADROOM = 6 * GIB  # what the plain build's address space leaves the machine's other work


def plain_child(a):
    """Builds the model without zero_init, in fp32 (transformers' default), with its address space limited to the
    RAM less PLAIN_HEADROOM: prints how it ended."""
    limit = int(ram_bytes() - PLAIN_HEADROOM)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    a.dtype = "float32"
    t = time.time()
    try:
        model, _ = build(a, staged=False)
    except (RuntimeError, MemoryError) as e:
        print(json.dumps({"ok": False, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300]),
                          "seconds": time.time() - t, "peak_rss": status("VmHWM:")}))
        return
    print(json.dumps({"ok": True, "seconds": time.time() - t, "peak_rss": status("VmHWM:"),
                      "bytes": sum(p.numel() * p.element_size() for p in model.parameters())}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="staging and NVMe directory (emptied first; removed after)")
    add_shape_args(ap)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--moments", choices=("fp32", "bf16", "8bit"), default="8bit")
    ap.add_argument("--sub-group", type=int, default=50_000_000)
    ap.add_argument("--device-budget", type=float, default=1.5, help="GiB (the host backend's arena is host memory)")
    ap.add_argument("--host-budget", type=float, default=3.0, help="GiB")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plain", action="store_true", help="also show the build without zero_init (in a child)")
    ap.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    find_transformers_or_skip()
    if a.plain_child:
        return plain_child(a)
    import torch
    import transformers
    sys.path.insert(0, os.path.join(REPO, "python"))
    import strata.torch

    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    base_rss = status("VmRSS:")
    free0 = shutil.disk_usage(a.dir).free
    n_params = None
    print("machine: %s, %s, %d cores, %.1f GiB RAM, Linux %s; disk free under %s: %.1f GiB" % (
        platform.node(), platform.processor() or platform.machine(), len(os.sched_getaffinity(0)), ram_bytes() / GIB,
        platform.release(), a.dir, shutil.disk_usage(a.dir).free / GIB))
    print("build:   python %s, torch %s, transformers %s, strata %s" % (
        platform.python_version(), torch.__version__, transformers.__version__, strata.__file__))
    print("model:   LlamaForCausalLM %d layers x %d (intermediate %d, %d heads, vocab %d) in %s; batch %d x %d, "
          "%d steps" % (a.layers, a.hidden, a.intermediate, a.heads, a.vocab, a.dtype, a.batch, a.seq, a.steps))
    print("config:  %s" % json.dumps(engine_config(a)))
    rows = []
    fmt = "%-12s %9s %12s %12s %12s %12s %12s"
    print(fmt % ("phase", "seconds", "peak RSS", "staged", "nvme read", "nvme write", "disk taken"))

    def row(phase, seconds, st=None, staged=0):
        r = {"phase": phase, "seconds": seconds, "peak_rss": status("VmHWM:"), "staged": staged,
             "nvme_read": (st or {}).get("nvme_to_host_bytes", 0), "nvme_write": (st or {}).get("host_to_nvme_bytes", 0),
             "disk_used": disk_used(a.dir, free0)}
        rows.append(r)
        print(fmt % (phase, "%.1f" % seconds, "%.2f GiB" % (r["peak_rss"] / GIB), "%.2f GiB" % (staged / GIB),
                     "%.2f GiB" % (r["nvme_read"] / GIB), "%.2f GiB" % (r["nvme_write"] / GIB),
                     "%.2f GiB" % (r["disk_used"] / GIB)))
        sys.stdout.flush()

    t = time.time()
    model, z = build(a, staged=True)
    n_params = sum(p.numel() for p in model.parameters())
    row("build", time.time() - t, staged=z.staged_bytes)
    t = time.time()
    engine, _, _, _ = strata.torch.initialize(model=model, config=engine_config(a))
    row("initialize", time.time() - t, staged=strata.torch._zero_init.staged_bytes())
    g = torch.Generator().manual_seed(a.seed + 1)
    losses, times = [], []
    for step in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        before = engine.stats()
        t = time.time()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        times.append(time.time() - t)
        after = engine.stats()
        losses.append(loss.item())
        row("step %d" % step, times[-1], {k: after[k] - before[k] for k in ("nvme_to_host_bytes", "host_to_nvme_bytes")})
    engine.close()
    timed = times[1:] or times
    fp32_bytes = n_params * 4
    peak = max(r["peak_rss"] for r in rows)
    out = {"params": n_params, "fp32_bytes": fp32_bytes, "peak_rss": peak, "peak_rss_base": base_rss,
           "tokens_per_s": a.batch * a.seq / statistics.median(timed), "losses": losses, "rows": rows,
           "disk_peak": max(r["disk_used"] for r in rows)}
    print("params %d (fp32 %.2f GiB); peak RSS %.2f GiB = %.3f of the fp32 size (bar: < 0.25); tokens/s %.3f "
          "(median of %d timed steps); losses %s" % (n_params, fp32_bytes / GIB, peak / GIB, peak / fp32_bytes,
                                                     out["tokens_per_s"], len(timed),
                                                     " ".join("%.4f" % x for x in losses)))
    shutil.rmtree(a.dir, ignore_errors=True)
    if a.plain:
        os.makedirs(a.dir, exist_ok=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--plain-child"] + [x for x in sys.argv[1:]
                                                                             if x not in ("--plain",)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, STRATA_BENCH_REEXEC="1"))
        lines = res.stdout.strip().splitlines()
        plain = json.loads(lines[-1]) if res.returncode == 0 and lines else {"ok": False, "error": res.stderr[-500:]}
        out["plain"] = plain
        print("without zero_init, fp32 (RLIMIT_AS %.1f GiB): %s after %.1f s, peak RSS %.2f GiB" % (
            (ram_bytes() - PLAIN_HEADROOM) / GIB, "built" if plain.get("ok") else "failed: " + plain.get("error", "?"),
            plain.get("seconds", 0), plain.get("peak_rss", 0) / GIB))
        shutil.rmtree(a.dir, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if peak < fp32_bytes / 4 else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A PyTorch trainer through strata.torch against plain PyTorch, in the same run.

(a) Training. The GPT of examples/gpt (model.py, data.py: the same model, seed, batches and steps) trained as
    examples/gpt/train_strata.py trains it, through strata.torch.initialize with its ds_config.json (parameters and
    AdamW state on NVMe in a directory under build/scratch, a device budget below the parameters' size), against
    train_torch.py's loop with everything in memory and the best AdamW torch has for the device (fused=True where the
    installed torch has it, else foreach=True). torch's intra-op threads (the faster of 1 and all cores, probed)
    serve both runs' forward and backward. Tokens/s over the steps after the first --warmup-steps. The two alternate
    for --rounds rounds (the machine is shared); the ratio is the median of the per-round ratios. #wrong: final fp32
    weights more than --tol from torch's. They agree to ~1e-6, not bit for bit: strata keeps betas in fp32 (0.9 and
    0.95 are not exact there) and computes the clipping norm its own way; with fp32-exact betas and no clipping the
    runs are bit-identical (try --tol 0 with such a --config).
(b) Optimizer. strata.torch.OffloadAdam.step() with its state in host memory and on NVMe, against
    torch.optim.AdamW.step() over the same parameters (the shapes of a GPT of --adam-layers x --adam-embd) and the
    same gradients. The peer is the fastest of torch's AdamW implementations for the device (fused where this torch
    has it; else foreach=True and the single-tensor loop) at 1 thread and at all cores, probed first. Best and median
    ms per step (each run's first step excluded); the runs alternate for --rounds rounds. differ: elements not
    bit-identical to torch's; #wrong: elements more than --adam-tol x lr away (a wrong update is off by about lr).

    python3 benchmarks/torch_offload.py [--json] [--steps N] [--rounds R] [--device cpu|cuda] ...

Needs PyTorch (Debian's python3-torch lands in /usr/bin/python3, which may not be the python3 on PATH: this script
re-runs itself with an interpreter that has torch) and the strata package of this checkout (python/, with build/'s
libstrata.so, or $STRATA_LIB). Exits 1 when a #wrong is not 0.
"""
import argparse
import inspect
import json
import os
import platform
import shutil
import statistics
import sys
import time

from torch_python import find_torch_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLE = os.path.join(REPO, "examples", "gpt")


def machine_line(torch, device):
    cpu = "?"
    try:
        cpu = open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip()
    except (OSError, IndexError):
        pass
    ram = 0
    try:
        ram = int(open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]) / 1048576
    except (OSError, IndexError, ValueError):
        pass
    gpu = ""
    if device == "cuda":
        gpu = ", GPU %s" % torch.cuda.get_device_name()
    return "machine: %s, %s, %d cores, %.0f GiB RAM, Linux %s%s" % (platform.node(), cpu, len(os.sched_getaffinity(0)),
                                                                  ram, platform.release(), gpu)


def best_torch_adamw(torch, device):
    """(kwargs, words): the fastest torch.optim.AdamW implementation this torch has for the device."""
    params = inspect.signature(torch.optim.AdamW).parameters
    if "fused" in params:
        # torch 2.x has fused AdamW for CUDA, and for CPU from 2.4 on; an unsupported device raises at the first
        # step, so probe it.
        try:
            p = torch.zeros(4, device=device, requires_grad=True)
            p.grad = torch.zeros(4, device=device)
            torch.optim.AdamW([p], fused=True).step()
            return {"fused": True}, "fused=True"
        except (RuntimeError, TypeError, ValueError) as e:
            why = str(e).split("\n")[0]
            return {"foreach": True}, "foreach=True (fused=True refused on %s: %s)" % (device, why)
    return {"foreach": True}, "foreach=True (torch %s has no fused AdamW)" % torch.__version__


def deepspeed_cpu_adam():
    """(DeepSpeedCPUAdam class or None, words): DeepSpeed's CPU Adam, an optional peer (pip install deepspeed ninja;
    its op is built with the system compiler at first use). torch 1.x's extension builder compiles as C++14 unless
    told otherwise, and DeepSpeed's CPU sources need C++17: the flag is added here."""
    try:
        import deepspeed
        from deepspeed.ops.op_builder.cpu import builder as cpu_builder
        base = cpu_builder.CPUOpBuilder.cxx_args
        if not getattr(base, "strata_cxx17", False):
            def cxx_args(self, base=base):
                return [a for a in base(self) if not a.startswith("-std=")] + ["-std=c++17"]
            cxx_args.strata_cxx17 = True
            cpu_builder.CPUOpBuilder.cxx_args = cxx_args
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        import torch
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.zeros(4)
        DeepSpeedCPUAdam([p]).step()  # builds (or loads) the op now, not inside a timed step
        return DeepSpeedCPUAdam, "DeepSpeedCPUAdam (deepspeed %s)" % deepspeed.__version__
    except Exception as e:  # noqa: BLE001 -- an optional peer: say why it is missing
        return None, "DeepSpeedCPUAdam unavailable (%s: %s)" % (type(e).__name__, str(e).split("\n")[0][:160])


def peak_rss_reset():
    """Starts a new peak-RSS measurement (Linux: writing 5 to /proc/self/clear_refs resets VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_bytes(field):
    """VmHWM (the peak since the last reset) or VmRSS of this process, in bytes."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def pick_threads(a, hp, adamw_kw):
    """Sets torch's intra-op threads: a.threads, or the faster of 1 and all cores for torch's own training step
    (on a few cores, torch's OpenMP threads beside OpenBLAS's own can be several times slower than one)."""
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)
        return "%d threads (--threads)" % a.threads
    from data import load_corpus
    cores = len(os.sched_getaffinity(0))
    probe = argparse.Namespace(**dict(vars(a), steps=4))
    data = load_corpus(a.data)
    ms = {}
    for n in sorted({1, cores}):
        torch.set_num_threads(n)
        times = train_run("torch", probe, None, data, hp, adamw_kw)[0]
        ms[n] = 1e3 * statistics.median(times[1:])
    best = min(ms, key=ms.get)
    torch.set_num_threads(best)
    return "%d threads (probed, torch ms/step: %s)" % (best, ", ".join("%d: %.0f" % kv for kv in sorted(ms.items())))


# ---------------------------------------------------------------- (a) training

def train_run(kind, a, ds, data, hp, adamw_kw):
    """One training run; returns per-step seconds and losses, final fp32 weights, and strata's stats per step."""
    import torch
    import strata.torch
    from data import Batches
    from model import GPT, GPTConfig
    from train_torch import warmup_cosine

    torch.manual_seed(a.seed)
    model = GPT(GPTConfig(block_size=a.block, n_layer=a.layers, n_head=a.heads, n_embd=a.embd)).to(a.device)
    engine = None
    if kind == "torch":
        optimizer = torch.optim.AdamW(model.parameters(), lr=hp["lr"], betas=hp["betas"], eps=hp["eps"],
                                      weight_decay=hp["weight_decay"], **adamw_kw)
    else:
        engine, _, _, _ = strata.torch.initialize(model=model, config=ds)
        optimizer = engine.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(a.warmup, a.steps))
    batches = Batches(data, a.block, a.batch, a.seed, device=a.device)
    times, losses, stats = [], [], []
    for step in range(a.steps):
        before = engine.stats() if engine else None
        sync(torch, a.device)
        t0 = time.perf_counter()
        loss_sum = 0.0
        for _ in range(a.grad_accum):
            x, y = batches.next()
            if engine is None:
                loss = model(x, y)
                (loss / a.grad_accum).backward()
            else:
                loss = engine(x, y)
                engine.backward(loss)
                engine.step()
            loss_sum += loss.item()
        if engine is None:
            if hp["clip"]:
                torch.nn.utils.clip_grad_norm_(model.parameters(), hp["clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        sync(torch, a.device)
        times.append(time.perf_counter() - t0)
        losses.append(loss_sum / a.grad_accum)
        if engine:
            after = engine.stats()
            stats.append({k: after[k] - before[k] for k in ("nvme_to_host_bytes", "host_to_nvme_bytes", "stall_ns",
                                                            "adam_ns", "host_to_device_bytes")})
            stats[-1]["device_peak_bytes"] = after["device_peak_bytes"]
    if engine is None:
        weights = {k: v.detach().float().cpu().reshape(-1) for k, v in model.named_parameters()}
    else:
        weights = {k: v.reshape(-1) for k, v in engine.fp32_state_dict().items()}
        engine.close()
    return times, losses, weights, stats


def compare_weights(ref, got, tol):
    """(elements compared, elements more than tol apart, max |diff|); a name missing on one side counts whole."""
    n = wrong = 0
    worst = 0.0
    for name, r in ref.items():
        g = got.get(name)
        n += r.numel()
        if g is None or g.numel() != r.numel():
            wrong += r.numel()
            continue
        d = (g.double() - r.double()).abs()
        wrong += int((d > tol).sum())
        worst = max(worst, float(d.max()))
    return n, wrong, worst


def part_a(a, ds, hp, adamw_kw, report):
    from data import load_corpus

    data = load_corpus(a.data)
    tokens = a.batch * a.block * a.grad_accum
    zero = ds.get("zero_optimization", {})
    where = "params %s, optimizer %s" % tuple(zero.get(k, {}).get("device", "none") for k in ("offload_param",
                                                                                        "offload_optimizer"))
    print("training: torch %s for both runs' forward and backward" % pick_threads(a, hp, adamw_kw))
    timed = slice(a.warmup_steps, None)
    hdr = "%-5s %-36s %10s %9s %14s %14s %8s %7s %8s %10s %7s"
    print(hdr % ("round", "run", "tokens/s", "step ms", "NVMe rd B/st", "NVMe wr B/st", "stall %", "ratio",
                 "loss", "max|diff|", "#wrong"))
    ratios, rows, wrong_total = [], [], 0
    for r in range(1, a.rounds + 1):
        t_times, t_losses, t_w, _ = train_run("torch", a, ds, data, hp, adamw_kw)
        s_times, s_losses, s_w, s_stats = train_run("strata", a, ds, data, hp, adamw_kw)
        t_tps = tokens * len(t_times[timed]) / sum(t_times[timed])
        s_tps = tokens * len(s_times[timed]) / sum(s_times[timed])
        ratio = s_tps / t_tps
        ratios.append(ratio)
        n, wrong, worst = compare_weights(t_w, s_w, a.tol)
        wrong_total += wrong
        st = s_stats[timed]
        rd = statistics.median(x["nvme_to_host_bytes"] for x in st)
        wr = statistics.median(x["host_to_nvme_bytes"] for x in st)
        stall = 100.0 * sum(x["stall_ns"] for x in st) * 1e-9 / sum(s_times[timed])
        print(hdr % (r, "torch, all in memory", "%.0f" % t_tps, "%.1f" % (1e3 * statistics.median(t_times[timed])),
                     "0", "0", "-", "1", "%.4f" % t_losses[-1], "-", "-"))
        print(hdr % (r, "strata, " + where, "%.0f" % s_tps,
                     "%.1f" % (1e3 * statistics.median(s_times[timed])), "%.0f" % rd, "%.0f" % wr, "%.1f" % stall,
                     "%.3f" % ratio, "%.4f" % s_losses[-1], "%.1e" % worst, wrong))
        sys.stdout.flush()
        rows.append(dict(round=r, torch_tokens_per_s=t_tps, strata_tokens_per_s=s_tps, ratio=ratio,
                         torch_step_ms=1e3 * statistics.median(t_times[timed]),
                         strata_step_ms=1e3 * statistics.median(s_times[timed]), nvme_read_bytes_per_step=rd,
                         nvme_write_bytes_per_step=wr, stall_pct=stall, torch_loss=t_losses[-1],
                         strata_loss=s_losses[-1], max_abs_diff=worst, elements=n, wrong=wrong,
                         device_peak_bytes=s_stats[-1]["device_peak_bytes"]))
    ratio = statistics.median(ratios)
    print("training: strata (%s) / torch (all in memory) tokens/s = %.3f (median of %d rounds); device peak %.2f "
          "MiB of a %s budget; weights #wrong %d (tol %g)" % (
              where, ratio, a.rounds, rows[-1]["device_peak_bytes"] / 2**20,
              ds.get("strata", {}).get("device_budget_bytes", "default"), wrong_total, a.tol))
    report["training"] = dict(rows=rows, ratio=ratio, wrong=wrong_total)
    return wrong_total


# ---------------------------------------------------------------- (b) the optimizer alone

def adam_params(a):
    import torch
    from model import GPT, GPTConfig
    torch.manual_seed(a.seed)
    heads = max(1, a.adam_embd // 64)
    model = GPT(GPTConfig(block_size=a.block, n_layer=a.adam_layers, n_head=heads, n_embd=a.adam_embd))
    return [p.detach().clone() for p in model.parameters()]


def adam_run(kind, a, init, hp, adamw_kw, nvme_dir, ds_cls=None):
    """All step seconds of kind's optimizer over a.adam_steps steps, the parameters at the end, and what it cost:
    strata's bytes per link per step (the last step) and the process's peak RSS above its RSS before the optimizer
    was built (its state plus whatever it stages)."""
    import torch
    import strata.torch
    params = [torch.nn.Parameter(p.clone().to(a.device)) for p in init]
    kw = dict(lr=hp["lr"], betas=hp["betas"], eps=hp["eps"], weight_decay=hp["weight_decay"])
    gen = torch.Generator().manual_seed(a.seed + 1)
    for p in params:  # the gradients exist before the optimizer, as after a first backward
        p.grad = torch.zeros_like(p)
    resettable = peak_rss_reset()
    base = rss_bytes("VmRSS")
    if kind == "torch":
        opt = torch.optim.AdamW(params, **kw, **adamw_kw)
    elif kind == "deepspeed":
        opt = ds_cls(params, adamw_mode=True, **kw)
    elif kind == "strata-host":
        opt = strata.torch.OffloadAdam(params, **kw)
    else:
        opt = strata.torch.OffloadAdam(params, **kw, config={"zero_optimization": {"offload_optimizer": {
            "device": "nvme", "nvme_path": nvme_dir}}})
    times, links = [], {}
    for _ in range(a.adam_steps):
        for p in params:
            # Into the gradient in place, as backward accumulates it: a fresh tensor per step makes the
            # allocator's behaviour part of the timing (torch's step time then swings 2x between steps).
            p.grad.copy_((torch.randn(p.shape, generator=gen) * 1e-2).to(a.device))
        before = opt.stats()[0] if kind.startswith("strata") else None
        sync(torch, a.device)
        t0 = time.perf_counter()
        opt.step()
        sync(torch, a.device)
        times.append(time.perf_counter() - t0)
        if before is not None:
            after = opt.stats()[0]
            links = {k: after[k] - before[k] for k in LINKS}
    peak = rss_bytes("VmHWM") - base if resettable else None
    out = [p.detach().cpu().clone() for p in params]
    close = getattr(opt, "close", None)
    if close:
        close()
    return times, out, links, peak


LINKS = ("host_to_device_bytes", "device_to_host_bytes", "nvme_to_host_bytes", "host_to_nvme_bytes")


def part_b(a, hp, adamw_kw, adam_words, nvme_dir, report):
    import torch
    init = adam_params(a)
    numel = sum(p.numel() for p in init)
    # torch's peer: the fastest of its AdamW implementations for the device (fused where this torch has it, else
    # foreach, and the single-tensor loop, which on CPU can beat foreach) at 1 thread and at all cores, probed.
    impls = [adamw_kw] + ([{"foreach": False}] if "fused" not in adamw_kw else [])
    counts = [a.threads] if a.threads else sorted({1, len(os.sched_getaffinity(0))})
    probe = argparse.Namespace(**dict(vars(a), adam_steps=4))
    ms = {}
    for kw in impls:
        for n in counts:
            torch.set_num_threads(n)
            ms[(json.dumps(kw), n)] = 1e3 * statistics.median(adam_run("torch", probe, init, hp, kw, nvme_dir)[0][1:])
    best = min(ms, key=ms.get)
    adamw_kw = json.loads(best[0])
    torch.set_num_threads(best[1])
    impl = lambda kw: ", ".join("%s=%s" % kv for kv in json.loads(kw).items())  # noqa: E731
    adam_words = "%s, %d threads (probed, ms/step: %s)" % (impl(best[0]), best[1], "; ".join(
        "%s %d thr %.0f" % (impl(k), n, v) for (k, n), v in sorted(ms.items())))
    ds_cls, ds_words = (None, "DeepSpeedCPUAdam not asked for (--no-deepspeed)") if a.no_deepspeed else \
        deepspeed_cpu_adam()
    tol = a.adam_tol * hp["lr"]
    print("optimizer: %d parameters in %d tensors (a GPT of %d layers x embd %d), %d steps x %d rounds, interleaved "
          "(each run's first step excluded); lr %g, weight_decay %g; #wrong: |x - torch| > %g" % (
              numel, len(init), a.adam_layers, a.adam_embd, a.adam_steps, a.rounds, hp["lr"], hp["weight_decay"], tol))
    print("peers:     torch.optim.AdamW %s; %s; strata's CPU Adam threads: strata.cpu_threads default" % (
        adam_words, ds_words))
    kinds = [("torch", "torch.optim.AdamW(%s)" % adam_words.split(", ")[0])]
    if ds_cls is not None:
        kinds.append(("deepspeed", "DeepSpeedCPUAdam"))
    kinds += [("strata-host", "strata OffloadAdam, state in host"), ("strata-nvme", "strata OffloadAdam, state on NVMe")]
    times = {k: [] for k, _ in kinds}
    medians = {k: [] for k, _ in kinds}  # per round: the ratio is taken between runs of the same round
    out, errors, links, peaks = {}, {}, {}, {}
    for _ in range(a.rounds):  # interleaved: the machine is shared
        for kind, _ in kinds:
            if kind in errors:
                continue
            try:
                t, out[kind], links[kind], peak = adam_run(kind, a, init, hp, adamw_kw, nvme_dir, ds_cls)
                times[kind] += t[1:]
                medians[kind].append(statistics.median(t[1:]))
                peaks[kind] = max(peaks.get(kind) or 0, peak or 0)
            except Exception as e:  # noqa: BLE001 -- reported, and counted as wrong
                errors[kind] = "%s: %s" % (type(e).__name__, str(e).split("\n")[0])
    peers = [k for k, _ in kinds if not k.startswith("strata") and k not in errors]

    def ratio(kind, peer):
        """strata / peer step time: the median over rounds of the ratio of the two runs' median steps."""
        return statistics.median(s / p for s, p in zip(medians[kind], medians[peer]))

    hdr = "%-34s %8s %9s %8s %8s %10s %10s %10s %10s %10s %9s %10s %6s"
    print(hdr % ("optimizer", "best ms", "median ms", "/torch", "/ds", "h2d B/st", "d2h B/st", "nvme rd/st",
                 "nvme wr/st", "RSS peak", "differ", "max|diff|", "#wrong"))
    rows, wrong_total = [], 0
    for kind, label in kinds:
        if kind in errors:
            print("%-34s failed: %s" % (label, errors[kind]))
            rows.append(dict(optimizer=kind, error=errors[kind]))
            wrong_total += numel
            continue
        best, med = min(times[kind]), statistics.median(times[kind])
        row = dict(optimizer=kind, best_ms=best * 1e3, median_ms=med * 1e3, rss_peak_bytes=peaks.get(kind),
                   **{"ratio_to_" + p: ratio(kind, p) for p in peers}, **links.get(kind, {}))
        cells = ["%.3f" % row["ratio_to_" + p] if p in peers else "-" for p in ("torch", "deepspeed")]
        cells += ["%.0f" % links[kind][k] if links.get(kind) else "-" for k in LINKS]
        cells.append("%.1f MB" % (peaks[kind] / 1e6) if peaks.get(kind) is not None else "-")
        if kind == "torch":
            cells += ["-", "-", "-"]
        else:
            diffs = [(x - t).abs() for x, t in zip(out[kind], out["torch"])]
            differ = sum(int((d > 0).sum()) for d in diffs)
            worst = max(float(d.max()) for d in diffs)
            wrong = sum(int((d > tol).sum()) for d in diffs)
            wrong_total += wrong
            row.update(differ=differ, max_abs_diff=worst, wrong=wrong)
            cells += [differ, "%.1e" % worst, wrong]
        print(hdr % tuple([label, "%.2f" % (best * 1e3), "%.2f" % (med * 1e3)] + cells))
        rows.append(row)
    host = next((r for r in rows if r["optimizer"] == "strata-host" and "error" not in r), {})
    worst_ratio = max([host["ratio_to_" + p] for p in peers if "ratio_to_" + p in host] or [float("nan")])
    print("optimizer: strata OffloadAdam (state in host memory) / best peer step time = %.3f (median of %d "
          "interleaved rounds; the bar is <= 1.0); differ = elements not bit-identical to torch's" % (
              worst_ratio, a.rounds))
    report["optimizer"] = dict(numel=numel, torch_adamw=adam_words, deepspeed=ds_words,
                               threads=torch.get_num_threads(), rows=rows, ratio_to_best_peer=worst_ratio,
                               wrong=wrong_total)
    return wrong_total


# ---------------------------------------------------------------- main

def main():
    find_torch_or_skip()
    import torch
    sys.path.insert(0, os.path.join(REPO, "python"))
    sys.path.insert(0, EXAMPLE)
    import strata

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON object at the end")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, help="torch's CPU threads (default: the faster of 1 and all cores for "
                    "torch's training, probed)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--dir", default=os.path.join(REPO, "build", "scratch", "torch_offload"),
                    help="the NVMe tier's directory")
    g = ap.add_argument_group("(a) training: the example's model and loop")
    g.add_argument("--config", default=os.path.join(EXAMPLE, "ds_config.json"))
    g.add_argument("--layers", type=int, default=6)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--embd", type=int, default=256)
    g.add_argument("--block", type=int, default=128)
    g.add_argument("--batch", type=int, default=8)
    g.add_argument("--grad-accum", type=int, default=2)
    g.add_argument("--steps", type=int, default=20)
    g.add_argument("--warmup-steps", type=int, default=3, help="first steps excluded from the timing")
    g.add_argument("--warmup", type=int, default=5, help="learning-rate warmup steps")
    g.add_argument("--rounds", type=int, default=5)
    g.add_argument("--tol", type=float, default=1e-4, help="#wrong: weights further than this from torch's")
    g.add_argument("--data", help="a byte stream (default: README.md + docs/*.md)")
    g = ap.add_argument_group("(b) the optimizer alone")
    g.add_argument("--adam-layers", type=int, default=12)
    g.add_argument("--adam-embd", type=int, default=768)
    g.add_argument("--adam-steps", type=int, default=8, help="steps per run (the first excluded)")
    g.add_argument("--adam-tol", type=float, default=1e-3,
                   help="#wrong: parameters further than this x lr from torch's (a wrong update is off by ~lr)")
    g.add_argument("--no-deepspeed", action="store_true", help="leave DeepSpeedCPUAdam out (it is an optional peer: "
                   "pip install deepspeed ninja in the interpreter that runs this)")
    g.add_argument("--skip-training", action="store_true")
    g.add_argument("--skip-optimizer", action="store_true")
    a = ap.parse_args()
    if a.steps <= a.warmup_steps:
        ap.error("--steps %d must exceed --warmup-steps %d" % (a.steps, a.warmup_steps))

    with open(a.config) as f:
        ds = json.load(f)
    ds["gradient_accumulation_steps"] = a.grad_accum
    train_dir, adam_dir = os.path.join(a.dir, "train"), os.path.join(a.dir, "adam")
    for d in (train_dir, adam_dir):
        os.makedirs(d, exist_ok=True)
    for tier in ("offload_param", "offload_optimizer"):
        off = ds.get("zero_optimization", {}).get(tier, {})
        if off.get("device") == "nvme":
            off["nvme_path"] = train_dir
    p = ds.get("optimizer", {}).get("params", {})
    hp = dict(lr=p.get("lr", 1e-3), betas=tuple(p.get("betas", (0.9, 0.999))), eps=p.get("eps", 1e-8),
              weight_decay=p.get("weight_decay", 0.01), clip=ds.get("gradient_clipping", 0.0))
    adamw_kw, adam_words = best_torch_adamw(torch, a.device)

    print(machine_line(torch, a.device))
    print("build:   torch %s (%s); strata %s (%s)" % (torch.__version__, sys.executable, strata.version(),
                                                     strata.library_path()[0]))
    cfg = strata.Config({k: v for k, v in ds.items()})
    defaults = strata.Config(None).resolved
    changed = ", ".join("%s=%s" % (k, json.dumps(v)) for k, v in sorted(cfg.resolved.items()) if defaults.get(k) != v)
    print("config:  %s with gradient_accumulation_steps=%d, nvme_path=%s; resolved, where not the default: %s" % (
        os.path.relpath(a.config, REPO), a.grad_accum, train_dir, changed))
    fs = shutil.disk_usage(a.dir)
    from model import GPT, GPTConfig
    n = sum(p.numel() for p in GPT(GPTConfig(block_size=a.block, n_layer=a.layers, n_head=a.heads,
                                             n_embd=a.embd)).parameters())
    print("model:   GPT %d layers, %d heads, embd %d, block %d: %d parameters (%.1f MiB in fp32); batch %d x "
          "grad-accum %d = %d tokens/step; %d steps (the first %d excluded), %d rounds; seed %d; device %s; "
          "NVMe dir %s (%.0f GiB free)" % (a.layers, a.heads, a.embd, a.block, n, n * 4 / 2**20, a.batch, a.grad_accum,
                               a.batch * a.block * a.grad_accum, a.steps, a.warmup_steps, a.rounds, a.seed,
                               a.device, a.dir, fs.free / 2**30))
    print("peer:    torch.optim.AdamW %s, clip_grad_norm_(%g), everything in %s memory" % (
        adam_words, hp["clip"], a.device))
    print()
    report = dict(torch=torch.__version__, device=a.device, seed=a.seed, torch_adamw=adam_words)
    wrong = 0
    if not a.skip_training:
        wrong += part_a(a, ds, hp, adamw_kw, report)
        print()
    if not a.skip_optimizer:
        wrong += part_b(a, hp, adamw_kw, adam_words, adam_dir, report)
    if a.json:
        print(json.dumps(report))
    for d in (train_dir, adam_dir, a.dir):  # strata's swap files are gone with their engines; leave no empty dirs
        try:
            os.rmdir(d)
        except OSError:
            pass
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

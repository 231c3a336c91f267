#!/usr/bin/env python3
"""strata's GPT model against the same GPT in PyTorch, on the same CPU cores (or the same GPU), in the same run.

(a) strata: `strata train` on the host backend with everything in its (host) device memory (--device host
    --offload device --dtype fp32), reading the per-step figures of --log-jsonl: step_s, and optimizer_s, the
    engine's AdamW step inside it; forward + backward = step_s - optimizer_s.
(b) torch: the same GPT (GPT-2 blocks: pre-LayerNorm, causal self-attention, tanh GELU MLP, tied head) written
    with torch.nn.functional in fp32, the same shapes, batches drawn from the same bytes; each step is forward +
    cross-entropy + backward (timed as forward + backward), then torch.optim.AdamW (foreach) and zero_grad (timed
    as the optimizer). Attention is F.scaled_dot_product_attention(is_causal=True) where this torch has it, else
    the explicit masked softmax. torch's intra-op threads: --threads, or the faster of 1 and all cores (probed).
    Both sides use the same learning-rate schedule (linear warmup, cosine to lr/10).

The two alternate for --rounds rounds (the machine is shared); each round runs --steps steps and times those
after the first --warmup-steps. tokens/s = batch x seq / seconds per step. ratio = strata tokens/s / torch's,
the median of the per-round ratios (forward + backward, and whole steps). #wrong: strata steps whose loss is not
finite, and rounds where strata's loss (the mean over the timed steps) is more than --loss-tol above torch's (both
train the same model on the same bytes, so a broken kernel shows as a loss that does not fall like torch's).
With --profile, strata's last round runs with STRATA_MODEL_PROFILE=1 and its per-kernel table is printed (host).

--device cuda puts both on the GPU: strata in bf16 with its parameters there and every optimizer sub-group on the
device's Adam (offload_optimizer.ratio 0); torch with bf16 autocast, scaled_dot_product_attention and fused AdamW,
timed between torch.cuda.synchronize() calls. (tools/run gpu runs it at the 124M shape.)

    python3 benchmarks/gpt_speed.py [--json] [--strata build/strata] [--layers 4 --hidden 256 --heads 4]
                                    [--vocab 256 --seq 128 --batch 8 --rounds 5 --steps 12] [--profile]

Needs PyTorch (Debian's python3-torch lands in /usr/bin/python3, which may not be the python3 on PATH: this
script re-runs itself with an interpreter that has torch). Exits 1 when #wrong is not 0.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from torch_python import find_torch_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def machine_line():
    cpu = "?"
    try:
        cpu = open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip()
    except (OSError, IndexError):
        pass
    return "machine: %s, %s, %d cores, Linux %s" % (platform.node(), cpu, len(os.sched_getaffinity(0)),
                                                    platform.release())


def lr_at(a, step):
    """strata train's schedule: linear warmup over steps/10, then cosine down to lr/10."""
    warm = max(1, a.steps // 10)
    lo = a.lr / 10
    if step < warm:
        return a.lr * (step + 1) / warm
    p = (step - warm) / max(1, a.steps - warm)
    return lo + 0.5 * (a.lr - lo) * (1 + math.cos(math.pi * p))


# ---------------------------------------------------------------- (b) torch

def torch_params(torch, a):
    """GPT-2's initialisation, in the order of model/gpt_layout.c (the order does not matter to the timing)."""
    C, L = a.hidden, a.layers
    g = torch.Generator().manual_seed(a.seed)

    def w(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).requires_grad_(True)

    def const(n, v):
        return torch.full((n,), float(v)).requires_grad_(True)

    p = {"wte": w(a.vocab, C), "wpe": w(a.seq, C), "blocks": []}
    for _ in range(L):
        proj_std = 0.02 / math.sqrt(2 * L)
        p["blocks"].append([const(C, 1), const(C, 0), w(3 * C, C), const(3 * C, 0), w(C, C, std=proj_std), const(C, 0),
                            const(C, 1), const(C, 0), w(4 * C, C), const(4 * C, 0), w(C, 4 * C, std=proj_std),
                            const(C, 0)])
    p["lnf"] = [const(C, 1), const(C, 0)]
    flat = [p["wte"], p["wpe"]] + [t for b in p["blocks"] for t in b] + p["lnf"]
    if a.device == "cuda":
        with torch.no_grad():
            flat = [t.detach().cuda().requires_grad_(True) for t in flat]
        it = iter(flat)
        p = {"wte": next(it), "wpe": next(it), "blocks": [[next(it) for _ in range(12)] for _ in range(L)],
             "lnf": [next(it), next(it)]}
    return p, flat


def torch_loss(torch, F, p, x, y, a, sdpa):
    B, T, C, NH = x.shape[0], x.shape[1], a.hidden, a.heads
    h = p["wte"][x] + p["wpe"][:T]
    for ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fpw, fpb in p["blocks"]:
        u = F.layer_norm(h, (C,), ln1w, ln1b, eps=1e-5)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in F.linear(u, qkvw, qkvb).split(C, dim=2))
        if sdpa:
            y_att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(C // NH))
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            y_att = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        h = h + F.linear(y_att.transpose(1, 2).reshape(B, T, C), projw, projb)
        u = F.layer_norm(h, (C,), ln2w, ln2b, eps=1e-5)
        h = h + F.linear(F.gelu(F.linear(u, fcw, fcb), approximate="tanh"), fpw, fpb)
    h = F.layer_norm(h, (C,), p["lnf"][0], p["lnf"][1], eps=1e-5)
    return F.cross_entropy((h @ p["wte"].t()).view(-1, a.vocab), y.view(-1))


def torch_run(a, data, steps, sdpa):
    """Per-step (forward + backward seconds, optimizer seconds, loss) of one torch training run."""
    import torch
    import torch.nn.functional as F
    p, flat = torch_params(torch, a)
    cuda = a.device == "cuda"
    # strata train's AdamW; on the GPU the fused kernel, the fastest torch has.
    opt = torch.optim.AdamW(flat, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                            **({"fused": True} if cuda else {"foreach": True}))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    g = torch.Generator().manual_seed(a.seed + 1)
    out = []
    for step in range(steps):
        starts = torch.randint(0, len(data) - a.seq - 1, (a.batch,), generator=g)
        chunk = torch.stack([data[s:s + a.seq + 1] for s in starts.tolist()])
        x, y = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
        if cuda:
            x, y = x.cuda(), y.cuda()
        sync()
        t0 = time.perf_counter()
        if cuda:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch_loss(torch, F, p, x, y, a, sdpa)
        else:
            loss = torch_loss(torch, F, p, x, y, a, sdpa)
        loss.backward()
        sync()
        t1 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(a, step)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        t2 = time.perf_counter()
        out.append((t1 - t0, t2 - t1, loss.item()))
    return out


def pick_threads(a, data, sdpa):
    import torch
    if a.device == "cuda":
        return "on the GPU"
    if a.threads:
        torch.set_num_threads(a.threads)
        return "%d threads (--threads)" % a.threads
    ms = {}
    for n in sorted({1, len(os.sched_getaffinity(0))}):
        torch.set_num_threads(n)
        ms[n] = 1e3 * statistics.median(s[0] + s[1] for s in torch_run(a, data, 4, sdpa)[1:])
    best = min(ms, key=ms.get)
    torch.set_num_threads(best)
    return "%d threads (probed, ms/step: %s)" % (best, ", ".join("%d: %.0f" % kv for kv in sorted(ms.items())))


# ---------------------------------------------------------------- (a) strata

def strata_cmd(a, jsonl):
    return [a.strata, "train", "--layers", str(a.layers), "--heads", str(a.heads), "--hidden", str(a.hidden),
            "--vocab", str(a.vocab), "--context", str(a.seq), "--seq", str(a.seq), "--batch", str(a.batch),
            "--steps", str(a.steps), "--lr", str(a.lr), "--seed", str(a.seed), "--data", a.data,
            "--quiet", "--log-jsonl", jsonl] + (
                # Everything on the GPU: the parameters, and the optimizer too (Twin-Flow's device Adam for every
                # sub-group: offload_optimizer.ratio 0), like torch's fused AdamW.
                ["--device", "cuda", "--offload", "device", "--dtype", "bf16", "--config", a.device_config]
                if a.device == "cuda" else ["--device", "host", "--offload", "device", "--dtype", "fp32"])


def strata_run(a, profile):
    """Per-step (forward + backward seconds, optimizer seconds, loss) of one `strata train` run, and its
    per-kernel table (stderr) when profiled."""
    with tempfile.TemporaryDirectory() as d:
        jsonl = os.path.join(d, "steps.jsonl")
        env = dict(os.environ)
        if profile:
            env["STRATA_MODEL_PROFILE"] = "1"
        r = subprocess.run(strata_cmd(a, jsonl), capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.exit("strata train failed (exit %d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
        steps = [json.loads(line) for line in open(jsonl)]
    return [(s["step_s"] - s["optimizer_s"], s["optimizer_s"], s["loss"]) for s in steps], r.stderr


# ---------------------------------------------------------------- main

def main():
    find_torch_or_skip()
    import numpy as np
    import torch
    import torch.nn.functional as F

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON object at the end")
    ap.add_argument("--strata", default=os.path.join(REPO, "build", "strata"), help="the strata binary")
    ap.add_argument("--threads", type=int, help="torch's threads (default: the faster of 1 and all cores, probed)")
    ap.add_argument("--device", choices=("host", "cuda"), default="host",
                    help="cuda: both on the GPU, strata in bf16 with its device Adam, torch with bf16 autocast and "
                         "fused AdamW")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256, help="at least 256 (the byte-level tokens)")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup-steps", type=int, default=2, help="first steps of each run excluded from the timing")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--data", default=os.path.join(REPO, "README.md"), help="training bytes for both sides")
    ap.add_argument("--loss-tol", type=float, default=0.25, help="#wrong: strata's mean loss this far above torch's")
    ap.add_argument("--profile", action="store_true", help="strata's per-kernel time (STRATA_MODEL_PROFILE=1)")
    ap.add_argument("--peak-tflops", type=float,
                    help="the GPU's dense bf16 peak for the %% column (default: 989.4 on an H100 or H200 SXM, else "
                         "no %% column)")
    a = ap.parse_args()
    if a.steps <= a.warmup_steps:
        ap.error("--steps %d must exceed --warmup-steps %d" % (a.steps, a.warmup_steps))
    if a.vocab < 256:
        ap.error("--vocab %d: byte-level tokens need at least 256" % a.vocab)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("SKIP: torch sees no GPU")
        return 77
    with tempfile.TemporaryDirectory() as scratch:
        a.device_config = os.path.join(scratch, "device_adam.json")
        with open(a.device_config, "w") as f:
            json.dump({"zero_optimization": {"offload_optimizer": {"ratio": 0}}}, f)
        return compare(a, torch, F, np)


def peak_tflops(torch):
    """The dense bf16 tensor-core peak of the GPU torch sees, where known (NVIDIA's data sheets, SXM parts)."""
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    return 989.4 if ("H100" in name or "H200" in name) else None


def compare(a, torch, F, np):
    """The rounds, the table and the verdict (main's, with the arguments checked)."""
    raw = np.fromfile(a.data, dtype=np.uint8).astype(np.int64) % a.vocab
    data = torch.from_numpy(raw)
    sdpa = hasattr(F, "scaled_dot_product_attention")

    print(machine_line())
    ver = subprocess.run([a.strata, "--version"], capture_output=True, text=True).stdout.strip() or "?"
    print("build:   torch %s (%s); %s (%s); OMP_WAIT_POLICY=%s" % (
        torch.__version__, sys.executable, ver, a.strata, os.environ.get("OMP_WAIT_POLICY", "unset")))
    print("model:   GPT %d layers, %d heads, hidden %d, vocab %d, seq %d, batch %d = %d tokens/step; %s; %d steps "
          "(the first %d excluded) x %d rounds; seed %d; data %s (%d bytes)" % (
              a.layers, a.heads, a.hidden, a.vocab, a.seq, a.batch, a.batch * a.seq,
              "bf16 on the GPU" if a.device == "cuda" else "fp32", a.steps, a.warmup_steps,
              a.rounds, a.seed, os.path.relpath(a.data, REPO), len(raw)))
    print("strata:  %s" % " ".join(strata_cmd(a, "FILE")))
    print("torch:   torch.nn.functional, %s attention, AdamW(foreach=True) lr %g, betas 0.9/0.999, no weight decay "
          "(as strata train); %s" % (
        "F.scaled_dot_product_attention" if sdpa else "explicit masked-softmax", a.lr, pick_threads(a, data, sdpa)))
    print()

    tokens = a.batch * a.seq
    timed = slice(a.warmup_steps, None)
    hdr = "%-5s %-7s %12s %10s %9s %10s %8s %8s %8s %7s"
    print(hdr % ("round", "run", "fwd+bwd t/s", "step t/s", "fb ms", "optim ms", "ratio", "step rt", "loss", "#wrong"))
    fb_ratios, step_ratios, rows, wrong_total, profile = [], [], [], 0, ""
    for r in range(1, a.rounds + 1):
        t = torch_run(a, data, a.steps, sdpa)
        s, err = strata_run(a, a.profile and r == a.rounds)
        if a.profile and r == a.rounds:
            profile = err
        res = {}
        for name, run in (("torch", t), ("strata", s)):
            fb = statistics.median(x[0] for x in run[timed])
            opt = statistics.median(x[1] for x in run[timed])
            res[name] = dict(fb_tokens_per_s=tokens / fb, step_tokens_per_s=tokens / (fb + opt), fb_ms=1e3 * fb,
                             optimizer_ms=1e3 * opt,
                             loss=statistics.mean(x[2] for x in run[timed]))
        fb_ratio = res["strata"]["fb_tokens_per_s"] / res["torch"]["fb_tokens_per_s"]
        step_ratio = res["strata"]["step_tokens_per_s"] / res["torch"]["step_tokens_per_s"]
        wrong = sum(not math.isfinite(x[2]) for x in s) + (res["strata"]["loss"] > res["torch"]["loss"] + a.loss_tol)
        wrong_total += wrong
        fb_ratios.append(fb_ratio)
        step_ratios.append(step_ratio)
        for name in ("torch", "strata"):
            x = res[name]
            cells = ("%.3f" % fb_ratio, "%.3f" % step_ratio, wrong) if name == "strata" else ("1", "1", "-")
            print(hdr % ((r, name, "%.0f" % x["fb_tokens_per_s"], "%.0f" % x["step_tokens_per_s"], "%.1f" % x["fb_ms"],
                          "%.1f" % x["optimizer_ms"]) + cells[:2] + ("%.4f" % x["loss"], cells[2])))
        sys.stdout.flush()
        rows.append(dict(round=r, torch=res["torch"], strata=res["strata"], ratio=fb_ratio, step_ratio=step_ratio,
                         wrong=wrong))
    ratio, step_ratio = statistics.median(fb_ratios), statistics.median(step_ratios)
    # Model FLOPs of forward + backward (gpt_flops_per_token in model/gpt_layout.c: 6 per parameter, the tied head
    # included, plus attention's two T x T products), at the median tokens/s of each side.
    params = a.vocab * a.hidden + a.seq * a.hidden + a.layers * (12 * a.hidden * a.hidden + 13 * a.hidden) + 2 * a.hidden
    flops_per_token = 6.0 * params + 12.0 * a.layers * a.seq * a.hidden
    peak = a.peak_tflops or peak_tflops(torch) if a.device == "cuda" else None
    tflops = {}
    for name in ("torch", "strata"):
        tps = statistics.median(r[name]["fb_tokens_per_s"] for r in rows)
        tflops[name] = flops_per_token * tps / 1e12
        print("%-6s forward + backward: %.3g TFLOPS%s" % (
            name, tflops[name], " = %.1f%% of the %.1f TFLOPS bf16 peak" % (100 * tflops[name] / peak, peak)
            if peak else ""))
    print("strata / torch tokens/s: forward + backward %.3f, whole step (with AdamW) %.3f (medians of %d rounds, "
          "per-round %.3f..%.3f); #wrong %d" % (ratio, step_ratio, a.rounds, min(fb_ratios), max(fb_ratios),
                                                wrong_total))
    print("FIGURE: fwd+bwd %.3f x torch, step %.3f x torch; strata fwd+bwd %.3g TFLOPS%s; #wrong %d" % (
        ratio, step_ratio, tflops["strata"], " (%.1f%% of peak)" % (100 * tflops["strata"] / peak) if peak else "",
        wrong_total))
    if profile:
        print()
        print(profile.rstrip())
    if a.json:
        print(json.dumps(dict(torch=torch.__version__, threads=torch.get_num_threads(), sdpa=sdpa, rows=rows,
                              ratio=ratio, step_ratio=step_ratio, wrong=wrong_total, fb_tflops=tflops,
                              peak_tflops=peak, activations=os.environ.get("STRATA_MODEL_ACTS", "fp32"))))
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())

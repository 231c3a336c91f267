#!/usr/bin/env python3
"""The flagship shape trained through PyTorch by DeepSpeed's ZeRO-Offload and by strata.torch: one peer a process.

    python3 benchmarks/flagship_peers.py --peer deepspeed-z2|deepspeed-z3|strata-torch [--steps 4] [--json FILE]

Run each peer in its own process, one after the other (each needs most of the host's memory), and divide the
FIGURE lines' tokens/s: strata.torch / DeepSpeed. On the GPU machine, which reaches no registry, DeepSpeed comes
from the wheels tools/gpu/ds_carry.sh puts in .gpu/deepspeed (carried), and its CPU Adam op is built there first:

    tools/gpu/ds_carry.sh --install .gpu/deepspeed /tmp/site && export PYTHONPATH=/tmp/site:$PWD/python
    python3 benchmarks/flagship_peers.py --peer deepspeed-z2 --json $OUT/deepspeed_z2.json
    STRATA_LIB=<a CUDA build of libstrata.so> python3 benchmarks/flagship_peers.py --peer strata-torch
 The defaults are the flagship of tools/gpu/items.sh
(RUN_ZERO_OFFLOAD_7B): a GPT of 32 layers, hidden 4096, 32 heads, vocab 50304, context 1024 (6,654,402,560
parameters), batch 8 x 1024 tokens, bf16, activation checkpointing, the parameters on the GPU and the optimizer
state and gradients in host memory.

The work is the same for every peer: the GPT below (GPT-2's shape as examples/gpt/model.py has it, with the same
parameters, written here with PyTorch's fused causal attention, scaled_dot_product_attention, where model.py
materialises the T x T scores: 512 MiB a layer at this shape) built on the device in bf16 from --seed, every block
run under torch.utils.checkpoint (recomputed in backward), the same random tokens (torch.randint from --seed + 1,
one fresh batch a step), and one DeepSpeed config given to deepspeed.initialize or strata.torch.initialize (printed
at start): bf16, ZeRO stage 2 (deepspeed-z2, strata-torch) or 3 (deepspeed-z3) with offload_optimizer cpu and
pinned memory, AdamW (DeepSpeed then runs its DeepSpeedCPUAdam, strata its own CPU Adam), WarmupLR from lr/warmup to
--lr over --warmup steps, gradient clipping 1.0, one micro-batch a step. Its "strata" section (device and host
budgets) is read by strata alone; DeepSpeed ignores a top-level key it does not know.

Where each keeps what (N parameters; 6.65B: 2N = 12.4 GiB, 4N = 24.8 GiB):
  deepspeed-z2  GPU: the bf16 parameters (flattened, 2N), their gradients in reduce buckets, the activations.
                Host: fp32 master weights (4N, pinned), a bf16 copy of the parameters for the upload (2N, pinned),
                fp32 gradients (4N, pinned), Adam's moments (8N): 18N, 112 GiB.
  deepspeed-z3  GPU: the bf16 parameters (partitioned, whole with one rank), gathered around each module.
                Host: fp32 master partitions (4N), the bf16 gradient partitions (2N, pinned), the fp32 gradients of
                each optimizer sub-group (4N, pinned), moments (8N): 18N, 112 GiB.
  strata-torch  GPU: the bf16 parameters in strata's arena (--strata-device-budget), one module's gradient buffers
                there; the activations in torch's allocator. Host: master weights and moments (12N), the fp32
                gradient store (4N), pinned staging (about 1.2 GiB): 100.3 GiB, which strata's default host budget
                (3/4 of RAM: 96 GiB of 128) refuses, hence --host-budget (default 7/8 of RAM).
On a 128 GiB machine that leaves 10-25 GiB for the process itself; a peer that outgrows it is killed (rc 137).
torch's pinned allocator rounds every block up to a power of two, which would pin DeepSpeed's 4N buffers in 32 GiB
blocks (z2: 130 GiB in all, past the RAM). Where this torch takes pinned_max_round_threshold_mb, blocks above 64 MiB
are pinned at their size (set in every peer's process); where it does not, --ds-pin-memory auto turns DeepSpeed's
pin_memory off at shapes whose 18N exceeds a quarter of the RAM, and says so (strata pins its own buffers, and its
config keeps pin_memory true, the only value it takes).

Printed: the machine and the versions, the config, then one row a step (the first includes the warm-up of every
kernel and allocator); then the median tokens/s over the steps after the first, TFLOPS at (6N + 12 L T H) FLOPs a
token (the model's work, as `strata train` counts it: the recompute of checkpointing and the causal mask's saving are
not counted; 4/3 of the 6N term ran), the start-up (process start to the first step; DeepSpeed's CPU Adam op, which
torch's extension builder compiles with ninja and the host C++ compiler at first use, is loaded and timed on its own
before the model is built: a load of a few seconds after ds_carry.sh --install built it), the GPU and host peaks,
and last `FIGURE: <peer> tokens/s X, TFLOPS Y, start-up Z s, loss A -> B`. The first step's loss is computed before
any update, from the same weights and tokens: it agrees across peers (a cross-check that they ran the same work).

Exits 77 (SKIP) without CUDA (unless --device cpu, a smoke run at a tiny shape) or when the peer's package cannot
be imported (DeepSpeed on the GPU machine: tools/gpu/ds_carry.sh --install; strata: PYTHONPATH=python and
STRATA_LIB=libstrata.so), 1 when a loss is not finite, 2 on a bad argument.
"""
import argparse
import json
import math
import os
import platform
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PEERS = ("deepspeed-z2", "deepspeed-z3", "strata-torch")
SKIP = 77
GIB = float(1 << 30)


def process_age_s():
    """Seconds since this process started (/proc/self/stat's start time against /proc/uptime), 0 if unknown."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


STARTED = time.perf_counter() - process_age_s()  # the process's start on the perf_counter clock


def parse_size(text):
    """Bytes of "112GiB", "24G", "500MB" or a plain number; "auto" stays "auto"."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "k": 1 << 10, "m": 1 << 20,
             "g": 1 << 30, "t": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "b": 1, "": 1}
    t = text.strip().lower()
    if t == "auto":
        return t
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError("%r is not a size (a number of bytes, or like 24GiB, 500MB), nor auto" % text)
    if value <= 0:
        raise argparse.ArgumentTypeError("%r must be more than 0 bytes" % text)
    return int(value)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", required=True, choices=PEERS)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seq", type=int, default=1024, help="tokens per sequence, and the model's context")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (train_micro_batch_size_per_gpu)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps; the first is not timed into the median")
    ap.add_argument("--warmup", type=int, default=2, help="WarmupLR's warmup_num_steps (DeepSpeed uses at least 2)")
    ap.add_argument("--lr", type=float, default=3e-4, help="the peak learning rate; the warmup starts at lr/warmup, as strata train's")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--checkpointing", choices=("nonreentrant", "reentrant", "off"), default="nonreentrant",
                    help="torch.utils.checkpoint around every block (use_reentrant=False / True), or none")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a smoke run of the code paths (strata's host backend, DeepSpeed's CPU accelerator)")
    ap.add_argument("--strata-device-budget", type=parse_size, default="auto",
                    help="strata.device_budget_bytes: strata's device arena, reserved whole at initialize (auto: "
                    "1.5 x the bf16 parameters + 2 GiB; torch's allocator keeps the rest for the activations)")
    ap.add_argument("--host-budget", type=parse_size, default="auto",
                    help="strata.host_budget_bytes (auto: 7/8 of RAM, 112 GiB of 128)")
    ap.add_argument("--ds-pin-memory", choices=("auto", "true", "false"), default="auto",
                    help="DeepSpeed's offload_optimizer.pin_memory (auto: true where torch pins large blocks at their "
                    "size or the state is small; see above)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE (- for stdout)")
    a = ap.parse_args(argv)
    for name in ("layers", "hidden", "heads", "vocab", "seq", "batch", "warmup"):
        if getattr(a, name) < 1:
            ap.error("--%s = %d must be at least 1" % (name, getattr(a, name)))
    if a.hidden % a.heads:
        ap.error("--heads %d must divide --hidden %d" % (a.heads, a.hidden))
    if a.steps < 2:
        ap.error("--steps %d must be at least 2: the median is over the steps after the first" % a.steps)
    if not (0 < a.lr <= 1):
        ap.error("--lr %g is out of range (0, 1]" % a.lr)
    return a


def skip(why):
    print("SKIP: %s" % why, flush=True)
    sys.exit(SKIP)


def ram_bytes():
    try:
        with open("/proc/meminfo") as f:
            return int(f.read().split("MemTotal:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return 0


def rss_peak_bytes():
    """VmHWM: this process's peak resident memory (pinned host memory included)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return f.read().split("model name")[1].split(":")[1].split("\n")[0].strip()
    except (OSError, IndexError):
        return platform.processor() or "?"


# ---------------------------------------------------------------- the model


def build_model(a, torch, device, dtype):
    """The GPT, on device in dtype, initialised as GPT-2 (normal 0.02; the residual projections 0.02 / sqrt(2 L))
    from a.seed: the same weights in every peer's process."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    kw = dict(device=device, dtype=dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(a.hidden, **kw)
            self.c_attn = nn.Linear(a.hidden, 3 * a.hidden, **kw)
            self.attn_proj = nn.Linear(a.hidden, a.hidden, **kw)
            self.ln_2 = nn.LayerNorm(a.hidden, **kw)
            self.c_fc = nn.Linear(a.hidden, 4 * a.hidden, **kw)
            self.mlp_proj = nn.Linear(4 * a.hidden, a.hidden, **kw)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).view(B, T, 3, a.heads, C // a.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.hidden, **kw)
            self.wpe = nn.Embedding(a.seq, a.hidden, **kw)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.hidden, **kw)
            self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False, **kw)
            self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
            for block in self.h:
                if a.checkpointing == "off" or not torch.is_grad_enabled():
                    x = block(x)
                else:
                    x = checkpoint(block, x, use_reentrant=a.checkpointing == "reentrant")
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))

    torch.manual_seed(a.seed)
    model = GPT()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("_proj.weight",)):
                p.normal_(0.0, 0.02 / math.sqrt(2 * a.layers))
            elif p.dim() == 2:
                p.normal_(0.0, 0.02)
            elif name.startswith("ln") or ".ln_" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                p.zero_()
    return model


def flops_per_token(a, n):
    """The model's FLOPs a token, forward and backward, as strata train counts them (model/gpt_layout.c)."""
    return 6.0 * n + 12.0 * a.layers * a.seq * a.hidden


# ---------------------------------------------------------------- the config


def host_budget(a):
    return a.host_budget if a.host_budget != "auto" else ram_bytes() * 7 // 8


def device_budget(a, n):
    if a.strata_device_budget != "auto":
        return a.strata_device_budget
    return int(math.ceil((1.5 * 2 * n + 2 * GIB) / GIB)) * (1 << 30)


def exact_pinning(torch):
    """(True, the setting) when this torch pins blocks above 64 MiB at their size from now on, else (False, why)."""
    setting = "pinned_max_round_threshold_mb:64"
    why = "this torch has no allocator settings call"
    for fn in (getattr(torch._C, "_accelerator_setAllocatorSettings", None),
               getattr(getattr(torch.cuda, "memory", None), "_set_allocator_settings", None)):
        if fn is None:
            continue
        try:
            fn(setting)
            return True, setting
        except Exception as e:  # noqa: BLE001 -- an older torch refuses the key: say so
            why = str(e).split("\n")[0][:160]
    return False, why


def ds_pin_memory(a, n, exact):
    """(DeepSpeed's pin_memory, why)."""
    if a.ds_pin_memory != "auto":
        return a.ds_pin_memory == "true", "--ds-pin-memory %s" % a.ds_pin_memory
    if exact:
        return True, "torch pins large blocks at their size"
    if 18 * n <= ram_bytes() / 4:
        return True, "18N = %.1f GiB fits a quarter of the RAM, rounded or not" % (18 * n / GIB)
    return False, ("torch rounds pinned blocks to powers of two, and DeepSpeed's 18N = %.1f GiB of host state would "
                   "outgrow %.0f GiB of RAM pinned so" % (18 * n / GIB, ram_bytes() / GIB))


def ds_config(a, n, pin=True):
    """The one config both engines get (pin: DeepSpeed's offload_optimizer.pin_memory)."""
    stage = 3 if a.peer == "deepspeed-z3" else 2
    return {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1 << 30,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": a.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": a.lr / a.warmup, "warmup_max_lr": a.lr, "warmup_num_steps": a.warmup,
                                 "warmup_type": "linear"}},
        "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu", "pin_memory": pin},
                              "overlap_comm": True, "contiguous_gradients": True},
        "strata": {"device_budget_bytes": device_budget(a, n), "host_budget_bytes": host_budget(a)},
    }


# ---------------------------------------------------------------- the peers


def import_peer(a):
    """(module, version words) of the peer's package, or SKIP."""
    if a.peer.startswith("deepspeed"):
        try:
            import deepspeed
        except Exception as e:  # noqa: BLE001 -- any failure to import is a reason to skip
            skip("deepspeed cannot be imported (%s: %s); on the GPU machine: tools/gpu/ds_carry.sh --install "
                 ".gpu/deepspeed /tmp/site && export PYTHONPATH=/tmp/site:$PYTHONPATH" % (type(e).__name__, e))
        return deepspeed, "deepspeed %s (%s)" % (deepspeed.__version__, os.path.dirname(deepspeed.__file__))
    sys.path.insert(0, os.path.join(REPO, "python"))
    try:
        import strata
        import strata.torch
        words = "strata %s (%s)" % (strata.version(), strata.library_path()[0])
    except Exception as e:  # noqa: BLE001
        skip("strata.torch cannot be imported (%s: %s); set PYTHONPATH=%s/python and STRATA_LIB to a libstrata.so "
             "(built with CUDA for --device cuda)" % (type(e).__name__, e, REPO))
    return strata, words


def build_cpu_adam():
    """Seconds to build (or load from torch's extension cache) DeepSpeed's CPU Adam op, before anything is timed."""
    from deepspeed.ops.op_builder import CPUAdamBuilder
    t0 = time.perf_counter()
    CPUAdamBuilder().load(verbose=False)
    return time.perf_counter() - t0


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_engine(a, pkg, model, config):
    """(engine, what to call for the lr of the next step)."""
    if a.peer.startswith("deepspeed"):
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                           ("MASTER_PORT", str(free_port()))):
            os.environ.setdefault(key, value)
        engine, optimizer, _, _ = pkg.initialize(model=model, model_parameters=model.parameters(), config=config)
        return engine, lambda: optimizer.param_groups[0]["lr"]
    engine, optimizer, _, _ = pkg.torch.initialize(model=model, config=config, device=a.device)
    return engine, lambda: optimizer.param_groups[0]["lr"]


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError as e:
        skip("PyTorch cannot be imported by %s (%s)" % (sys.executable, e))
    if a.device == "cuda" and not torch.cuda.is_available():
        skip("no CUDA device (torch %s, built for CUDA %s); --device cpu runs the code paths on the CPU" % (
            torch.__version__, torch.version.cuda))
    pkg, words = import_peer(a)
    cuda = a.device == "cuda"
    gpu = "GPU %s (%.0f GiB)" % (torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory / GIB) \
        if cuda else "no GPU (--device cpu)"
    print("machine: %s, %s, %d cores, %.0f GiB RAM, Linux %s; %s" % (
        platform.node(), cpu_name(), len(os.sched_getaffinity(0)), ram_bytes() / GIB, platform.release(), gpu))
    print("build:   python %s, torch %s (CUDA %s); %s" % (platform.python_version(), torch.__version__,
                                                        torch.version.cuda, words))
    n = (a.vocab + a.seq) * a.hidden + a.layers * (12 * a.hidden * a.hidden + 13 * a.hidden) + 2 * a.hidden
    tokens = a.batch * a.seq
    exact, pin_words = exact_pinning(torch)
    pin, pin_why = ds_pin_memory(a, n, exact) if a.peer.startswith("deepspeed") else (True, "strata pins its buffers")
    config = ds_config(a, n, pin)
    print("model:   GPT %d layers, hidden %d, %d heads, vocab %d, context %d: %d parameters (embeddings tied); bf16, "
          "checkpointing %s; batch %d x %d = %d tokens/step; %d steps; seed %d; %.4g FLOPs/token (6N + 12LTH)" % (
              a.layers, a.hidden, a.heads, a.vocab, a.seq, n, a.checkpointing, a.batch, a.seq, tokens, a.steps,
              a.seed, flops_per_token(a, n)))
    print("config:  %s" % json.dumps(config, sort_keys=True))
    print("pinning: torch's pinned allocator %s; offload_optimizer.pin_memory %s (%s)" % (
        "set to %s" % pin_words if exact else "rounds to powers of two (%s)" % pin_words,
        "true" if pin else "false", pin_why))
    if a.peer == "strata-torch":
        cfg = pkg.Config(config)
        defaults = pkg.Config(None).resolved
        print("strata:  resolved, where not the default: %s" % ", ".join(
            "%s=%s" % (k, json.dumps(v)) for k, v in sorted(cfg.resolved.items()) if defaults.get(k) != v))
    sys.stdout.flush()

    report = dict(peer=a.peer, machine=dict(gpu=torch.cuda.get_device_name() if cuda else None,
                                            cores=len(os.sched_getaffinity(0)), ram_bytes=ram_bytes()),
                  torch=torch.__version__, engine=words, parameters=n, tokens_per_step=tokens, config=config,
                  torch_exact_pinning=exact, pin_memory_why=pin_why,
                  shape=dict(layers=a.layers, hidden=a.hidden, heads=a.heads, vocab=a.vocab, seq=a.seq,
                             batch=a.batch, checkpointing=a.checkpointing, seed=a.seed))
    if a.peer.startswith("deepspeed"):
        report["cpu_adam_build_s"] = build_cpu_adam()
        print("DeepSpeedCPUAdam: op built or loaded in %.1f s (ninja, %s)" % (
            report["cpu_adam_build_s"], os.environ.get("CXX", "c++")), flush=True)

    device = torch.device(a.device)
    t0 = time.perf_counter()
    model = build_model(a, torch, device, torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == n, "the parameter count formula disagrees with the model"
    t1 = time.perf_counter()
    engine, lr_now = start_engine(a, pkg, model, config)
    t2 = time.perf_counter()
    report.update(model_build_s=t1 - t0, initialize_s=t2 - t1)
    print("start:   model built in %.1f s, %s.initialize in %.1f s" % (
        t1 - t0, "deepspeed" if a.peer.startswith("deepspeed") else "strata.torch", t2 - t1), flush=True)

    gen = torch.Generator().manual_seed(a.seed + 1)
    data = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq + 1), generator=gen)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    engine.train()
    hdr = "%5s %10s %10s %9s %10s %8s"
    print(hdr % ("step", "loss", "lr", "seconds", "tokens/s", "TFLOPS"))
    rows, startup_s = [], None
    for step in range(a.steps):
        x = data[step, :, :-1].to(device)
        y = data[step, :, 1:].to(device)
        lr = lr_now()
        sync()
        begin = time.perf_counter()
        if startup_s is None:
            startup_s = begin - STARTED
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        value = float(loss.item())
        sync()
        dt = time.perf_counter() - begin
        row = dict(step=step, loss=value, lr=lr, seconds=dt, tokens_per_s=tokens / dt,
                   tflops=tokens / dt * flops_per_token(a, n) / 1e12)
        rows.append(row)
        print(hdr % (step, "%.4f" % value, "%.3e" % lr, "%.3f" % dt, "%.1f" % row["tokens_per_s"],
                     "%.2f" % row["tflops"]), flush=True)

    timed = rows[1:]
    tps = statistics.median(r["tokens_per_s"] for r in timed)
    tflops = tps * flops_per_token(a, n) / 1e12
    gpu_mem = {}
    if cuda:
        gpu_mem = dict(torch_allocated_peak_bytes=torch.cuda.max_memory_allocated(),
                       torch_reserved_peak_bytes=torch.cuda.max_memory_reserved())
    if a.peer == "strata-torch":
        st = engine.stats()
        gpu_mem.update(strata_arena_peak_bytes=st["device_peak_bytes"], strata_arena_bytes=st["device_budget_bytes"])
        report["strata_stats"] = {k: v for k, v in st.items() if isinstance(v, (int, float))}
    used = gpu_mem.get("torch_allocated_peak_bytes", 0) + gpu_mem.get("strata_arena_peak_bytes", 0)
    held = gpu_mem.get("torch_reserved_peak_bytes", 0) + gpu_mem.get("strata_arena_bytes", 0)
    finite = all(math.isfinite(r["loss"]) for r in rows)
    report.update(steps=rows, tokens_per_s=tps, tflops=tflops, tflops_6n=tps * 6.0 * n / 1e12, startup_s=startup_s,
                  gpu_peak_used_bytes=used, gpu_peak_held_bytes=held, gpu_memory=gpu_mem,
                  host_peak_rss_bytes=rss_peak_bytes(), loss_first=rows[0]["loss"], loss_last=rows[-1]["loss"],
                  finite=finite)
    where = "no GPU"
    if cuda:
        arena = ""
        if "strata_arena_bytes" in gpu_mem:
            arena = "; strata's arena %.2f of %.2f GiB" % (gpu_mem["strata_arena_peak_bytes"] / GIB,
                                                        gpu_mem["strata_arena_bytes"] / GIB)
        where = "GPU peak %.2f GiB used, %.2f GiB held (torch's allocator %.2f / %.2f GiB%s)" % (
            used / GIB, held / GIB, gpu_mem["torch_allocated_peak_bytes"] / GIB,
            gpu_mem["torch_reserved_peak_bytes"] / GIB, arena)
    print("summary: %s: median of steps 1-%d %.1f tokens/s, %.2f TFLOPS ((6N + 12LTH) x tokens/s; recompute not "
          "counted; %.2f at 6N alone); start-up %.1f s (process start to the first step)%s; %s; host peak RSS "
          "%.1f GiB" % (a.peer, a.steps - 1, tps, tflops, report["tflops_6n"], startup_s,
                        ", the CPU Adam op's build or load %.1f s of it" % report["cpu_adam_build_s"]
                        if "cpu_adam_build_s" in report else "", where, report["host_peak_rss_bytes"] / GIB))
    if a.json:
        text = json.dumps(report, sort_keys=True)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    print("FIGURE: %s tokens/s %.1f, TFLOPS %.2f, start-up %.1f s, loss %.4f -> %.4f" % (
        a.peer, tps, tflops, startup_s, rows[0]["loss"], rows[-1]["loss"]), flush=True)
    if a.peer == "strata-torch":
        engine.close()
    if not finite:
        print("FAIL: a loss is not finite: %s" % ", ".join("%.4g" % r["loss"] for r in rows))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

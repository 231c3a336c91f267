#!/usr/bin/env python3
"""A pretrained ~7B Llama to its first training step: streamed into strata's tiers, or loaded whole first (issue 38's
GPU item).

    python3 benchmarks/zero_init_gpu.py --dir /var/tmp/zg [--device cuda] [--json FILE]

First a random Llama of --layers x --hidden (Llama-2-7B's shape by default) is written in bf16 as Hugging Face's
sharded safetensors under --dir/ckpt (built under strata.torch.zero_init and saved with save_pretrained; not timed).
Then each route runs in its own process, so its peak RSS (VmHWM) is its own:
  streamed  accelerate's init_empty_weights + from_config (no values; without accelerate, built under zero_init),
            strata.torch.load_pretrained (a source per tensor, or in place chunk by chunk), strata.torch.initialize
            reading each tensor chunk by chunk into strata's tiers;
  plain     transformers' from_pretrained (the whole model in host memory), then strata.torch.initialize.
Both train one step of --batch x --seq random tokens with the parameters on --device in bf16 (offload_param none)
and the optimizer state in host memory (offload_optimizer cpu), ZeRO stage 3, each module's update in backward, and
give the same loss (checked: they
are the same weights). Printed: the machine and the config, one row per route (seconds to the model, to initialize,
the first step, start to the first step's end; peak RSS), and the plain route's peak RSS over the streamed one's.
On this 24 GiB machine the default shape does not fit the plain route: run it on the GPU machine (128 GiB), or with
a smaller --layers here (--device cpu: the host backend) to check the script. Exits 1 when the losses differ.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
from zero_init_big import GIB, add_shape_args, find_transformers_or_skip, llama_config, ram_bytes, status  # noqa: E402


def engine_config(a):
    """The optimizer's 12 bytes a parameter in host memory (81 GB at 6.74B) need a host budget above strata's default
    3/4 of the RAM, and the step in backward spares the gradient store's 4 more."""
    return {"train_micro_batch_size_per_gpu": a.batch, "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
            "zero_optimization": {"stage": 3, "offload_param": {"device": "none"},
                                  "offload_optimizer": {"device": "cpu"}},
            "strata": {"step_in_backward": True, "host_budget_bytes": int(ram_bytes() * 7 / 8)}}


def write_checkpoint(a, where):
    import torch
    import transformers
    import strata.torch
    torch.manual_seed(a.seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with strata.torch.zero_init(staging_dir=a.dir):
            model = transformers.LlamaForCausalLM(llama_config(a))
    finally:
        torch.set_default_dtype(default)
    model.save_pretrained(where, safe_serialization=True, max_shard_size="2GB")
    return sum(p.numel() for p in model.parameters())


def route(a, where):
    """One route in this process: its timings and peak RSS as JSON on the last line."""
    import torch
    import transformers
    import strata.torch
    t0 = time.time()
    if a.route_child == "streamed":
        config = transformers.AutoConfig.from_pretrained(where)
        try:
            import accelerate
            with accelerate.init_empty_weights():  # no values at all: each parameter gets a source
                model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
        except ImportError:  # built on disk instead, then overwritten chunk by chunk
            with strata.torch.zero_init(staging_dir=a.dir):
                model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
        strata.torch.load_pretrained(model, where)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(where, torch_dtype=torch.bfloat16)
    t1 = time.time()
    engine, _, _, _ = strata.torch.initialize(model=model, config=engine_config(a), device=a.device)
    t2 = time.time()
    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(a.device)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    value = loss.item()
    t3 = time.time()
    engine.close()
    print(json.dumps({"route": a.route_child, "model_s": t1 - t0, "initialize_s": t2 - t1, "step_s": t3 - t2,
                      "to_first_step_s": t3 - t0, "peak_rss": status("VmHWM:"), "loss": value}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="checkpoint and staging directory (emptied first; removed after)")
    add_shape_args(ap)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cuda", help="where the parameters and the compute go: cuda or cpu")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--route-child", choices=("streamed", "plain"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    find_transformers_or_skip()
    where = os.path.join(a.dir, "ckpt")
    if a.route_child:
        return route(a, where)
    import torch
    import transformers
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("SKIP: --device %s but torch sees no GPU (run it on the GPU machine, or --device cpu)" % a.device)
        return 77
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    gpu = (", GPU %s" % torch.cuda.get_device_name()) if a.device.startswith("cuda") else ""
    print("machine: %d cores, %.1f GiB RAM%s; torch %s, transformers %s" % (
        len(os.sched_getaffinity(0)), ram_bytes() / GIB, gpu, torch.__version__, transformers.__version__))
    print("model:   LlamaForCausalLM %d layers x %d (intermediate %d, %d heads, vocab %d), bf16 safetensors; "
          "batch %d x %d on %s" % (a.layers, a.hidden, a.intermediate, a.heads, a.vocab, a.batch, a.seq, a.device))
    print("config:  %s" % json.dumps(engine_config(a)))
    t = time.time()
    n = write_checkpoint(a, where)
    print("checkpoint: %d parameters (%.2f GiB in bf16) written in %.1f s (not timed below)" % (
        n, n * 2 / GIB, time.time() - t))
    fmt = "%-9s %9s %12s %11s %15s %12s %10s"
    print(fmt % ("route", "model s", "initialize s", "1st step s", "to 1st step s", "peak RSS", "loss"))
    out = {"params": n, "routes": {}}
    for name in ("streamed", "plain"):
        cmd = [sys.executable, os.path.abspath(__file__), "--route-child", name] + sys.argv[1:]
        res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, STRATA_BENCH_REEXEC="1"))
        lines = res.stdout.strip().splitlines()
        if res.returncode != 0 or not lines:
            r = {"route": name, "error": "rc %d: %s" % (res.returncode, res.stderr.strip()[-400:])}
            print("%-9s failed: %s" % (name, r["error"]))
        else:
            r = json.loads(lines[-1])
            print(fmt % (name, "%.1f" % r["model_s"], "%.1f" % r["initialize_s"], "%.1f" % r["step_s"],
                         "%.1f" % r["to_first_step_s"], "%.2f GiB" % (r["peak_rss"] / GIB), "%.5f" % r["loss"]))
        out["routes"][name] = r
        sys.stdout.flush()
    s, p = out["routes"]["streamed"], out["routes"]["plain"]
    same = "loss" in s and "loss" in p and s["loss"] == p["loss"]
    if "peak_rss" in s and "peak_rss" in p:
        print("peak RSS plain / streamed: %.2f; start to first step plain / streamed: %.2f; the same loss: %s" % (
            p["peak_rss"] / s["peak_rss"], p["to_first_step_s"] / s["to_first_step_s"], same))
        print("FIGURE: peak RSS streamed %.1f GiB, plain %.1f GiB; to the first step %.0f s / %.0f s; same loss %s" % (
            s["peak_rss"] / GIB, p["peak_rss"] / GIB, s["to_first_step_s"], p["to_first_step_s"], same))
    shutil.rmtree(a.dir, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

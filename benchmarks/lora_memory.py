#!/usr/bin/env python3
"""LoRA fine-tuning with the frozen base offloaded by strata, against the base kept whole in memory.

A Llama of --layers x --hidden (transformers' LlamaForCausalLM, random weights from --seed) gets peft's LoRA
(r=--rank on q_proj and v_proj) and trains --steps steps of --batch x --seq tokens (the first --warmup-steps not
timed), AdamW lr 1e-3, in four runs, each a process of its own (this script with --run), the same weights and data:
  torch        torch + peft, everything in memory: the base whole, torch.optim.AdamW over the adapter
  strata-dev   strata.torch.initialize with no offload: the base whole in strata's device arena ("offload off")
  strata-host  the base on the host tier (offload_param cpu), the adapter's optimizer state there too, a device
               budget of --budget-frac of the base: the device holds the fetched window only
  strata-nvme  the base and the adapter's optimizer state on NVMe (under --dir), strata.host_cache off (every fetch
               read from the drive), the same device budget
The four alternate for --rounds rounds (the machine is shared). Per run: tokens/s over the timed steps, the median
over the rounds, and the median of the per-round ratios to torch's; the host peak of the training phase above the
interpreter's own memory (VmHWM, reset once the model is set up and its freed memory handed back with malloc_trim,
less the RSS after the imports: building the model in memory first does not count); strata's own peaks (strata_stats
host_peak_bytes and device_peak_bytes); NVMe bytes read per step; #wrong: adapter elements further than --tol from
torch's after the steps (the runs agree up to Adam's amplification of one rounding of its sqrt where torch's CPU
sqrt is not IEEE's; a wrong update is off by about lr).
What must be resident, computed from the model's shapes: on the device (strata's arena, host memory on the host
backend), one unit with its adapter gradients while it computes (the largest unit: a decoder layer, or the embedding
or head), so the offloaded runs' device peak is held against that (plus what prefetching adds, up to
--prefetch-mib); on the host, the base and the adapter's states (weights, gradients, Adam's two moments: 16 bytes an
element) for the runs that keep the base there; the NVMe run keeps both on the drive and holds strata's staging.

    build/venv-current/bin/python benchmarks/lora_memory.py [--json] [--layers 12] [--hidden 768] [--steps 6] ...

Needs torch, transformers and peft (build/venv-current has them; started without peft, the script re-runs itself
there, or says SKIP), and the strata package of this checkout with build/'s libstrata.so (or $STRATA_LIB). Exits 1
when a #wrong is not 0.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VENV = os.path.join(REPO, "build", "venv-current", "bin", "python")
RUNS = ("torch", "strata-dev", "strata-host", "strata-nvme")
LR = 1e-3
MiB = 2.0 ** 20


def find_peft_or_skip():
    try:
        import peft  # noqa: F401
        import transformers  # noqa: F401
        return
    except ImportError:
        pass
    if os.path.exists(VENV) and os.path.realpath(VENV) != os.path.realpath(sys.executable) and \
            not os.environ.get("STRATA_BENCH_PEFT_REEXEC"):
        os.execve(VENV, [VENV] + sys.argv, dict(os.environ, STRATA_BENCH_PEFT_REEXEC="1"))
    print("SKIP: %s cannot import peft and transformers, nor can %s (tools/run makes that venv)" % (
        sys.executable, VENV))
    sys.exit(0)


def trim():
    """Hands the C heap's free memory back to the OS (glibc's malloc_trim), so RSS shows what is held."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def build(a):
    """The LoRA model (seeded) and the names of its trained parameters."""
    import peft
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(a.seed)
    config = transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                                      num_attention_heads=a.heads, num_key_value_heads=a.heads,
                                      intermediate_size=a.intermediate, max_position_embeddings=a.seq)
    base = transformers.LlamaForCausalLM(config)
    model = peft.get_peft_model(base, peft.LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0,
                                                      target_modules=["q_proj", "v_proj"]))
    model.train()
    return model


def sizes(a):
    """What the model holds, from its shapes (bytes, fp32)."""
    h, i, v, kv = a.hidden, a.intermediate, a.vocab, a.hidden  # num_key_value_heads = heads
    layer = 4 * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h)
    adapter_layer = 4 * a.rank * (h + h + h + kv)  # q: A r x h, B h x r; v: A r x h, B kv x r
    embed = 4 * v * h
    base = a.layers * layer + 2 * embed + 4 * h
    adapter = a.layers * adapter_layer
    largest = max(layer, embed)
    return dict(base_bytes=base, layer_bytes=layer, embed_bytes=embed, adapter_elements=adapter // 4,
                adapter_layer_bytes=adapter_layer, largest_unit_bytes=largest,
                device_floor_bytes=largest + adapter_layer, adapter_state_bytes=4 * adapter)


def config(a, run, budget):
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    strata = {"prefetch_bytes": a.prefetch_mib << 20}
    if run == "strata-host":
        zero.update(offload_param={"device": "cpu"}, offload_optimizer={"device": "cpu"})
        strata["device_budget_bytes"] = budget
    elif run == "strata-nvme":
        d = os.path.join(a.dir, "nvme")
        zero.update(offload_param={"device": "nvme", "nvme_path": d}, offload_optimizer={"device": "nvme",
                                                                                         "nvme_path": d})
        strata.update(device_budget_bytes=budget, host_cache=False)
    return {"zero_optimization": zero, "strata": strata,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                                       "weight_decay": 0.0}}}


def one_run(a):
    """This process's run (--run): prints one JSON line."""
    import gc
    import torch
    sys.path.insert(0, os.path.join(REPO, "python"))
    sys.path.insert(0, HERE)
    from torch_offload import peak_rss_reset, rss_bytes
    torch.set_num_threads(a.threads or len(os.sched_getaffinity(0)))
    import peft  # noqa: F401  # the imports' memory is the runtime's, before anything is built
    import strata.torch  # noqa: F401
    runtime_rss = rss_bytes("VmRSS")
    model = build(a)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    engine = None
    budget = int(sizes(a)["base_bytes"] * a.budget_frac)
    if a.run == "torch":
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.0)
    else:
        engine = strata.torch.initialize(model=model, config=config(a, a.run, budget), device="cpu")[0]
    gc.collect()
    trim()
    setup_hwm = rss_bytes("VmHWM")
    peak_rss_reset()
    start_rss = rss_bytes("VmRSS")
    g = torch.Generator().manual_seed(a.seed)
    times, losses, nvme = [], [], []
    for step in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        before = engine.stats() if engine else None
        t0 = time.perf_counter()
        if engine is None:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if engine:
            nvme.append(engine.stats()["nvme_to_host_bytes"] - before["nvme_to_host_bytes"])
    out = dict(run=a.run, times=times, losses=losses, setup_hwm=setup_hwm, start_rss=start_rss, runtime_rss=runtime_rss,
               train_hwm=rss_bytes("VmHWM"), budget=budget if a.run in ("strata-host", "strata-nvme") else None)
    if engine is None:
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    else:
        st = engine.stats()
        out.update(device_peak=st["device_peak_bytes"], host_peak=st["host_peak_bytes"],
                   nvme_per_step=statistics.median(nvme[a.warmup_steps:]), placement=engine.engine.placement()["param"],
                   stall_ms=st["stall_ns"] / 1e6, empty=all(p.numel() == 0 for p in model.parameters()))
        sd = engine.fp32_state_dict()
        weights = {n: sd[n] for n in trained}
        engine.close()
    torch.save(weights, os.path.join(a.dir, "%s-%d.pt" % (a.run, a.round)))
    print("RESULT " + json.dumps(out))


def launch(a, run, round_):
    a = argparse.Namespace(**dict(vars(a), round=round_))
    args = [sys.executable, os.path.abspath(__file__), "--run", run] + [
        "--%s=%s" % (k.replace("_", "-"), v) for k, v in vars(a).items()
        if k not in ("run", "json", "rounds") and v is not None]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    if p.returncode or not lines:
        raise SystemExit("run %s failed (exit %d):\n%s" % (run, p.returncode, p.stdout[-3000:]))
    return json.loads(lines[-1][len("RESULT "):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON object at the end")
    ap.add_argument("--run", choices=RUNS, help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the four runs, alternated")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup-steps", type=int, default=2, help="first steps excluded from the timing")
    ap.add_argument("--budget-frac", type=float, default=0.25, help="device budget of the offloaded runs, as a "
                    "fraction of the base's bytes")
    ap.add_argument("--prefetch-mib", type=int, default=8, help="strata.prefetch_bytes, in MiB")
    ap.add_argument("--threads", type=int, help="torch's CPU threads (default: all cores)")
    ap.add_argument("--tol", type=float, default=1e-4, help="#wrong: adapter elements further than this from torch's")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--dir", default=os.path.join(REPO, "build", "scratch", "lora_memory"),
                    help="the NVMe tier's directory and the runs' weight files")
    a = ap.parse_args()
    if a.steps <= a.warmup_steps:
        ap.error("--steps %d must exceed --warmup-steps %d" % (a.steps, a.warmup_steps))
    find_peft_or_skip()
    if a.run:
        return one_run(a)
    import peft
    import torch
    import transformers
    sys.path.insert(0, os.path.join(REPO, "python"))
    sys.path.insert(0, HERE)
    import strata
    from torch_offload import machine_line
    os.makedirs(a.dir, exist_ok=True)
    s = sizes(a)
    budget = int(s["base_bytes"] * a.budget_frac)
    print(machine_line(torch, "cpu"))
    print("build:   torch %s, transformers %s, peft %s (%s); strata %s (%s)" % (
        torch.__version__, transformers.__version__, peft.__version__, sys.executable, strata.version(),
        strata.library_path()[0]))
    print("model:   Llama %d layers x hidden %d (intermediate %d, %d heads, vocab %d): base %.1f MiB fp32 (a layer "
          "%.1f MiB, embedding and head %.1f MiB each); LoRA r=%d on q_proj, v_proj: %d elements" % (
              a.layers, a.hidden, a.intermediate, a.heads, a.vocab, s["base_bytes"] / MiB, s["layer_bytes"] / MiB,
              s["embed_bytes"] / MiB, a.rank, s["adapter_elements"]))
    print("train:   %d steps of %d x %d tokens (the first %d not timed), AdamW lr %g, seed %d, torch threads %s" % (
        a.steps, a.batch, a.seq, a.warmup_steps, LR, a.seed, a.threads or len(os.sched_getaffinity(0))))
    for run in RUNS[1:]:
        print("config:  %-11s %s" % (run, json.dumps(config(a, run, budget))))
    print("resident: device floor %.1f MiB (the largest unit %.1f MiB and a layer's adapter gradients %.2f MiB); "
          "host floor with the base in memory %.1f MiB (the base and the adapter's states, %.2f MiB = 16 B x %d)" % (
              s["device_floor_bytes"] / MiB, s["largest_unit_bytes"] / MiB, s["adapter_layer_bytes"] / MiB,
              (s["base_bytes"] + s["adapter_state_bytes"]) / MiB, s["adapter_state_bytes"] / MiB,
              s["adapter_elements"]))
    print()
    rounds = {run: [] for run in RUNS}
    for r in range(a.rounds):
        for run in RUNS:
            rounds[run].append(launch(a, run, r))

    def tps(res):
        return a.batch * a.seq / statistics.median(res["times"][a.warmup_steps:])
    ref = torch.load(os.path.join(a.dir, "torch-0.pt"))
    hdr = "%-5s %-12s %9s %7s %10s %11s %11s %10s %10s %10s %7s %6s"
    print(hdr % ("round", "run", "tokens/s", "/torch", "host peak", "strata host", "device peak", "dev floor",
                 "dev budget", "NVMe rd/st", "losses", "#wrong"))
    mib = lambda v, f="%.0f MiB": "-" if v is None else f % (v / MiB)  # noqa: E731
    wrong_total, summary = 0, {run: dict(wrong=0, max_diff=0.0) for run in RUNS}
    for i in range(a.rounds):
        want = rounds["torch"][i]["losses"]
        for run in RUNS:
            res = rounds[run][i]
            got = torch.load(os.path.join(a.dir, "%s-%d.pt" % (run, i)))
            wrong = sum(int(((got[n] - w).abs() > a.tol).sum()) for n, w in ref.items())
            summary[run]["wrong"] += wrong
            summary[run]["max_diff"] = max([summary[run]["max_diff"]] +
                                           [float((got[n] - w).abs().max()) for n, w in ref.items()])
            wrong_total += wrong
            same = "same" if res["losses"] == want else "%.2g" % max(
                abs(u - v) / abs(v) for u, v in zip(res["losses"], want))
            res.update(tokens_per_s=tps(res), ratio=tps(res) / tps(rounds["torch"][i]),
                       host_peak_above_runtime=res["train_hwm"] - res["runtime_rss"])
            offloaded = run in ("strata-host", "strata-nvme")
            print(hdr % (i, run, "%.1f" % res["tokens_per_s"], "%.3f" % res["ratio"],
                         mib(res["host_peak_above_runtime"]), mib(res.get("host_peak")),
                         mib(res.get("device_peak"), "%.1f MiB"),
                         mib(s["device_floor_bytes"] if offloaded else None, "%.1f MiB"),
                         mib(res["budget"], "%.1f MiB"), mib(res.get("nvme_per_step"), "%.1f MiB"), same, wrong))
    for run in RUNS:
        res = rounds[run]
        summary[run].update(tokens_per_s=statistics.median(x["tokens_per_s"] for x in res),
                            ratio=statistics.median(x["ratio"] for x in res),
                            host_peak_above_runtime=max(x["host_peak_above_runtime"] for x in res),
                            params_empty_between_steps=all(x.get("empty", True) for x in res))
        print(hdr % ("med", run, "%.1f" % summary[run]["tokens_per_s"], "%.3f" % summary[run]["ratio"],
                     mib(summary[run]["host_peak_above_runtime"]), "", "", "", "", "", "", summary[run]["wrong"]))
    print("host peak: VmHWM of the training phase less the RSS after the imports (runtime %s MiB; the setup's own "
          "peaks: %s); strata host / device peak: strata_stats host_peak_bytes / device_peak_bytes; dev floor: one unit "
          "and its adapter gradients; losses: 'same' as torch's in that round, or the largest relative difference; "
          "#wrong: adapter elements off by more than %g from torch's (largest difference: %s); med: the median over "
          "the %d rounds (host peak: the largest)" % (
              "/".join("%.0f" % (rounds[run][-1]["runtime_rss"] / MiB) for run in RUNS),
              ", ".join("%s %.0f MiB" % (run, max(x["setup_hwm"] for x in rounds[run]) / MiB) for run in RUNS),
              a.tol, ", ".join("%s %.2g" % (run, summary[run]["max_diff"]) for run in RUNS[1:]), a.rounds))
    full = [run for run in RUNS if not summary[run]["params_empty_between_steps"]]
    if full:
        print("WRONG: the model's parameters held storage between steps in %s" % ", ".join(full))
        wrong_total += 1
    if a.json:
        print(json.dumps(dict(sizes=s, summary=summary, rounds=rounds, torch=torch.__version__,
                              peft=peft.__version__, seed=a.seed)))
    shutil.rmtree(a.dir, ignore_errors=True)
    return 1 if wrong_total else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Train the small GPT of model.py: AdamW, warmup + cosine learning rate, gradient accumulation, checkpoints.

train_torch.py does it in plain PyTorch; train_strata.py is the same script through strata, with the parameters and
the AdamW state on NVMe (ds_config.json): `diff -u train_torch.py train_strata.py` shows every change.

    /usr/bin/python3 examples/gpt/train_torch.py --steps 100       # Debian's interpreter: the one with torch
    /usr/bin/python3 examples/gpt/train_strata.py --steps 100
    mpirun -np 2 /usr/bin/python3 examples/gpt/train_strata.py     # ZeRO-3 across 2 ranks
"""
import argparse
import json
import math
import os
import sys
import time

import torch

from data import REPO, Batches, load_corpus
from model import GPT, GPTConfig

try:
    import strata.torch  # the installed package (pip install ./python, see the README)
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))  # else this checkout's
    import strata.torch  # noqa: E402


def warmup_cosine(warmup, steps, min_ratio=0.1):
    """The learning-rate factor of step s: linear over the first `warmup` steps, then a cosine down to min_ratio."""
    def factor(s):
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--block", type=int, default=128, help="context length in tokens (bytes)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    ap.add_argument("--warmup", type=int, default=10, help="warmup steps")
    ap.add_argument("--decay-steps", type=int, help="length of the schedule (default: --steps)")
    ap.add_argument("--data", metavar="FILE", help="a byte stream (default: README.md + docs/*.md)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--save", metavar="DIR", help="write a checkpoint into DIR at the end")
    ap.add_argument("--resume", metavar="DIR", help="continue from the checkpoint in DIR")
    ap.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "ds_config.json"))
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(block_size=args.block, n_layer=args.layers, n_head=args.heads, n_embd=args.embd))
    n_params = sum(p.numel() for p in model.parameters())
    model.to(args.device)
    with open(args.config) as f:
        config = json.load(f)
    config["optimizer"]["params"]["lr"] = args.lr  # the command line wins, as in train_torch.py
    config["gradient_accumulation_steps"] = args.grad_accum
    engine, _, _, _ = strata.torch.initialize(model=model, config=config)
    optimizer = engine.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, args.decay_steps or args.steps))
    batches = Batches(load_corpus(args.data), args.block, args.batch, args.seed, engine.rank, engine.world_size,
                      device=args.device)
    tokens_per_step = args.batch * args.block * args.grad_accum * engine.world_size
    log = print if engine.rank == 0 else (lambda *a: None)
    log("model: %d parameters, %d layers, %d heads, embd %d, block %d; %d tokens per step (%d x %d x %d x %d); %s" % (
        n_params, args.layers, args.heads, args.embd, args.block, tokens_per_step,
        args.batch, args.block, args.grad_accum, engine.world_size, args.device))

    start = 0
    if args.resume:
        _, client_state = engine.load_checkpoint(args.resume)
        start = client_state["step"]
        scheduler.load_state_dict(client_state["scheduler"])
        batches.skip(start * args.grad_accum)
        log("resumed from %s at step %d" % (args.resume, start))

    engine.train()
    timed_s, timed_tokens = 0.0, 0
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        loss_sum, lr = 0.0, optimizer.param_groups[0]["lr"]
        for micro in range(args.grad_accum):
            x, y = batches.next()
            loss = engine(x, y)
            engine.backward(loss)  # scaled by 1 / gradient_accumulation_steps
            engine.step()  # steps at the accumulation boundary only
            loss_sum += loss.item()
        scheduler.step()
        loss_sum = engine.comm.allreduce_sum([loss_sum])[0] / engine.world_size  # the world's mean, as one rank sees
        dt = time.perf_counter() - t0
        if step > start:  # the first step warms up
            timed_s, timed_tokens = timed_s + dt, timed_tokens + tokens_per_step
        if step % args.log_every == 0 or step == args.steps - 1:
            log("step %5d | loss %.4f | lr %.2e | %.0f ms | %.0f tokens/s" % (
                step, loss_sum / args.grad_accum, lr, dt * 1e3, tokens_per_step / dt))

    if timed_s:
        log("%.0f tokens/s over steps %d..%d" % (timed_tokens / timed_s, start + 1, args.steps - 1))
    st = engine.stats()
    # NVMe is the home of parameters and optimizer state; the host cache keeps what fits the host budget in memory
    # and holds its updates there, so a model this small is read from and written to the drive rarely or never.
    log("strata: NVMe read %.1f MB, written %.1f MB (host cache %.1f MB, read %.1f MB from it, %.1f MB of writes "
        "held); stalled %.1f s; device peak %.1f MiB of %.1f MiB" % (
            st["nvme_to_host_bytes"] / 1e6, st["host_to_nvme_bytes"] / 1e6, st["host_cache_bytes"] / 1e6,
            st["host_cache_read_bytes"] / 1e6, st["host_cache_held_bytes"] / 1e6, st["stall_ns"] / 1e9,
            st["device_peak_bytes"] / 2**20,
            st["device_budget_bytes"] / 2**20))
    if args.save:
        client_state = {"step": args.steps, "scheduler": scheduler.state_dict()}
        log("saved %s" % engine.save_checkpoint(args.save, client_state=client_state))
    engine.close()


if __name__ == "__main__":
    main()

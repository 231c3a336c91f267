"""python3 -m strata check FILE [--world-size N]: a config as strata.torch reads it.

`strata config check` is the C tool's view, where the trainer's keys (gradient_accumulation_steps, the batch sizes,
scheduler) are `strata train` flags and so refused in a file. This checks the whole file the way the Python engine
takes it: the engine's keys by libstrata (the same messages), the trainer's keys by the package, the NVMe
directories. Prints every problem and exits 2, or prints the resolution and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import library_path
from .config import Config
from .errors import StrataError


def check(path: str, world_size: int) -> None:
    config = Config(path)
    batch, micro, gas = config.batch_sizes(world_size)
    if "scheduler" in config.trainer:
        try:
            import torch
        except ImportError:
            print("scheduler: not checked (needs torch)")
        else:
            from .torch import schedulers
            probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=config.lr)
            schedulers.build(config.trainer["scheduler"], probe)
            print("scheduler: %s" % config.trainer["scheduler"]["type"])
    print("library: %s (%s)" % library_path())
    print("batch: train_batch_size %s = micro-batch %s x accumulation %d x %d rank(s)" % (batch, micro, gas,
                                                                                        world_size))
    for tier in ("offload_param", "offload_optimizer"):
        device = config.resolved["zero_optimization.%s.device" % tier]
        paths = config.resolved["zero_optimization.%s.nvme_path" % tier] if device in ("nvme", "auto") else []
        where = ", ".join("%s (%s)" % (p, "exists" if os.path.isdir(p) else "created at start") for p in paths)
        print("%s: %s%s" % (tier, device, " at " + where if where else ""))
    for key in sorted(config.resolved):
        print("  %-56s %s" % (key, config.resolved[key]))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m strata", description=(__doc__ or "").split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check a config file as strata.torch reads it")
    c.add_argument("file")
    c.add_argument("--world-size", type=int, default=1, help="ranks the batch sizes are resolved for (1)")
    args = ap.parse_args(argv)
    try:
        check(args.file, args.world_size)
    except StrataError as e:
        print("%s: %s" % (args.file, e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

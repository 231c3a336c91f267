"""The PyTorch engine's checkpoints: strata's own (strata_save, atomic, any world size), with the engine's counters,
the lr scheduler's state and the trainer's client_state beside it, and DeepSpeed's "latest" file."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import torch

from .. import checkpoint as _checkpoint
from .._files import atomic_write, replace_dir
from .._typing import StrPath
from ..errors import IOFailure

if TYPE_CHECKING:
    from .engine import StrataEngine


def save(engine: StrataEngine, save_dir: StrPath, tag: Optional[object] = None,
         client_state: Optional[Dict[str, Any]] = None, save_latest: bool = True) -> str:
    """Writes the training state to save_dir/tag (tag default "global_step<N>"; a tag may be reused), atomically:
    strata's checkpoint and this engine's counters, the lr scheduler's state and client_state beside it are written
    under a temporary name (.tag.saving), which then replaces save_dir/tag in one step; then save_dir/latest. A crash
    leaves the previous save_dir/tag whole or the new one, each with its torch_engine.pt. A collective with several
    ranks. Returns the checkpoint's path."""
    name = str(tag or "global_step%d" % engine.global_steps)
    directory = os.fspath(save_dir)
    path = os.path.join(directory, name)
    staging = os.path.join(directory, "." + name + ".saving")  # strata replaces a crashed save's leftover
    if engine.rank == 0:
        os.makedirs(directory, exist_ok=True)
    engine.comm.allreduce_sum([0.0])  # the directory exists before any rank writes into it
    engine.engine.save(staging)
    failed = 0.0
    if engine.rank == 0:
        try:
            state = {"micro_steps": engine.micro_steps, "global_steps": engine.global_steps,
                     "lr": [g["lr"] for g in engine.optimizer.param_groups],
                     "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
                     "client_state": client_state or {}}
            atomic_write(os.path.join(staging, "torch_engine.pt"), lambda f: torch.save(state, f))
            replace_dir(staging, path)
            if save_latest:
                atomic_write(os.path.join(directory, "latest"), lambda f: f.write(name.encode()))
        except BaseException:
            engine.comm.allreduce_sum([1.0])  # the other ranks fail too, rather than report a save that is not
            raise
    if engine.comm.allreduce_sum([failed])[0]:
        raise IOFailure("save_checkpoint: rank 0 could not publish %s (its error names why)" % path)
    return path

def load(engine: StrataEngine, load_dir: StrPath, tag: Optional[object] = None) -> Tuple[str, Any]:
    """Restores what save_checkpoint wrote: load_dir/tag, or the tag in load_dir/latest, or load_dir itself
    when it is a checkpoint. Returns (path, client_state). Training then continues bit-identically."""
    directory = os.fspath(load_dir)
    if tag is not None:
        path = os.path.join(directory, str(tag))
    elif os.path.exists(os.path.join(directory, "manifest.json")):
        path = directory
    elif os.path.exists(os.path.join(directory, "latest")):
        with open(os.path.join(directory, "latest")) as f:
            path = os.path.join(directory, f.read().strip())
    else:
        path = _checkpoint.latest(directory)
    engine.engine.load(path)
    engine.loads += 1  # the weights state_dict() handed out before are stale
    info = _checkpoint.inspect(path)
    state_file = os.path.join(path, "torch_engine.pt")
    state = torch.load(state_file) if os.path.exists(state_file) else None
    if state is None:  # a checkpoint of strata alone (strata train, the C API)
        state = {"micro_steps": info["iterations"] * engine._gas, "global_steps": info["iterations"],
                 "lr": None, "lr_scheduler": None, "client_state": {}}
    engine.micro_steps, engine.global_steps = state["micro_steps"], state["global_steps"]
    if state["lr"]:
        for g, lr in zip(engine.optimizer.param_groups, state["lr"]):
            g["lr"] = lr
    if state["lr_scheduler"] is not None and engine.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    return path, state["client_state"]

"""The PyTorch engine's checkpoints: strata's own (strata_save, atomic, any world size), with the engine's counters,
the lr scheduler's state and the trainer's client_state beside it, and DeepSpeed's "latest" file."""
from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import torch

from .. import checkpoint as _checkpoint
from .._files import atomic_write, replace_dir
from .._typing import StrPath
from ..errors import InvalidArgument, IOFailure, NotFound, StrataError

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
                     "weight_decay": [g["weight_decay"] for g in engine.optimizer.param_groups],
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

def load(engine: StrataEngine, load_dir: StrPath, tag: Optional[object] = None, load_module_strict: bool = True,
         load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True, load_module_only: bool = False,
         custom_load_fn: Any = None) -> Tuple[Optional[str], Any]:
    """Restores what save_checkpoint wrote: load_dir/tag, or the tag in load_dir/latest, or load_dir itself when it
    is a checkpoint, or the newest checkpoint under load_dir. Returns (path, client_state); (None, None) with a
    warning when load_dir holds nothing to load and no tag is given (as DeepSpeed). Training then continues
    bit-identically. DeepSpeed's flags: load_lr_scheduler_states=False keeps the scheduler (and so the lr) as it
    is; load_module_strict is strict either way for the parameters strata holds, trained and frozen (a checkpoint of
    other parameters fails, naming the tensor), and leaves what strata does not hold (buffers) as it is; weights without
    their optimizer state (load_module_only, load_optimizer_states=False) and custom_load_fn are refused."""
    if load_module_only or not load_optimizer_states:
        raise InvalidArgument(
            "load_checkpoint(%s) is not supported: strata's checkpoint restores the weights together with their Adam "
            "moments and step count (strata_load takes one whole training state); hint: to start anew from a "
            "checkpoint's weights, write them out with `strata ckpt export` and load them into the model before "
            "strata.torch.initialize; or load everything (the defaults)" % (
                "load_module_only=True" if load_module_only else "load_optimizer_states=False"))
    if custom_load_fn is not None:
        raise InvalidArgument("load_checkpoint(custom_load_fn=...) is not supported: strata loads its own checkpoint "
                              "format; hint: drop custom_load_fn")
    path = _find(os.fspath(load_dir), tag)
    if path is None:
        warnings.warn("strata: load_checkpoint: %s holds no 'latest' file and no checkpoint, and no tag was given: "
                      "nothing loaded (as DeepSpeed, (None, None) is returned)" % os.fspath(load_dir), stacklevel=3)
        return None, None
    try:
        engine.engine.load(path)
    except StrataError as e:
        if load_module_strict:
            raise
        raise type(e)("%s (load_module_strict=False does not loosen this: strata loads only a checkpoint of exactly "
                      "the parameters it trains)" % e) from e
    engine.loads += 1  # the weights state_dict() handed out before are stale
    info = _checkpoint.inspect(path)
    state_file = os.path.join(path, "torch_engine.pt")
    state = torch.load(state_file) if os.path.exists(state_file) else None
    if state is None:  # a checkpoint of strata alone (strata train, the C API)
        state = {"micro_steps": info["iterations"] * engine._gas, "global_steps": info["iterations"],
                 "lr": None, "lr_scheduler": None, "client_state": {}}
    engine.micro_steps, engine.global_steps = state["micro_steps"], state["global_steps"]
    # The lr follows the scheduler: restored with it, or kept with it (load_lr_scheduler_states=False).
    keep_lr = engine.lr_scheduler is not None and not load_lr_scheduler_states
    if state["lr"] and not keep_lr:
        for g, lr in zip(engine.optimizer.param_groups, state["lr"]):
            g["lr"] = lr
    # Each group's weight decay as it was at the save (strata_load restored the values its last step ran with).
    decay = state.get("weight_decay") or [engine.engine.group(i)["weight_decay"]
                                          for i in range(len(engine.optimizer.param_groups))]
    for g, wd in zip(engine.optimizer.param_groups, decay):
        g["weight_decay"] = wd
    if state["lr_scheduler"] is not None and engine.lr_scheduler is not None and load_lr_scheduler_states:
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    return path, state["client_state"]


def _find(directory: str, tag: Optional[object]) -> Optional[str]:
    """The checkpoint to load (see load), or None when directory holds none and tag is None."""
    if tag is not None:
        return os.path.join(directory, str(tag))
    if os.path.exists(os.path.join(directory, "manifest.json")):
        return directory
    if os.path.exists(os.path.join(directory, "latest")):
        with open(os.path.join(directory, "latest")) as f:
            return os.path.join(directory, f.read().strip())
    if not os.path.isdir(directory):
        return None
    try:
        return _checkpoint.latest(directory)
    except NotFound:
        return None


def save_16bit(engine: StrataEngine, save_dir: StrPath, save_filename: str = "pytorch_model.bin",
               exclude_frozen_parameters: bool = False) -> bool:
    """DeepSpeed's save_16bit_model: the model's state_dict (the weights strata holds, frozen ones too, in the model's
    compute dtype, its buffers as they are; CPU tensors, tied weights kept shared) written by rank 0 with
    torch.save to save_dir/save_filename, atomically. A collective with several ranks. Returns True."""
    state = engine.module.state_dict()  # the real weights (_state_dict's hooks); a collective
    if exclude_frozen_parameters:
        for prefix, mod in engine.module.named_modules(remove_duplicate=False):
            for name, p in mod._parameters.items():
                if p is not None and not p.requires_grad:
                    state.pop(prefix + "." + name if prefix else name, None)
    copies: Dict[int, torch.Tensor] = {}
    for key, value in state.items():  # in place: the state_dict's _metadata stays
        if isinstance(value, torch.Tensor):
            state[key] = copies.setdefault(id(value), value.detach().cpu())
    path = os.path.join(os.fspath(save_dir), save_filename)
    failed = 0.0
    if engine.rank == 0:
        try:
            os.makedirs(os.fspath(save_dir), exist_ok=True)
            atomic_write(path, lambda f: torch.save(state, f))
        except BaseException:
            engine.comm.allreduce_sum([1.0])
            raise
    if engine.comm.allreduce_sum([failed])[0]:
        raise IOFailure("save_16bit_model: rank 0 could not write %s (its error names why)" % path)
    return True

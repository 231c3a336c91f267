"""Checkpoint directories written by strata_save: what they hold, whether they are intact, the newest one."""
from __future__ import annotations

import ctypes
import os
from typing import Any, Dict

from . import _lib, _names
from ._typing import StrPath
from .engine import _check


def inspect(directory: StrPath) -> Dict[str, Any]:
    """The manifest's summary as a dict (step, iterations, param_dtype, loss_scale, pending_update, tensors, bytes,
    world_size). NotFound when the directory holds no checkpoint, CorruptError when its manifest is bad."""
    info = _lib.CheckpointInfo()
    _check(_lib.load().strata_checkpoint_inspect(os.fspath(directory).encode(), ctypes.byref(info)), None,
           "strata_checkpoint_inspect")
    out = _lib.as_dict(info)
    out["param_dtype"] = _names.dtype_name(out["param_dtype"])
    return out


def verify(directory: StrPath) -> None:
    """Reads every tensor and checks it against the manifest's checksums (CorruptError names the first bad one)."""
    _check(_lib.load().strata_checkpoint_verify(os.fspath(directory).encode()), None, "strata_checkpoint_verify")


def latest(root: StrPath) -> str:
    """The path of the newest checkpoint under root (NotFound when there is none)."""
    out = ctypes.create_string_buffer(4096)
    _check(_lib.load().strata_checkpoint_latest(os.fspath(root).encode(), out, len(out)), None,
           "strata_checkpoint_latest")
    return out.value.decode()

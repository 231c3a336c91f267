"""Checkpoint directories written by strata_save: what they hold, whether they are intact, the newest one."""
import ctypes
import os

from . import _lib
from .engine import _check

_DTYPES = {0: "fp32", 1: "bf16", 2: "fp16"}


def inspect(directory):
    """The manifest's summary as a dict (step, iterations, param_dtype, loss_scale, pending_update, tensors, bytes,
    world_size). NotFound when the directory holds no checkpoint, CorruptError when its manifest is bad."""
    info = _lib.CheckpointInfo()
    _check(_lib.load().strata_checkpoint_inspect(os.fspath(directory).encode(), ctypes.byref(info)), None,
           "strata_checkpoint_inspect")
    out = {name: getattr(info, name) for name, _ in _lib.CheckpointInfo._fields_}
    out["param_dtype"] = _DTYPES.get(out["param_dtype"], "?")
    return out


def verify(directory):
    """Reads every tensor and checks it against the manifest's checksums (CorruptError names the first bad one)."""
    _check(_lib.load().strata_checkpoint_verify(os.fspath(directory).encode()), None, "strata_checkpoint_verify")


def latest(root):
    """The path of the newest checkpoint under root (NotFound when there is none)."""
    out = ctypes.create_string_buffer(4096)
    _check(_lib.load().strata_checkpoint_latest(os.fspath(root).encode(), out, len(out)), None,
           "strata_checkpoint_latest")
    return out.value.decode()

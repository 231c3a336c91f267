"""strata from Python: the engine that trains models larger than device memory, bound through ctypes.

    import strata                      # the C API: Config, Engine, Comm, checkpoints
    import strata.torch                # PyTorch: initialize(model, config), OffloadAdam

The library is found as strata._lib describes ($STRATA_LIB, the installed copy, this checkout's build tree, the
system); strata.library_path() says which one and why.
"""
from __future__ import annotations

from . import checkpoint
from ._lib import library_path
from .config import Config
from .engine import Comm, Engine, world
from .errors import (BudgetError, CommError, ConfigError, CorruptError, DeviceError, InvalidArgument, IOFailure,
                     LibraryNotFound, NoSpace, NotFound, OutOfMemory, StateError, StrataError, Unsupported)

__all__ = ["Config", "Engine", "Comm", "world", "checkpoint", "library_path", "version", "StrataError",
           "ConfigError", "StateError", "BudgetError", "InvalidArgument", "OutOfMemory", "IOFailure", "NoSpace",
           "CorruptError", "DeviceError", "Unsupported", "NotFound", "CommError", "LibraryNotFound"]


def version() -> str:
    """The version of the loaded libstrata ("0.1.0")."""
    from . import _lib
    text: bytes = _lib.load().strata_version()
    return text.decode()

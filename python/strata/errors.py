"""strata's statuses as Python exceptions. Each carries the C status name and strata_last_error's message.

Each class names its C status ("STRATA_EINVAL"); the values come from the loaded library (strata_status_name), so
the list of statuses is written once, in strata.h.
"""
from __future__ import annotations

from typing import Dict, Optional, Type


class StrataError(RuntimeError):
    """A strata call failed. .status is the C status name ("STRATA_ECONFIG"), .code its value."""

    status: str = "STRATA_EINTERNAL"

    def __init__(self, message: str, status: Optional[str] = None, code: Optional[int] = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self._code = code

    @property
    def code(self) -> Optional[int]:
        """The status's value in the loaded library; None when no library can be loaded to ask."""
        if self._code is None:
            # Imported here: _lib (which _names uses) raises LibraryNotFound from this module.
            from . import _names
            try:
                self._code = _names.status_code(self.status)
            except LibraryNotFound:
                return None
        return self._code


class InvalidArgument(StrataError, ValueError):
    status = "STRATA_EINVAL"


class OutOfMemory(StrataError, MemoryError):
    status = "STRATA_ENOMEM"


class BudgetError(StrataError):
    status = "STRATA_EBUDGET"


class StateError(StrataError):
    """A call not allowed now: e.g. a step while modules are still held (inside forward)."""
    status = "STRATA_ESTATE"


class ConfigError(StrataError, ValueError):
    status = "STRATA_ECONFIG"


class IOFailure(StrataError, OSError):
    status = "STRATA_EIO"


class NoSpace(IOFailure):
    status = "STRATA_ENOSPC"


class CorruptError(StrataError):
    status = "STRATA_ECORRUPT"


class DeviceError(StrataError):
    status = "STRATA_EDEVICE"


class Unsupported(StrataError):
    status = "STRATA_EUNSUPPORTED"


class NotFound(StrataError, FileNotFoundError):
    status = "STRATA_ENOTFOUND"


class CommError(StrataError):
    """A collective failed: another rank failed, timed out or disagreed."""
    status = "STRATA_ECOMM"


class LibraryNotFound(StrataError, ImportError):
    """libstrata could not be loaded (the message lists every place tried)."""
    status = "STRATA_ENOTFOUND"


_BY_STATUS: Dict[str, Type[StrataError]] = {
    cls.status: cls for cls in (InvalidArgument, OutOfMemory, BudgetError, StateError, ConfigError, IOFailure,
                                NoSpace, CorruptError, DeviceError, Unsupported, NotFound, CommError)}


def error_for(code: int, message: str) -> StrataError:
    """The exception for a C status code (StrataError, with the library's name of the status, for one this package
    has no class for)."""
    from . import _names
    name = _names.status_name(code)
    cls = _BY_STATUS.get(name)
    if cls is None:
        return StrataError(message, name, code)
    return cls(message)

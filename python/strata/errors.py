"""strata's statuses as Python exceptions. Each carries the C status name and strata_last_error's message."""


class StrataError(RuntimeError):
    """A strata call failed. .status is the C status name ("STRATA_ECONFIG"), .code its value."""

    status = "STRATA_EINTERNAL"
    code = 14

    def __init__(self, message, status=None, code=None):
        super().__init__(message)
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class InvalidArgument(StrataError, ValueError):
    status, code = "STRATA_EINVAL", 1


class OutOfMemory(StrataError, MemoryError):
    status, code = "STRATA_ENOMEM", 2


class BudgetError(StrataError):
    status, code = "STRATA_EBUDGET", 3


class StateError(StrataError):
    """A call not allowed now: e.g. a step while modules are still held (inside forward)."""
    status, code = "STRATA_ESTATE", 4


class ConfigError(StrataError, ValueError):
    status, code = "STRATA_ECONFIG", 5


class IOFailure(StrataError, OSError):
    status, code = "STRATA_EIO", 6


class NoSpace(IOFailure):
    status, code = "STRATA_ENOSPC", 7


class CorruptError(StrataError):
    status, code = "STRATA_ECORRUPT", 8


class DeviceError(StrataError):
    status, code = "STRATA_EDEVICE", 9


class Unsupported(StrataError):
    status, code = "STRATA_EUNSUPPORTED", 10


class NotFound(StrataError, FileNotFoundError):
    status, code = "STRATA_ENOTFOUND", 11


class CommError(StrataError):
    """A collective failed: another rank failed, timed out or disagreed."""
    status, code = "STRATA_ECOMM", 15


class LibraryNotFound(StrataError, ImportError):
    """libstrata could not be loaded (the message lists every place tried)."""
    status, code = "STRATA_ENOTFOUND", 11


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, OutOfMemory, BudgetError, StateError, ConfigError, IOFailure,
                                      NoSpace, CorruptError, DeviceError, Unsupported, NotFound, CommError)}


def error_for(code, message):
    """The exception for a C status code (StrataError for one this package does not name)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return StrataError(message, "STRATA_STATUS_%d" % code, code)
    return cls(message)

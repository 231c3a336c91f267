"""Files the package writes itself (beside strata's own checkpoints)."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
from typing import BinaryIO, Callable


def atomic_write(path: str, write: Callable[[BinaryIO], object]) -> None:
    """Writes path through write(binary file) into a temporary file beside it, fsynced, then renamed over path:
    a crash leaves the old file or the new one, never a part."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def replace_dir(new: str, path: str) -> None:
    """Puts directory new at path, atomically: a crash leaves the old path whole or the new one, never neither or a
    mix. An existing path is exchanged with new (renameat2 RENAME_EXCHANGE) and then removed from new's name (its
    symbolic links removed, never followed). Where the exchange is missing (an old kernel, a filesystem without it)
    the old one is renamed aside first, which leaves a moment with no path: said here, not hidden."""
    if not os.path.lexists(path):
        os.rename(new, path)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    exchange = getattr(libc, "renameat2", None)
    if exchange is not None and exchange(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(path),
                                         _RENAME_EXCHANGE) == 0:
        shutil.rmtree(new)
        return
    err = ctypes.get_errno() if exchange is not None else errno.ENOSYS
    if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        raise OSError(err, "renameat2(%s, %s, RENAME_EXCHANGE): %s" % (new, path, os.strerror(err)))
    aside = new + ".old"
    os.rename(path, aside)
    os.rename(new, path)
    shutil.rmtree(aside)

"""Files the package writes itself (beside strata's own checkpoints)."""
import os
import tempfile


def atomic_write(path, write):
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

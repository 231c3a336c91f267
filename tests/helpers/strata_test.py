"""What the Python tests (tests/py_*.py) share: the strata package on the path, torch or a skip, a fresh seed that
is printed (STRATA_TEST_SEED reproduces it), checks that print both values, and the exit rule (77 = skipped; a
test that ran no check fails)."""
import atexit
import os
import random
import sys

SOURCE_DIR = os.environ.get("STRATA_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
BUILD_DIR = os.environ.get("STRATA_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "examples", "gpt"))

SKIP = 77
_state = {"checks": 0, "failed": 0, "name": os.path.basename(sys.argv[0]), "at_done": []}


def child_process():
    """This process is a helper its parent test judges (a rank, a resumed run): the exit rule does not apply."""
    _state["skipped"] = True


def skip(reason):
    print("SKIP %s: %s" % (_state["name"], reason))
    _state["skipped"] = True
    sys.stdout.flush()
    os._exit(SKIP)


def require_torch():
    """torch, or a skip that says how to get it."""
    try:
        import torch
    except ImportError:
        skip("%s cannot import torch (install Debian's python3-torch: tools/run does)" % sys.executable)
    return torch


def seed():
    """A fresh seed per run, printed; STRATA_TEST_SEED=<n> repeats a run."""
    s = int(os.environ.get("STRATA_TEST_SEED") or random.SystemRandom().randrange(1 << 31))
    print("seed %d (STRATA_TEST_SEED=%d repeats this run)" % (s, s))
    return s


def scratch(name):
    """An empty directory for this test under the build tree's scratch space."""
    import shutil
    d = os.path.join(os.environ.get("STRATA_SCRATCH") or os.path.join(BUILD_DIR, "scratch"), name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def check(ok, what, got=None, want=None):
    """One check: prints FAIL with both values when it fails; returns ok."""
    _state["checks"] += 1
    if not ok:
        _state["failed"] += 1
        extra = "" if got is None and want is None else ": got %s, want %s" % (got, want)
        print("FAIL %s%s" % (what, extra))
        sys.stdout.flush()
    return ok


def check_raises(exc_type, fragment, fn, what):
    """fn() must raise exc_type whose message contains fragment."""
    try:
        fn()
    except exc_type as e:
        return check(fragment in str(e), "%s: the message names the problem" % what, repr(str(e)), repr(fragment))
    except Exception as e:  # the wrong kind of failure
        return check(False, "%s raises %s" % (what, exc_type.__name__), "%s: %s" % (type(e).__name__, e), exc_type)
    return check(False, "%s raises %s" % (what, exc_type.__name__), "no exception", exc_type.__name__)


def at_done(line):
    """line() is printed by done(), before the closing line (a helper's summary: the largest difference it saw)."""
    _state["at_done"].append(line)


def done():
    """The closing line; the exit code is the verdict."""
    for line in _state["at_done"]:
        print(line())
    print("%s: %d checks, %d failed" % (_state["name"], _state["checks"], _state["failed"]))
    sys.stdout.flush()
    if _state["checks"] == 0:
        print("FAIL %s ran no check" % _state["name"])
        os._exit(1)
    os._exit(1 if _state["failed"] else 0)


@atexit.register
def _no_silent_exit():
    if not _state.get("skipped") and _state["checks"] == 0:
        print("FAIL %s: exited without running a check (or without calling done())" % _state["name"])
        os._exit(1)

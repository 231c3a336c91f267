"""The Python benchmarks' way to PyTorch: Debian's python3-torch lands in /usr/bin/python3, which may not be the
python3 on PATH, so a benchmark started without torch re-runs itself with an interpreter that has it."""
import os
import subprocess
import sys

INTERPRETERS = ["/usr/bin/python3", "/usr/local/bin/python3"]
_REEXEC = "STRATA_BENCH_TORCH_REEXEC"


def find_torch_or_skip():
    """Returns when torch imports here; else re-executes this script with an interpreter that has torch, or says
    SKIP and exits 0."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get(_REEXEC):
        print("SKIP: PyTorch is not importable (install Debian's python3-torch)")
        sys.exit(0)
    for py in INTERPRETERS:
        if os.path.exists(py) and os.path.realpath(py) != os.path.realpath(sys.executable):
            if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0:
                os.execve(py, [py] + sys.argv, dict(os.environ, **{_REEXEC: "1"}))
    print("SKIP: PyTorch is not importable by %s or %s (install Debian's python3-torch)"
          % (sys.executable, " or ".join(INTERPRETERS)))
    sys.exit(0)

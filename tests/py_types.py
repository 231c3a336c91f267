"""The Python package's type hints hold: mypy, strict as python/pyproject.toml's [tool.mypy] asks, finds no error in
python/strata against the torch and transformers the tests use, and the package carries py.typed (PEP 561) so that
its users' type checkers read the hints. mypy comes from the test venv tools/run makes (STRATA_HF_PYTHON's, else
STRATA_BUILD_DIR/venv, pinned there); without it the test skips, saying how to get it."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))
import strata_test as T  # noqa: E402
from hf_models import VENV_PYTHON  # noqa: E402

PACKAGE_DIR = os.path.join(T.SOURCE_DIR, "python")


def venv_has_mypy():
    return os.path.exists(VENV_PYTHON) and subprocess.run(
        [VENV_PYTHON, "-c", "import mypy"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


if not venv_has_mypy():
    T.skip("%s cannot import mypy; tools/run test makes that venv (pinned mypy from PyPI)" % VENV_PYTHON)

T.check(os.path.isfile(os.path.join(PACKAGE_DIR, "strata", "py.typed")), "python/strata/py.typed exists")

# mypy is no sanitized program: what the sanitized build preloads into the tests stays out of it.
env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
# --python-executable: the venv's interpreter, which sees Debian's torch and the pinned transformers.
p = subprocess.run([VENV_PYTHON, "-m", "mypy", "--python-executable", VENV_PYTHON,
                    "--cache-dir", os.path.join(T.BUILD_DIR, "mypy-cache")],
                   cwd=PACKAGE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=280)
print(p.stdout.rstrip())
T.check(p.returncode == 0 and "Success: no issues found" in p.stdout, "mypy (cd python && mypy) finds no error",
        "exit %d" % p.returncode, "exit 0")
T.done()

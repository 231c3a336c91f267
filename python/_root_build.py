"""The build backend of the repository root's pyproject.toml: scikit-build-core's hooks, which build libstrata with
CMake into the wheel, after a check of what the library needs from the system. CMake's own error for a missing
library names a pkg-config module ("Package 'hwloc' ... not found"); this check names the Debian package to install.
Each PEP 517 hook runs in a fresh process, so a check per hook costs a build nothing that matters (one compile).

scikit-build-core comes from PyPI into pip's isolated build environment. Without it (pip's --no-build-isolation on a
Python that lacks it, as in the offline Debian recipe) every hook stops with a message that says what to do instead.
"""
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile

try:
    from scikit_build_core import build as _skbuild
except ImportError:
    _skbuild = None

# The pkg-config modules that CMakeLists.txt requires for libstrata (its pkg_check_modules outside the model, whose
# OpenBLAS the wheel does not build), each with the Debian package that provides it. tests/py_package_wheel.py checks
# that this list and CMakeLists.txt agree.
PKG_CONFIG_MODULES = (("liburing", "liburing-dev"), ("hwloc", "libhwloc-dev"), ("jansson", "libjansson-dev"))

OPENMP_PROGRAM = "#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n"


def _compiler():
    """The C compiler CMake will use: $CC, else the one this Python was built with (scikit-build-core passes it on)."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    words = shlex.split(cc)
    return words[0] if words else "cc"


def _openmp_package(cc):
    """The Debian package with the compiler's OpenMP: clang's libomp-dev, or gcc's libgcc-<major>-dev (omp.h and
    libgomp.so), which Debian's gcc-<major> depends on."""
    p = subprocess.run([cc, "--version"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if "clang" in p.stdout:
        return "libomp-dev"
    p = subprocess.run([cc, "-dumpversion"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    major = p.stdout.strip().split(".")[0]
    return "libgcc-%s-dev" % major if major.isdigit() else "gcc"


def missing_packages():
    """[(what is missing, the Debian package that provides it)]: empty when the library can be built."""
    missing = []
    cc = _compiler()
    if shutil.which(cc) is None:
        missing.append(("the C compiler %s" % cc, "gcc"))
    if shutil.which("pkg-config") is None:
        missing.append(("pkg-config (CMake finds the libraries below with it)", "pkg-config"))
        missing.extend(("%s (not checked without pkg-config)" % module, deb) for module, deb in PKG_CONFIG_MODULES)
    else:
        for module, deb in PKG_CONFIG_MODULES:
            if subprocess.run(["pkg-config", "--exists", module]).returncode != 0:
                missing.append(("%s (pkg-config module %s)" % (module, module), deb))
    if shutil.which(cc) is not None:
        with tempfile.TemporaryDirectory(prefix="strata-openmp-") as d:
            src = os.path.join(d, "omp.c")
            with open(src, "w") as f:
                f.write(OPENMP_PROGRAM)
            p = subprocess.run([cc, "-fopenmp", src, "-o", os.path.join(d, "omp")], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            if p.returncode != 0:
                missing.append(("OpenMP (%s -fopenmp: %s)" % (cc, (p.stdout.strip().splitlines() or ["failed"])[-1]),
                                _openmp_package(cc)))
    return missing


def check_system():
    """Stops the build, naming each missing Debian package, when the library cannot be built."""
    missing = missing_packages()
    if not missing:
        return
    raise SystemExit(
        "strata: cannot build libstrata; missing:\n" +
        "".join("  %s: install Debian's %s\n" % (what, deb) for what, deb in missing) +
        "hint: apt-get install %s (tools/run installs everything the build needs); if they are installed elsewhere, "
        "set PKG_CONFIG_PATH" % " ".join(sorted({deb.split()[0] for _, deb in missing})))


def _backend():
    if _skbuild is None:
        raise SystemExit(
            "strata: `pip install .` at the repository root builds libstrata with scikit-build-core, which %s cannot "
            "import; pip brings it from PyPI unless --no-build-isolation is given. Offline: build the library first "
            "(tools/run demo) and install ./python, which bundles that build (README, \"Python package\")"
            % sys.executable)
    return _skbuild


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    backend = _backend()
    check_system()
    return backend.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _backend().build_sdist(sdist_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    return _backend().get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _backend().get_requires_for_build_sdist(config_settings)


if _skbuild is not None and hasattr(_skbuild, "prepare_metadata_for_build_wheel"):
    def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
        return _skbuild.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """Refused: an editable install of the root would leave the package in python/strata, which looks for the
    library beside itself or in the checkout's build tree, never where this build would put it."""
    raise SystemExit("strata: for an editable install use `pip install -e ./python`: the package stays in the "
                     "checkout and loads the checkout's build (build/libstrata.so, or $STRATA_BUILD_DIR)")

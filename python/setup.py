"""The strata package's build for the offline Debian recipe: pure Python (pyproject.toml says what it is), plus a
copy of a libstrata.so built before. `pip install .` at the repository root is the install that builds the library
itself (CMake, through scikit-build-core: the root's pyproject.toml); this directory bundles an existing build.

An install bundles the first built libstrata.so it finds, in this order, as strata/_native/libstrata.so, where
strata._lib looks second (after $STRATA_LIB):
  1. $STRATA_BUILD_DIR/libstrata.so (an absolute path: the build runs in this directory, not the caller's);
  2. <repository>/build/libstrata.so, when this directory sits in a strata checkout.
With none found it bundles nothing when the system has a libstrata (`cmake --install` + ldconfig, or
$LD_LIBRARY_PATH), which the installed package then loads at import; with none there either the install stops and
says how to get one, rather than install a package that fails at first use. pip shows a successful build's output
only with -v: `pip install -v ./python` says which library was bundled. An editable install (-e) bundles nothing:
the package stays in the checkout and finds its build tree there.
"""
import atexit
import ctypes.util
import os
import shutil
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LIB_NAME = "libstrata.so"


def find_library():
    """(the libstrata.so to bundle or None, the places tried)."""
    places = []
    build = os.environ.get("STRATA_BUILD_DIR")
    if build:
        places.append(os.path.join(os.path.abspath(build), LIB_NAME))
    if os.path.isfile(os.path.join(REPO, "include", "strata.h")):
        places.append(os.path.join(REPO, "build", LIB_NAME))
    for path in places:
        if os.path.isfile(path):
            return path, places
    return None, places


LIBRARY, TRIED = find_library()


class BuildPyWithLibrary(build_py):
    """build_py, then the library copied (symlinks resolved) into the built package's _native/."""

    def run(self):
        super().run()
        # A build directory named on the command line may hold a copy bundled last time; it must not ride along.
        dest_dir = os.path.join(self.build_lib, "strata", "_native")
        shutil.rmtree(dest_dir, ignore_errors=True)
        if getattr(self, "editable_mode", False):
            print("strata: editable install: no libstrata.so bundled; the package finds this checkout's build tree "
                  "(or $STRATA_LIB, or the system's) at import")
            return
        if LIBRARY is None:
            looked = ", ".join(TRIED) or "no build tree: this directory is not in a strata checkout"
            system = ctypes.util.find_library("strata")
            if system is None:
                raise SystemExit(
                    "strata: no built libstrata.so to bundle (looked in: %s) and none on the system library path "
                    "(ldconfig, LD_LIBRARY_PATH): the package would fail at first use. `pip install .` at the "
                    "repository root builds the library from source (CMake; pip brings scikit-build-core from PyPI). "
                    "Offline: build strata first (tools/run demo), or set STRATA_BUILD_DIR to an absolute build "
                    "directory, then reinstall" % looked)
            print("strata: note: no built libstrata.so found (looked in: %s); bundling none: at import the package "
                  "loads the system's %s (or $STRATA_LIB)" % (looked, system))
            return
        os.makedirs(dest_dir)
        dest = os.path.join(dest_dir, LIB_NAME)
        shutil.copyfile(LIBRARY, dest)
        os.chmod(dest, 0o755)
        print("strata: bundled %s as strata/_native/%s" % (os.path.realpath(LIBRARY), LIB_NAME))


class StrataDistribution(Distribution):
    """A wheel that carries a native library is tagged for this platform, not as pure Python."""

    def has_ext_modules(self):
        return LIBRARY is not None


# setuptools builds in place (pip builds a local directory in place): its build/ and strata.egg-info go to a
# directory of this process's own instead, so the checkout stays clean and two installs at once (two build trees'
# tests) cannot mix their files.
BUILD_BASE = tempfile.mkdtemp(prefix="strata-python-build-")
atexit.register(shutil.rmtree, BUILD_BASE, ignore_errors=True)
setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=StrataDistribution,
      options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}})

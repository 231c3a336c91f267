"""The build backend of the repository root's pyproject.toml: each PEP 517 hook runs setuptools' in python/, so
`pip install .` at the root builds exactly what `pip install ./python` builds. The package is described once, in
python/pyproject.toml and python/setup.py. Each hook runs in its own process, so changing directory is safe."""
import os

from setuptools import build_meta as _setuptools

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _in_package_dir(name):
    hook = getattr(_setuptools, name)

    def run(directory, config_settings=None, metadata_directory=None):
        # The frontend's directories may be relative to the root, where it called us.
        directory = os.path.abspath(directory)
        if metadata_directory is not None:
            metadata_directory = os.path.abspath(metadata_directory)
        os.chdir(PACKAGE_DIR)
        if name.startswith("build_") and name != "build_sdist":
            return hook(directory, config_settings, metadata_directory)
        return hook(directory, config_settings)

    run.__name__ = name
    return run


def _requires(name):
    hook = getattr(_setuptools, name)

    def run(config_settings=None):
        os.chdir(PACKAGE_DIR)
        return hook(config_settings)

    run.__name__ = name
    return run


build_wheel = _in_package_dir("build_wheel")
build_sdist = _in_package_dir("build_sdist")
prepare_metadata_for_build_wheel = _in_package_dir("prepare_metadata_for_build_wheel")
get_requires_for_build_wheel = _requires("get_requires_for_build_wheel")
get_requires_for_build_sdist = _requires("get_requires_for_build_sdist")
# Editable installs (PEP 660), where this setuptools has them (64 and later).
if hasattr(_setuptools, "build_editable"):
    build_editable = _in_package_dir("build_editable")
    prepare_metadata_for_build_editable = _in_package_dir("prepare_metadata_for_build_editable")
    get_requires_for_build_editable = _requires("get_requires_for_build_editable")

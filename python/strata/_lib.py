"""Finding and loading libstrata, and the C signatures of what the package calls.

The package has no compiled extension of its own: it binds the C API of include/strata.h through ctypes. The
library is looked for, first found wins, in
  1. $STRATA_LIB, the path of a libstrata.so (an error when set and unusable: it was asked for);
  2. the copy bundled into the installed package (`pip install ./python` copies the one it finds);
  3. the build tree of the checkout this package sits in (<repo>/build*/libstrata.so, $STRATA_BUILD_DIR first);
  4. the system's library path (`cmake --install`, ldconfig, $LD_LIBRARY_PATH).
`library_path()` says which one was loaded and why; when none is found the error lists every place tried.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple

from .errors import LibraryNotFound

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LIB_NAME = "libstrata.so"

_lock = threading.Lock()
_loaded: Optional[Tuple[ctypes.CDLL, str, str]] = None  # (CDLL, path, reason)


def _candidates() -> Iterator[Tuple[str, str]]:
    """(path or soname, reason) in the order they are tried."""
    env = os.environ.get("STRATA_LIB")
    if env:
        yield env, "STRATA_LIB"
        return
    yield os.path.join(_PACKAGE_DIR, "_native", _LIB_NAME), "the copy bundled with the installed package"
    repo = os.path.dirname(os.path.dirname(_PACKAGE_DIR))
    if os.path.isfile(os.path.join(repo, "include", "strata.h")):
        build = os.environ.get("STRATA_BUILD_DIR")
        if build:
            yield os.path.join(build, _LIB_NAME), "the build tree named by STRATA_BUILD_DIR"
        yield os.path.join(repo, "build", _LIB_NAME), "the build tree of this checkout (%s)" % repo
        for other in sorted(glob.glob(os.path.join(repo, "build-*", _LIB_NAME))):
            yield other, "a build tree of this checkout (%s)" % repo
    found = ctypes.util.find_library("strata")
    yield (found or _LIB_NAME), "the system library path"


def load() -> ctypes.CDLL:
    """The loaded library (a ctypes.CDLL with its signatures declared), loading it on first use."""
    global _loaded
    with _lock:
        if _loaded is None:
            tried: List[str] = []
            for path, reason in _candidates():
                if os.sep in path and not os.path.exists(path):
                    tried.append("%s (%s): no such file" % (path, reason))
                    continue
                try:
                    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError as e:
                    tried.append("%s (%s): %s" % (path, reason, e))
                    if reason == "STRATA_LIB":
                        break
                    continue
                _declare(lib)
                _loaded = (lib, getattr(lib, "_name", path), reason)
                break
            if _loaded is None:
                raise LibraryNotFound(
                    "libstrata was not found; tried:\n  " + "\n  ".join(tried) +
                    "\nhint: build it (tools/run demo, or cmake -S . -B build && cmake --build build), "
                    "set STRATA_LIB=/path/to/libstrata.so, or pip install ./python after building")
        return _loaded[0]


def library_path() -> Tuple[str, str]:
    """(path, reason): which libstrata this process uses and why it was chosen."""
    load()
    assert _loaded is not None  # load() raised otherwise
    return _loaded[1], _loaded[2]


# ------------------------------------------------------------------ signatures

c_size = ctypes.c_size_t
c_voidp = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_int = ctypes.c_int
c_double = ctypes.c_double
c_uint32 = ctypes.c_uint32
c_status = ctypes.c_int

# strata_status (*strata_init_fn)(void *ctx, strata_param_id param, size_t offset, size_t count, float *out)
INIT_FN = ctypes.CFUNCTYPE(c_status, c_voidp, c_uint32, c_size, c_size, ctypes.POINTER(ctypes.c_float))


class StepArgs(ctypes.Structure):
    _fields_ = [("lr", c_double)]


class GroupHparams(ctypes.Structure):
    """strata_group_hparams: one parameter group's Adam hyperparameters."""
    _fields_ = [("lr", c_double), ("weight_decay", c_double), ("beta1", c_double), ("beta2", c_double),
                ("eps", c_double)]


class StepResult(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("skipped", ctypes.c_bool), ("delayed", ctypes.c_bool),
                ("grad_norm", c_double), ("loss_scale", c_double)]


class Stats(ctypes.Structure):
    _fields_: ClassVar[List[Tuple[str, Any]]] = [(name, ctypes.c_uint64) for name in (
        "steps", "skipped_steps", "fetches", "prefetch_hits", "stall_ns", "step_ns", "adam_ns", "step_io_wait_ns",
        "nvme_to_host_bytes", "host_to_device_bytes", "device_to_host_bytes", "host_to_nvme_bytes")] + \
        [(name, c_size) for name in ("device_peak_bytes", "host_peak_bytes", "nvme_peak_bytes",
                                     "device_budget_bytes", "host_budget_bytes")] + \
        [("rank", c_int), ("world_size", c_int), ("comm_bytes", ctypes.c_uint64)] + \
        [("host_cache_hits", ctypes.c_uint64), ("host_cache_read_bytes", ctypes.c_uint64), ("host_cache_bytes", c_size)] + \
        [(name, ctypes.c_uint64) for name in ("act_pushes", "act_offload_bytes", "act_restore_bytes", "act_stall_ns")] + \
        [(name, c_size) for name in ("act_kept_peak_bytes", "act_device_peak_bytes")] + \
        [("adam_threads", c_int), ("adam_cores", ctypes.c_char * 124)] + \
        [(name, ctypes.c_uint64) for name in ("steps_redone", "redo_ns", "redo_nvme_bytes", "host_cache_held_bytes",
                                              "norm_passes", "norm_pass_ns")]


class CheckpointInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("iterations", ctypes.c_int64), ("param_dtype", c_int),
                ("loss_scale", c_double), ("pending_update", ctypes.c_bool), ("tensors", c_size),
                ("bytes", ctypes.c_uint64), ("world_size", c_int)]


def as_dict(struct: ctypes.Structure) -> Dict[str, Any]:
    """A filled structure's fields by name."""
    return {field[0]: getattr(struct, field[0]) for field in struct._fields_}


# name: (restype, argtypes), as ctypes takes them.
_SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "strata_version": (c_char_p, []),
    "strata_status_name": (c_char_p, [c_status]),
    "strata_status_str": (c_char_p, [c_status]),
    "strata_tier_name": (c_char_p, [c_int]),
    "strata_dtype_name": (c_char_p, [c_int]),
    "strata_backend_name": (c_char_p, [c_int]),
    "strata_last_error": (c_char_p, [c_voidp]),
    "strata_log_set_level": (None, [c_int]),
    "strata_config_size": (c_size, []),
    "strata_config_init_sized": (c_status, [c_voidp, c_size]),
    "strata_config_load_json_string": (c_status, [c_voidp, c_char_p, c_char_p, c_char_p, c_size]),
    "strata_config_validate": (c_status, [c_voidp, c_char_p, c_size]),
    "strata_config_to_json": (c_status, [c_voidp, c_char_p, c_size, ctypes.POINTER(c_size)]),
    "strata_engine_create": (c_status, [c_voidp, ctypes.POINTER(c_voidp)]),
    "strata_engine_create_ranked": (c_status, [c_voidp, c_voidp, c_voidp, ctypes.POINTER(c_voidp)]),
    "strata_engine_destroy": (None, [c_voidp]),
    "strata_engine_backend": (c_int, [c_voidp]),
    "strata_comm_create": (c_status, [ctypes.POINTER(c_voidp)]),
    "strata_comm_destroy": (None, [c_voidp]),
    "strata_comm_rank": (c_int, [c_voidp]),
    "strata_comm_size": (c_int, [c_voidp]),
    "strata_comm_local_rank": (c_int, [c_voidp]),
    "strata_comm_allreduce_sum": (c_status, [c_voidp, ctypes.POINTER(c_double), c_size]),
    "strata_comm_abort": (None, [c_voidp, c_char_p]),
    "strata_module_add": (c_status, [c_voidp, c_char_p, ctypes.POINTER(c_uint32)]),
    "strata_module_freeze": (c_status, [c_voidp, c_uint32]),
    "strata_module_frozen": (ctypes.c_bool, [c_voidp, c_uint32]),
    "strata_param_add": (c_status, [c_voidp, c_uint32, c_char_p, c_size, INIT_FN, c_voidp,
                                    ctypes.POINTER(c_uint32)]),
    "strata_param_set_shape": (c_status, [c_voidp, c_uint32, c_int, ctypes.POINTER(ctypes.c_int64)]),
    "strata_group_add": (c_status, [c_voidp, c_char_p, ctypes.POINTER(GroupHparams), ctypes.POINTER(c_uint32)]),
    "strata_param_set_group": (c_status, [c_voidp, c_uint32, c_uint32]),
    "strata_group_set": (c_status, [c_voidp, c_uint32, ctypes.POINTER(GroupHparams)]),
    "strata_group_get": (c_status, [c_voidp, c_uint32, ctypes.POINTER(GroupHparams)]),
    "strata_group_count": (c_size, [c_voidp]),
    "strata_param_group": (c_uint32, [c_voidp, c_uint32]),
    "strata_engine_agree_on": (c_status, [c_voidp, c_char_p, c_double]),
    "strata_comm_set_timeout": (c_status, [c_voidp, c_double]),
    "strata_engine_finalize": (c_status, [c_voidp]),
    "strata_engine_placement": (c_status, [c_voidp, ctypes.POINTER(c_int), ctypes.POINTER(c_int),
                                           ctypes.POINTER(c_int), c_char_p, c_size]),
    "strata_module_order": (c_status, [c_voidp, ctypes.POINTER(c_uint32), c_size]),
    "strata_fetch": (c_status, [c_voidp, c_uint32]),
    "strata_param_data": (c_voidp, [c_voidp, c_uint32]),
    "strata_grad_data": (c_voidp, [c_voidp, c_uint32]),
    "strata_release": (c_status, [c_voidp, c_uint32]),
    "strata_grads_ready": (c_status, [c_voidp, c_uint32]),
    "strata_grad_store_data": (c_voidp, [c_voidp, c_uint32]),
    "strata_grads_from_host": (c_status, [c_voidp, c_uint32, ctypes.POINTER(c_voidp), c_size]),
    "strata_param_home_data": (c_voidp, [c_voidp, c_uint32]),
    "strata_params_to_host": (c_status, [c_voidp, c_uint32, ctypes.POINTER(c_voidp), c_size]),
    "strata_step_begin": (c_status, [c_voidp, ctypes.POINTER(StepArgs)]),
    "strata_norm_pass_end": (c_status, [c_voidp, ctypes.POINTER(c_double)]),
    "strata_step": (c_status, [c_voidp, ctypes.POINTER(StepArgs), ctypes.POINTER(StepResult)]),
    "strata_loss_scale": (c_double, [c_voidp]),
    "strata_sync": (c_status, [c_voidp]),
    "strata_param_read_master": (c_status, [c_voidp, c_uint32, c_size, c_size, c_voidp]),
    "strata_device_copy": (c_status, [c_voidp, c_voidp, c_voidp, c_size]),
    "strata_compute_stream": (c_voidp, [c_voidp]),
    "strata_act_push": (c_status, [c_voidp, c_voidp, c_size, ctypes.POINTER(ctypes.c_uint64)]),
    "strata_act_pop": (c_status, [c_voidp, ctypes.c_uint64, ctypes.POINTER(c_voidp)]),
    "strata_act_drop": (c_status, [c_voidp, ctypes.c_uint64]),
    "strata_save": (c_status, [c_voidp, c_char_p]),
    "strata_load": (c_status, [c_voidp, c_char_p]),
    "strata_checkpoint_inspect": (c_status, [c_char_p, ctypes.POINTER(CheckpointInfo)]),
    "strata_checkpoint_verify": (c_status, [c_char_p]),
    "strata_checkpoint_latest": (c_status, [c_char_p, c_char_p, c_size]),
    "strata_checkpoint_prune": (c_status, [c_char_p, c_int, ctypes.POINTER(c_int)]),
    "strata_stats_get_sized": (c_status, [c_voidp, ctypes.POINTER(Stats), c_size]),
}


def _declare(lib: ctypes.CDLL) -> None:
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing:
        raise LibraryNotFound("%s lacks %s: it is older than this package; rebuild strata or point STRATA_LIB at "
                              "a current build" % (getattr(lib, "_name", "libstrata"), ", ".join(missing)))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes

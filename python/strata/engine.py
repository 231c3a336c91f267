"""The C engine, one call per method: modules and parameters, parameter groups, fetch / release / grads_ready, step,
save / load.

This is the layer for people who drive strata by hand (as a C trainer does); strata.torch builds the PyTorch
integration on it. Every failed call raises the StrataError subclass of its status with strata_last_error's text.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import sys
import weakref
from types import TracebackType
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence, Type, cast

from . import _lib, _names
from ._typing import StrPath
from .config import Config, ConfigSource
from .errors import InvalidArgument, StateError, StrataError, Unsupported, error_for

# strata_step_args.lr = 0 means "the configured lr"; a step at lr 0 passes the smallest positive double, with which
# every fp32 constant of the update rounds as at lr 0 (strata.h says so).
_SMALLEST_LR = 5e-324

# A host address as ctypes gives it: an int, or None for NULL.
Address = Optional[int]
# init(offset, count, out): fills out (a ctypes array of count floats) with the values of [offset, offset + count).
Initializer = Callable[[int, int, Any], None]


def _raise(status: int, engine_ptr: Optional[ctypes.c_void_p], what: Optional[str]) -> NoReturn:
    """Raises the exception of a failed call: strata_last_error's message (led by what when it does not name it),
    else the status's description."""
    lib = _lib.load()
    last: bytes = lib.strata_last_error(engine_ptr)
    msg = last.decode(errors="replace")
    if what and what not in msg:
        msg = "%s: %s" % (what, msg)
    text: bytes = lib.strata_status_str(status)
    raise error_for(status, msg or text.decode())


def _check(status: int, engine_ptr: Optional[ctypes.c_void_p] = None, what: Optional[str] = None) -> None:
    if status:
        _raise(status, engine_ptr, what)


def _group_hparams(hparams: Mapping[str, float]) -> _lib.GroupHparams:
    """strata_group_hparams from a dict of its fields (each one required: a missing one would be a silent 0)."""
    fields = [field[0] for field in _lib.GroupHparams._fields_]
    missing = [name for name in fields if name not in hparams]
    if missing:
        raise InvalidArgument("a parameter group's hyperparameters lack %s (it needs %s)" % (
            ", ".join(missing), ", ".join(fields)))
    return _lib.GroupHparams(**{name: float(hparams[name]) for name in fields})


class Comm:
    """The data-parallel world: under mpirun the launcher's (MPI initialised with MPI_THREAD_SERIALIZED), else a
    world of 1. One per process; it must outlive its engines."""

    def __init__(self) -> None:
        lib = _lib.load()
        ptr = ctypes.c_void_p()
        _check(lib.strata_comm_create(ctypes.byref(ptr)), None, "strata_comm_create")
        self._ptr: Optional[ctypes.c_void_p] = ptr
        # closed before the comm: an engine must not outlive its world
        self._engines: weakref.WeakSet[Engine] = weakref.WeakSet()

    @property
    def ptr(self) -> Optional[ctypes.c_void_p]:
        return self._ptr

    @property
    def rank(self) -> int:
        return int(_lib.load().strata_comm_rank(self._ptr))

    @property
    def size(self) -> int:
        return int(_lib.load().strata_comm_size(self._ptr))

    @property
    def local_rank(self) -> int:
        return int(_lib.load().strata_comm_local_rank(self._ptr))

    def allreduce_sum(self, values: Sequence[float]) -> List[float]:
        """Sums a list of floats across the world (every rank gets the sums); a collective."""
        arr = (ctypes.c_double * len(values))(*values)
        _check(_lib.load().strata_comm_allreduce_sum(self._ptr, arr, len(values)), None, "allreduce_sum")
        return list(arr)

    def abort(self, why: object) -> None:
        """This rank failed outside strata: every other rank's collectives fail at once, naming it."""
        if self._ptr:
            _lib.load().strata_comm_abort(self._ptr, str(why).encode())

    def close(self) -> None:
        """Closes the engines of this world, then the world (MPI_Finalize under mpirun)."""
        if self._ptr:
            for engine in list(self._engines):
                engine.close()
            _lib.load().strata_comm_destroy(self._ptr)
            self._ptr = None


_world: Optional[Comm] = None


def check_launcher(comm: Comm) -> None:
    """Refuses a world that is not the one the launcher made: torchrun, accelerate launch and the deepspeed launcher
    start N processes with WORLD_SIZE=N (and RANK, LOCAL_RANK, MASTER_ADDR / MASTER_PORT for torch.distributed),
    but strata takes its ranks from MPI, so each of those processes would train alone as rank 0 of 1. Raises
    Unsupported when WORLD_SIZE > 1 and comm has another size (under mpirun, which sets OMPI_COMM_WORLD_SIZE, a
    WORLD_SIZE that agrees is fine)."""
    text = os.environ.get("WORLD_SIZE", "")
    try:
        size = int(text)
    except ValueError:
        return
    if size > 1 and comm.size != size:
        raise Unsupported(
            "strata: the environment says WORLD_SIZE=%d (RANK=%s, LOCAL_RANK=%s: a torchrun, accelerate launch or "
            "deepspeed launcher world) but strata's world has %d rank(s): strata forms its world from MPI, not from "
            "torch.distributed (RANK, MASTER_ADDR and MASTER_PORT are not read), so each process would train alone "
            "as rank 0; hint: launch with mpirun -np %d python ..." % (
                size, os.environ.get("RANK", "?"), os.environ.get("LOCAL_RANK", "?"), comm.size, size))


def world() -> Comm:
    """The process's Comm, created on first use and closed at exit (after its engines). With several ranks, an
    exception that ends this process fails the world first (Comm.abort): the other ranks' next collective raises
    CommError naming this rank and its exception at once, instead of waiting out the timeout, and no rank's exit
    waits in MPI_Finalize for a rank that is gone. Raises Unsupported, at every call, in a torchrun-style world
    that is not strata's (check_launcher)."""
    global _world
    if _world is None:
        comm = _world = Comm()
        atexit.register(comm.close)
        if comm.size > 1:
            previous = sys.excepthook

            def fail_world(kind: Type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
                comm.abort("%s: %s" % (kind.__name__, value))
                previous(kind, value, tb)
            sys.excepthook = fail_world
    check_launcher(_world)
    return _world


def _make_nvme_dirs(config: Config) -> None:
    """Creates the NVMe tiers' missing directories, as DeepSpeed creates its swap folders (libstrata itself wants
    them to exist, and still checks what they are); with "auto" too, which may place the tier there."""
    for tier in ("offload_param", "offload_optimizer"):
        if config.resolved.get("zero_optimization.%s.device" % tier) in ("nvme", "auto"):
            for path in config.resolved.get("zero_optimization.%s.nvme_path" % tier) or []:
                os.makedirs(path, exist_ok=True)


class Engine:
    """One strata engine (strata_engine_create, or _ranked with comm)."""

    def __init__(self, config: ConfigSource, comm: Optional[Comm] = None) -> None:
        self.config = config if isinstance(config, Config) else Config(config)
        _make_nvme_dirs(self.config)
        lib = self._lib = _lib.load()
        ptr = ctypes.c_void_p()
        if comm is not None and comm.size > 1:
            _check(lib.strata_engine_create_ranked(self.config.c_config, comm.ptr, None, ctypes.byref(ptr)),
                   None, "strata_engine_create")
        else:
            _check(lib.strata_engine_create(self.config.c_config, ctypes.byref(ptr)), None, "strata_engine_create")
        self._ptr: Optional[ctypes.c_void_p] = ptr
        self.comm = comm
        if comm is not None:
            comm._engines.add(self)
        self._init_fns: List[Any] = []  # ctypes callbacks must outlive finalize
        self.init_error: Optional[BaseException] = None
        self.finalized = False

    # ---------------------------------------------------------------- life

    def close(self) -> None:
        """Drains in-flight work and frees the engine (also when garbage-collected)."""
        if getattr(self, "_ptr", None):
            self._lib.strata_engine_destroy(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        self.close()

    def _p(self) -> ctypes.c_void_p:
        if not self._ptr:
            raise StateError("the strata engine is closed")
        return self._ptr

    def _check(self, status: int, what: str) -> None:
        _check(status, self._ptr, what)

    def _refuse_now(self, what: str) -> NoReturn:
        """Raises what strata_last_error says about a call that answered NULL: the call was not allowed now."""
        _raise(_names.status_code(StateError.status), self._ptr, what)

    @property
    def backend(self) -> str:
        """"host" or "cuda": the backend the engine runs on."""
        return _names.backend_name(self._lib.strata_engine_backend(self._p()))

    def placement(self) -> Dict[str, str]:
        """Where finalize put each state class (an offload device "auto" resolved) and why: a dict with "param",
        "optimizer", "gradients" ("device", "host" or "nvme") and "reason" ("" unless a device was "auto")."""
        tiers = [ctypes.c_int() for _ in range(3)]
        reason = ctypes.create_string_buffer(1024)
        self._check(self._lib.strata_engine_placement(self._p(), *[ctypes.byref(t) for t in tiers], reason,
                                                      len(reason)), "strata_engine_placement")
        out = {k: _names.tier_name(t.value) for k, t in zip(("param", "optimizer", "gradients"), tiers)}
        out["reason"] = reason.value.decode(errors="replace")
        return out

    @property
    def param_dtype(self) -> str:
        return self.config.param_dtype

    # ---------------------------------------------------------------- the model

    def add_module(self, name: str) -> int:
        out = ctypes.c_uint32()
        self._check(self._lib.strata_module_add(self._p(), name.encode(), ctypes.byref(out)),
                    "strata_module_add(%r)" % name)
        return out.value

    def freeze_module(self, module: int) -> None:
        """Freezes module (before finalize): its parameters are partitioned, tiered, fetched and checkpointed like
        any other's, but have no gradient buffers and no optimizer state (strata_module_freeze). Its parameters
        must not be handed gradients (grad_data refuses them); read_master reads them widened to fp32."""
        self._check(self._lib.strata_module_freeze(self._p(), module), "strata_module_freeze(%d)" % module)

    def module_frozen(self, module: int) -> bool:
        return bool(self._lib.strata_module_frozen(self._p(), module))

    def add_param(self, module: int, name: str, numel: int, init: Optional[Initializer] = None) -> int:
        """Adds a parameter of numel elements. init(offset, count, out) fills a ctypes float array of count
        elements with the initial values of [offset, offset + count) (None: zeros)."""
        fn = _lib.INIT_FN()
        if init is not None:
            failed = _names.status_code(StrataError.status)

            def trampoline(ctx: Address, param: int, offset: int, count: int, out: Any,
                           _init: Initializer = init) -> int:
                try:
                    _init(offset, count, ctypes.cast(out, ctypes.POINTER(ctypes.c_float * count)).contents)
                    return 0
                except Exception as e:  # a failing initializer aborts finalize with its message
                    self.init_error = e
                    return failed
            fn = _lib.INIT_FN(trampoline)
            self._init_fns.append(fn)
        out = ctypes.c_uint32()
        self._check(self._lib.strata_param_add(self._p(), module, name.encode(), numel, fn, None, ctypes.byref(out)),
                    "strata_param_add(%r)" % name)
        return out.value

    def set_param_shape(self, param: int, shape: Sequence[int]) -> None:
        """Declares param's shape in the model (a sequence of 1 to 8 dims whose product is its numel; before
        finalize): checkpoints record it, `strata ckpt export` writes the tensor in it, and a load refuses a
        checkpoint of another shape."""
        dims = [int(d) for d in shape]
        arr = (ctypes.c_int64 * max(len(dims), 1))(*dims)
        self._check(self._lib.strata_param_set_shape(self._p(), param, len(dims), arr),
                    "strata_param_set_shape(%r)" % (tuple(dims),))

    # ---------------------------------------------------------------- parameter groups
    # A group's hyperparameters are a dict of strata_group_hparams' fields: lr, weight_decay, beta1, beta2, eps.

    def add_group(self, name: str, hparams: Mapping[str, float]) -> int:
        """Adds a parameter group (before finalize; name unique); returns its id (1, 2, ...). Group 0, "default",
        holds the config's optimizer.params and every parameter not put in another."""
        out = ctypes.c_uint32()
        self._check(self._lib.strata_group_add(self._p(), name.encode(), ctypes.byref(_group_hparams(hparams)),
                                               ctypes.byref(out)), "strata_group_add(%r)" % name)
        return out.value

    def set_param_group(self, param: int, group: int) -> None:
        """Puts param in group (before finalize); a parameter is in one group."""
        self._check(self._lib.strata_param_set_group(self._p(), param, group), "strata_param_set_group")

    def set_group(self, group: int, hparams: Mapping[str, float]) -> None:
        """Replaces group's hyperparameters: before finalize, or between steps (the next step takes them)."""
        self._check(self._lib.strata_group_set(self._p(), group, ctypes.byref(_group_hparams(hparams))),
                    "strata_group_set(%d)" % group)

    def group(self, group: int) -> Dict[str, float]:
        """group's current hyperparameters (group 0's are the config's until set)."""
        out = _lib.GroupHparams()
        self._check(self._lib.strata_group_get(self._p(), group, ctypes.byref(out)), "strata_group_get(%d)" % group)
        return _lib.as_dict(out)

    def group_count(self) -> int:
        return int(self._lib.strata_group_count(self._p()))

    def param_group(self, param: int) -> int:
        """The group param is in (0 unless set)."""
        return int(self._lib.strata_param_group(self._p(), param))

    def agree_on(self, name: str, value: float) -> None:
        """Declares a value of the trainer's that every rank must share (before finalize, which compares it across
        ranks and fails every rank naming both values when they differ)."""
        self._check(self._lib.strata_engine_agree_on(self._p(), name.encode(), float(value)),
                    "strata_engine_agree_on(%r)" % name)

    def finalize(self) -> None:
        self.init_error = None
        st = self._lib.strata_engine_finalize(self._p())
        if st and self.init_error is not None:
            raise self.init_error
        self._check(st, "strata_engine_finalize")
        self._init_fns.clear()
        self.finalized = True

    def module_order(self, order: Sequence[int]) -> None:
        arr = (ctypes.c_uint32 * len(order))(*order)
        self._check(self._lib.strata_module_order(self._p(), arr, len(order)), "strata_module_order")

    # ---------------------------------------------------------------- the step

    def fetch(self, module: int) -> None:
        self._check(self._lib.strata_fetch(self._p(), module), "strata_fetch")

    def release(self, module: int) -> None:
        self._check(self._lib.strata_release(self._p(), module), "strata_release")

    def param_data(self, param: int) -> int:
        """The address of a fetched parameter (param_dtype elements, on the engine's device)."""
        ptr: Address = self._lib.strata_param_data(self._p(), param)
        if not ptr:
            self._refuse_now("strata_param_data")
        return ptr

    def grad_data(self, param: int) -> int:
        ptr: Address = self._lib.strata_grad_data(self._p(), param)
        if not ptr:
            self._refuse_now("strata_grad_data")
        return ptr

    def grads_ready(self, module: int) -> None:
        self._check(self._lib.strata_grads_ready(self._p(), module), "strata_grads_ready")

    # Host arrays exchanged with the stores directly, without the device (strata.h): addresses are ints, None
    # where there is no array (a parameter without a gradient; a weight not wanted).

    def grad_store_data(self, param: int) -> Address:
        """The host address of param's fp32 gradients in the store they accumulate into now, or None (the store
        is on NVMe; several ranks; step in backward). Ask again after each step with the delayed update."""
        address: Address = self._lib.strata_grad_store_data(self._p(), param)
        return address or None

    def grads_from_host(self, module: int, addresses: Sequence[Address]) -> None:
        """Accumulates module's gradients from host arrays (one address or None per parameter, in add order)."""
        arr = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
        self._check(self._lib.strata_grads_from_host(self._p(), module, arr, len(addresses)),
                    "strata_grads_from_host")

    def param_home_data(self, param: int) -> Address:
        """The host address of param's weights in the parameter tier (what strata_step overwrites), or None (on
        NVMe or the device). Ask again after each step and sync with the delayed update, and after load."""
        address: Address = self._lib.strata_param_home_data(self._p(), param)
        return address or None

    def params_to_host(self, module: int, addresses: Sequence[Address]) -> None:
        """Copies module's visible weights into host arrays (one address or None per parameter, in add order)."""
        arr = (ctypes.c_void_p * max(len(addresses), 1))(*addresses)
        self._check(self._lib.strata_params_to_host(self._p(), module, arr, len(addresses)), "strata_params_to_host")

    def step_begin(self, lr: Optional[float] = None) -> None:
        """Begins a step at lr (as step()) before its backward: required with strata.step_in_backward, where each
        module's update runs during backward; a no-op otherwise. Pass step() the same lr (or None). The groups'
        values (set_group) are taken here with step_in_backward: set them before."""
        if lr is None:
            lr = 0.0
        elif lr == 0:
            lr = _SMALLEST_LR
        args = _lib.StepArgs(lr=float(lr))
        self._check(self._lib.strata_step_begin(self._p(), ctypes.byref(args)), "strata_step_begin")

    def norm_pass_end(self) -> float:
        """Ends the step's norm pass (strata.norm_pass, with step_in_backward and gradient clipping): after
        step_begin the trainer ran the step's forward and backward once, and each hand-over was only measured.
        Returns the global gradient norm the step is decided from; then run forward and backward again on the same
        batch (the updates run, clipped, and each hand-over must repeat the first's gradients) and step()."""
        norm = ctypes.c_double(-1)
        self._check(self._lib.strata_norm_pass_end(self._p(), ctypes.byref(norm)), "strata_norm_pass_end")
        return norm.value

    def step(self, lr: Optional[float] = None) -> Dict[str, Any]:
        """Runs the optimizer over the accumulated gradients at lr (None: the configured one; 0 is a step at lr 0,
        as a schedule may reach: the moments advance, the weights stay). lr is group 0's: with several parameter
        groups pass None, each group's lr set with set_group before the step. Returns a dict: step, skipped,
        delayed, grad_norm, loss_scale."""
        if lr is None:
            lr = 0.0  # the C API's "configured"
        elif lr == 0:
            lr = _SMALLEST_LR
        args, res = _lib.StepArgs(lr=float(lr)), _lib.StepResult()
        self._check(self._lib.strata_step(self._p(), ctypes.byref(args), ctypes.byref(res)), "strata_step")
        return {"step": res.step, "skipped": res.skipped, "delayed": res.delayed, "grad_norm": res.grad_norm,
                "loss_scale": res.loss_scale}

    def loss_scale(self) -> float:
        return float(self._lib.strata_loss_scale(self._p()))

    def sync(self) -> None:
        self._check(self._lib.strata_sync(self._p()), "strata_sync")

    def read_master(self, param: int, offset: int, count: int, out_address: int) -> None:
        """Copies count fp32 master weights from offset into the memory at out_address."""
        self._check(self._lib.strata_param_read_master(self._p(), param, offset, count, out_address),
                    "strata_param_read_master")

    def device_copy(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self._lib.strata_device_copy(self._p(), dst, src, nbytes), "strata_device_copy")

    def compute_stream(self) -> Address:
        """The native stream to compute on (a cudaStream_t as an int on CUDA; None on the host backend)."""
        stream: Address = self._lib.strata_compute_stream(self._p())
        return stream

    # ---------------------------------------------------------------- offloaded activations

    def act_push(self, address: int, nbytes: int) -> int:
        """Keeps nbytes of device memory at address until backward (strata.offload_activations); returns the handle.
        The memory stays strata's to read until the next act_push or act_pop."""
        h = ctypes.c_uint64()
        self._check(self._lib.strata_act_push(self._p(), address, nbytes, ctypes.byref(h)), "strata_act_push")
        return h.value

    def act_pop(self, handle: int) -> int:
        """The address of the kept activation's device copy, valid until act_drop(handle)."""
        out = ctypes.c_void_p()
        self._check(self._lib.strata_act_pop(self._p(), handle, ctypes.byref(out)), "strata_act_pop")
        return cast(int, out.value)  # set when the call succeeds (strata.h)

    def act_drop(self, handle: int) -> None:
        self._check(self._lib.strata_act_drop(self._p(), handle), "strata_act_drop")

    # ---------------------------------------------------------------- checkpoints and stats

    def save(self, directory: StrPath) -> None:
        self._check(self._lib.strata_save(self._p(), os.fspath(directory).encode()), "strata_save")

    def load(self, directory: StrPath) -> None:
        self._check(self._lib.strata_load(self._p(), os.fspath(directory).encode()), "strata_load")

    def stats(self) -> Dict[str, Any]:
        s = _lib.Stats()
        self._check(self._lib.strata_stats_get_sized(self._p(), ctypes.byref(s), ctypes.sizeof(s)),
                    "strata_stats_get")
        out = _lib.as_dict(s)
        out["adam_cores"] = out["adam_cores"].decode()  # "0-7": the cores this rank's Adam threads are bound to
        return out

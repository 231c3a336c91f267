"""strata.torch.zero_init: build a model larger than host memory (DeepSpeed's zero.Init, for strata).

    with strata.torch.zero_init(config):
        model = LlamaForCausalLM(llama_config)      # or any nn.Module; its constructors initialise as usual
    engine, optimizer, _, _ = strata.torch.initialize(model=model, config=config)

Inside the block every CPU tensor of min_bytes or more that a factory (torch.empty, zeros, randn, ..., new_empty,
empty_like) or a conversion (Tensor.to, float, clone, ...) makes is put in a file-backed shared mapping of its own,
on disk (the staging directory), instead of anonymous memory; and after each torch operation that touched such a
tensor (an initialiser's normal_, a post_init's zero_) its pages are given back to the kernel (madvise
MADV_DONTNEED), which keeps the values in the file. The constructors run unchanged, in the same order, on the same
random generator, so the weights are bit-identical to a plain construction; but the process holds at most the
tensors an operation is using at once, not the model. initialize then reads each parameter chunk by chunk into
strata's tiers, giving the pages back as it goes, and the staging files, already unlinked, vanish with the last
reference to their tensors.

Where strata's ranks each build the model, each stages its own copy. The staging directory is staging_dir, else
the config's zero_optimization.offload_param.nvme_path, else offload_optimizer's, else the system's temporary
directory; a directory on a RAM file system (tmpfs) is refused, as its "disk" is memory.
"""
from __future__ import annotations

import bisect
import mmap
import os
import tempfile
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Type

import torch
from torch.overrides import TorchFunctionMode

from ..config import ConfigSource, read_document
from ..errors import ConfigError, InvalidArgument, IOFailure, OutOfMemory

_PAGE = mmap.PAGESIZE
_RAM_FILE_SYSTEMS = ("tmpfs", "ramfs")

# The calls whose result is a new tensor that may be a parameter (a factory), and those of them whose values need
# not be computed (a fresh file reads as zeros): the empty twin they are made with instead.
_FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint, torch.normal,
              torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.rand_like, torch.randn_like,
              torch.empty_strided, torch.Tensor.new_empty, torch.Tensor.new_zeros, torch.Tensor.new_ones,
              torch.Tensor.new_full, torch.Tensor.new_tensor, torch.tensor, torch.clone, torch.Tensor.clone,
              torch.Tensor.to, torch.Tensor.type, torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16,
              torch.Tensor.double, torch.Tensor.contiguous}
_ZEROS_AS_EMPTY = {torch.zeros: torch.empty, torch.zeros_like: torch.empty_like,
                   torch.Tensor.new_zeros: torch.Tensor.new_empty}
_EMPTY = {torch.empty, torch.empty_like, torch.Tensor.new_empty}


class _Region:
    """One staged tensor's mapping, held weakly: the tensors made over it keep it alive (torch.frombuffer holds its
    object), and it unmaps itself, its unlinked file going with it, when the last of them goes."""

    __slots__ = ("start", "end", "map")

    def __init__(self, start: int, end: int, mapping: mmap.mmap) -> None:
        self.start, self.end = start, end
        self.map: Callable[[], Optional[mmap.mmap]] = weakref.ref(mapping)


class _Staging:
    """Every staged mapping of the process, by address (tensors outlive the block that made them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: List[int] = []
        self.regions: List[_Region] = []

    def add(self, region: _Region) -> None:
        with self.lock:
            self._forget_dead()
            i = bisect.bisect(self.starts, region.start)
            self.starts.insert(i, region.start)
            self.regions.insert(i, region)

    def find(self, address: int) -> Optional[mmap.mmap]:
        """The live mapping holding address, or None."""
        with self.lock:
            i = bisect.bisect(self.starts, address) - 1
            if i >= 0 and address < self.regions[i].end:
                return self.regions[i].map()
        return None

    def staged_bytes(self) -> int:
        with self.lock:
            self._forget_dead()
            return sum(r.end - r.start for r in self.regions)

    def _forget_dead(self) -> None:
        """Drops the regions whose mapping is gone (its address may be reused by the next one)."""
        self.regions = [r for r in self.regions if r.map() is not None]
        self.starts = [r.start for r in self.regions]


_STAGING = _Staging()


def drop_pages(t: torch.Tensor) -> None:
    """Gives the pages of t's staging mapping back to the kernel (the values stay in its file); nothing for a tensor
    that is not staged."""
    if t.device.type != "cpu" or t.numel() == 0:
        return
    mapping = _STAGING.find(t.data_ptr())
    if mapping is not None:
        mapping.madvise(mmap.MADV_DONTNEED)


def staged_bytes() -> int:
    """The bytes of staged tensors still alive in this process."""
    return _STAGING.staged_bytes()


def _file_system(path: str) -> str:
    """The type of the file system holding path (/proc/self/mounts' longest mount point above it), or ""."""
    best, kind = "", ""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return ""
    return kind


def _staging_dir(staging_dir: Optional[str], config: ConfigSource) -> str:
    where = "staging_dir"
    path = staging_dir
    if path is None and config is not None:
        zero = read_document(config)[1].get("zero_optimization", {})
        for section in ("offload_param", "offload_optimizer"):
            nvme = (zero.get(section) or {}).get("nvme_path")
            if isinstance(nvme, list):
                nvme = nvme[0] if nvme else None
            if nvme:
                path, where = nvme, "zero_optimization.%s.nvme_path" % section
                break
    if path is None:
        path, where = tempfile.gettempdir(), "the temporary directory"
    path = os.path.realpath(os.fspath(path))
    if not os.path.isdir(path):
        raise InvalidArgument("strata.torch.zero_init: %s %s is not a directory; hint: make it, or pass staging_dir= "
                              "(a directory on a disk with room for the model's parameters)" % (where, path))
    kind = _file_system(path)
    if kind in _RAM_FILE_SYSTEMS:
        raise ConfigError("strata.torch.zero_init: %s %s is on %s, which keeps files in memory: staging the model "
                          "there holds it in RAM; hint: pass staging_dir= a directory on a disk (or set "
                          "zero_optimization.offload_param.nvme_path)" % (where, path, kind))
    return path


class zero_init:
    """Builds the modules constructed inside it with their large tensors staged on disk (module docstring).

    config / config_dict_or_path: the DeepSpeed-style config initialize will get (read for its nvme_path only).
    staging_dir: where the staged tensors' files go (default above). min_bytes: tensors smaller than this stay in
    memory (biases, norms). enabled=False makes the block do nothing, as DeepSpeed's.
    DeepSpeed's other arguments of zero.Init are refused unless left at their defaults: strata places each state
    class by the config's zero_optimization when initialize plans the engine, not while the model is built.
    After the block: staged_tensors and staged_bytes say what it staged."""

    def __init__(self, config: ConfigSource = None, *, config_dict_or_path: ConfigSource = None,
                 staging_dir: Optional[str] = None, enabled: bool = True, min_bytes: int = 1 << 20,
                 **deepspeed_kwargs: Any) -> None:
        if config is not None and config_dict_or_path is not None:
            raise InvalidArgument("strata.torch.zero_init: give config or config_dict_or_path, not both")
        _refuse_deepspeed_kwargs(deepspeed_kwargs)
        if not isinstance(min_bytes, int) or min_bytes < 1:
            raise InvalidArgument("strata.torch.zero_init: min_bytes = %r must be an integer >= 1" % (min_bytes,))
        self.enabled = bool(enabled)
        self.min_bytes = min_bytes
        self.dir = _staging_dir(staging_dir, config if config is not None else config_dict_or_path) \
            if self.enabled else ""
        self.staged_tensors = 0
        self.staged_bytes = 0
        self._mode: Optional[_StagingMode] = None

    def __enter__(self) -> "zero_init":
        if self.enabled:
            self._mode = _StagingMode(self)
            self._mode.__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Any) -> None:
        if self._mode is not None:
            self._mode.__exit__(kind, value, tb)  # type: ignore[no-untyped-call]
            self._mode = None

    def stage(self, t: torch.Tensor, fresh: bool) -> torch.Tensor:
        """t in a staging mapping of its own (fresh: t's values need not be copied: it was made empty), or t itself
        when it is not to be staged."""
        if (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)) or t.device.type != "cpu" \
                or t.layout != torch.strided or not t.is_contiguous() or t.numel() == 0 or t.grad_fn is not None:
            return t
        nbytes = t.numel() * t.element_size()
        if nbytes < self.min_bytes or _STAGING.find(t.data_ptr()) is not None:
            return t
        mapping = self._map(nbytes)
        staged: torch.Tensor = torch.frombuffer(mapping, dtype=t.dtype, count=t.numel()).view(t.shape)
        _STAGING.add(_Region(staged.data_ptr(), staged.data_ptr() + len(mapping), mapping))
        if not fresh:
            with torch.no_grad():
                staged.copy_(t)
        if t.requires_grad:
            staged.requires_grad_(True)
        self.staged_tensors += 1
        self.staged_bytes += nbytes
        mapping.madvise(mmap.MADV_DONTNEED)
        return staged

    def _map(self, nbytes: int) -> mmap.mmap:
        length = -(-nbytes // _PAGE) * _PAGE
        try:
            fd, path = tempfile.mkstemp(prefix=".strata-zero-init-", dir=self.dir)
        except OSError as e:
            raise IOFailure("strata.torch.zero_init: cannot make a staging file in %s: %s; hint: pass staging_dir= a "
                            "writable directory" % (self.dir, e.strerror or e)) from None
        try:
            os.unlink(path)  # lives while mapped: nothing is left behind, whatever happens
            try:
                os.posix_fallocate(fd, 0, length)  # the blocks now, so a full disk is an error, not a SIGBUS later
            except OSError as e:
                free = os.statvfs(self.dir)
                raise OutOfMemory("strata.torch.zero_init: no room in %s for a tensor of %d bytes (%d bytes free, %d "
                                  "staged so far): %s; hint: pass staging_dir= a disk with room for the model's "
                                  "parameters" % (self.dir, nbytes, free.f_bavail * free.f_frsize, self.staged_bytes,
                                                  e.strerror or e)) from None
            return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)


Init = zero_init  # DeepSpeed's name, deepspeed.zero.Init


_DEEPSPEED_DEFAULTS: Dict[str, Any] = {"module": None, "data_parallel_group": None, "mem_efficient_linear": True,
                                       "remote_device": None, "pin_memory": False, "config": None, "dtype": None,
                                       "mpu": None, "zero_param_parallel_group": None,
                                       "zero_quantized_weights": False, "zero_quantized_nontrainable_weights": False,
                                       "sequence_data_parallel_group": None, "param_swapper": None}


def _refuse_deepspeed_kwargs(kwargs: Dict[str, Any]) -> None:
    for key, value in kwargs.items():
        if key not in _DEEPSPEED_DEFAULTS:
            raise InvalidArgument("strata.torch.zero_init: unknown argument %s=; it takes config, staging_dir, "
                                  "enabled and min_bytes" % key)
        if value is not _DEEPSPEED_DEFAULTS[key] and value != _DEEPSPEED_DEFAULTS[key]:
            raise InvalidArgument("strata.torch.zero_init: %s=%r is DeepSpeed's, which strata does not take: strata "
                                  "places parameters (tier, dtype, ranks' partitions) by the config when initialize "
                                  "plans the engine; hint: drop %s= and say it in the config's zero_optimization"
                                  % (key, value, key))


def _tensors_in(values: Iterable[Any]) -> List[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


class _StagingMode(TorchFunctionMode):
    """zero_init's hook on torch operations: stages what factories make, gives back the pages each operation
    touched. An operation inside another (kaiming_uniform_'s uniform_) runs untouched: the outer one is handled."""

    def __init__(self, owner: zero_init) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.owner = owner
        self.busy = threading.local()

    def __torch_function__(self, func: Any, types: Tuple[Any, ...], args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        if getattr(self.busy, "on", False):
            return func(*args, **kwargs)
        self.busy.on = True
        try:
            if func in _ZEROS_AS_EMPTY:  # made empty: a staged tensor's fresh file reads as zeros
                out = self.owner.stage(_ZEROS_AS_EMPTY[func](*args, **kwargs), fresh=True)
                if _STAGING.find(out.data_ptr()) is None:
                    out = func(*args, **kwargs)  # not staged (small, not on the CPU): the real zeros
            else:
                out = func(*args, **kwargs)
                if func in _FACTORIES and isinstance(out, torch.Tensor) and out.numel() > 0 and \
                        out.data_ptr() not in {t.data_ptr() for t in _tensors_in(args)}:  # a new tensor
                    out = self.owner.stage(out, fresh=func in _EMPTY)
            for t in _tensors_in(list(args) + list(kwargs.values()) + [out]):
                drop_pages(t)
            return out
        finally:
            self.busy.on = False

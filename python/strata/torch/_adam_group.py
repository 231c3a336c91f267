"""One OffloadAdam parameter group on its own strata engine.

Each param group gets an engine: OffloadAdam's groups may differ in what strata's engine holds for all its
parameters alike (their precision and device, bias_correction, Adam or AdamW; strata's own parameter groups differ
in lr, weight_decay, betas and eps only). The group's parameters become strata parameters packed into strata modules of at most bucket_bytes;
a tensor larger than a bucket is cut into chunks, each a strata parameter of its own, so that no module (and so no
device window) grows with the largest tensor. Element order is the tensors' logical (row-major) order everywhere:
the initial values, the gradients and the weights copied back.

Each step is three passes over the modules, in one order that strata prefetches along (declared with
strata_module_order; the passes repeat it, as micro-batches would):
    gradients in:  fetch -> copy .grad into strata's gradient buffer -> grads_ready -> release
    strata_step(lr)      (with the delayed update: hands the update to strata's thread and returns)
    weights out:   fetch -> copy what strata makes visible into the parameter -> release
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

import torch

from ..engine import Engine
from ..errors import StateError
from . import _adam_config, _adam_memory
from ._adam_host import HostExchange

_PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16"}


class Chunk(NamedTuple):
    """A run of one tensor's elements that is a strata parameter of its own."""
    param: int   # the tensor's index in the group
    offset: int  # its first element in the tensor
    numel: int
    pid: int     # the strata parameter


def hyperparameters(group: Dict[str, Any]) -> Dict[str, Any]:
    """What an engine is built with (everything but the lr, which each step passes)."""
    b1, b2 = group["betas"]
    return {"betas": (float(b1), float(b2)), "eps": float(group["eps"]),
            "weight_decay": float(group["weight_decay"]), "adamw_mode": bool(group["adamw_mode"]),
            "bias_correction": bool(group.get("bias_correction", True))}  # absent in state_dicts before issue 22


def plan_modules(numels: List[int], elem_bytes: int, bucket_bytes: int) -> List[List[Tuple[int, int, int]]]:
    """[[(param index, offset, numel), ...] per module]: tensors in order, cut to at most a bucket each, packed."""
    cap = max(1, bucket_bytes // elem_bytes)
    modules: List[List[Tuple[int, int, int]]] = []
    current: List[Tuple[int, int, int]] = []
    used = 0
    for index, numel in enumerate(numels):
        for offset in range(0, numel, cap):
            n = min(cap, numel - offset)
            if current and used + n > cap:
                modules.append(current)
                current, used = [], 0
            current.append((index, offset, n))
            used += n
    if current:
        modules.append(current)
    return modules


class GroupEngine:
    """The strata engine of one param group: built from the group's tensors, which give the initial weights."""

    def __init__(self, params: Iterable[torch.Tensor], group: Dict[str, Any], user_doc: Dict[str, Any],
                 bucket_bytes: int, delayed_update: Optional[bool], label: str) -> None:
        self.params = list(params)
        self.label = label
        self.hp = hyperparameters(group)
        self.bucket_bytes = bucket_bytes
        first = self.params[0]
        self.dtype, self.device = first.dtype, first.device
        self.precision = _PRECISION[self.dtype]
        elem = first.element_size()
        plan = plan_modules([p.numel() for p in self.params], elem, bucket_bytes)
        largest = max(_adam_config.module_bytes([n for _, _, n in m], elem) for m in plan)
        doc = _adam_config.group_document(user_doc, dict(self.hp, lr=group["lr"]), self.precision, self.device,
                                          largest, delayed_update, label, sum(p.numel() for p in self.params))
        self.engine = Engine(doc)
        self.delayed = bool(self.engine.config.resolved.get("strata.delayed_update"))
        self.modules: List[Tuple[int, List[Chunk]]] = []  # (module id, [Chunk]) in step order
        # (param index, its fp32 host copy) while finalize reads initial values
        self._cache: Tuple[Optional[int], Optional[torch.Tensor]] = (None, None)
        try:
            for k, planned in enumerate(plan):
                mid = self.engine.add_module("bucket%d" % k)
                chunks = []
                for index, offset, numel in planned:
                    name = "p%d" % index if numel == self.params[index].numel() else "p%d@%d" % (index, offset)
                    pid = self.engine.add_param(mid, name, numel, self._initializer(index, offset))
                    chunks.append(Chunk(index, offset, numel, pid))
                self.modules.append((mid, chunks))
            self.engine.finalize()
            if self.device.type != "cpu":  # CPU tensors never fetch: an order would only start useless prefetches
                self.engine.module_order([mid for mid, _ in self.modules])
        finally:
            self._cache = (None, None)
        self.memory = _adam_memory.for_device(self.engine, self.device)
        # CPU tensors exchange with strata's stores directly (and alias them where they can); CUDA tensors through
        # strata's device window.
        self.host = HostExchange(self) if self.device.type == "cpu" else None

    def _initializer(self, index: int, offset: int) -> Callable[[int, int, Any], None]:
        def init(at: int, count: int, out: Any) -> None:
            cached_index, host = self._cache
            if cached_index != index or host is None:
                host = self.params[index].detach().reshape(-1).to("cpu", torch.float32).contiguous()
                self._cache = (index, host)
            view = torch.frombuffer(out, dtype=torch.float32)
            view.copy_(host[offset + at:offset + at + count])
        return init

    def layout(self) -> Dict[str, Any]:
        """What a checkpoint of this engine must match to load: precision, shapes and the bucket size."""
        return {"precision": self.precision, "shapes": [list(p.shape) for p in self.params],
                "bucket_bytes": self.bucket_bytes}

    # ---------------------------------------------------------------- the step

    def push_grads(self) -> None:
        """Copies every .grad into strata's gradient buffers. A parameter without one contributes zeros."""
        if self.host is not None:
            return self.host.push_grads()
        flat: List[Optional[torch.Tensor]] = [None if p.grad is None else p.grad.detach().reshape(-1) for p in self.params]
        with self.memory.exchange():
            for mid, chunks in self.modules:
                self.engine.fetch(mid)
                try:
                    took = False
                    for c in chunks:
                        grad = flat[c.param]
                        if grad is None:
                            continue
                        self.memory.keep(grad)
                        self.memory.tensor(self.engine.grad_data(c.pid), c.numel, self.dtype).copy_(
                            grad[c.offset:c.offset + c.numel])
                        took = True
                    if took:
                        self.engine.grads_ready(mid)
                finally:
                    self.engine.release(mid)

    def step(self, lr: float) -> Dict[str, Any]:
        result = self.engine.step(lr=lr)  # a float: 0 is a step at lr 0 (strata.Engine.step)
        if self.host is not None:
            self.host.after_step()
        return result

    def pull_weights(self) -> None:
        """Copies the weights strata makes visible into the parameters (in place: references to them stay valid)."""
        if self.host is not None:
            return self.host.pull_weights()
        targets: List[torch.Tensor] = []
        for p in self.params:
            data = p.detach()
            targets.append(data.view(-1) if data.is_contiguous() else torch.empty(
                data.numel(), dtype=data.dtype, device=data.device))
        with self.memory.exchange():
            for mid, chunks in self.modules:
                self.engine.fetch(mid)
                try:
                    for c in chunks:
                        targets[c.param][c.offset:c.offset + c.numel].copy_(
                            self.memory.tensor(self.engine.param_data(c.pid), c.numel, self.dtype))
                finally:
                    self.engine.release(mid)
        for p, flat in zip(self.params, targets):
            if not p.detach().is_contiguous():
                p.detach().copy_(flat.view(p.shape))

    def sync(self) -> None:
        """Lets a delayed update in flight finish and become visible, then copies the weights out."""
        self.engine.sync()
        self.pull_weights()

    # ---------------------------------------------------------------- checkpoints

    def save(self, directory: str) -> None:
        self.engine.save(directory)

    def load(self, directory: str) -> None:
        self.engine.load(directory)
        if self.host is not None:
            self.host.bind()
        self.pull_weights()

    def close(self) -> None:
        if getattr(self, "engine", None) is not None:
            # A view of strata's memory that is still alive (the user's) keeps the engine until it goes.
            host = getattr(self, "host", None)
            if host is None or not host.release():
                self.engine.close()
            self.engine = None  # type: ignore[assignment]  # closed: require_open says so

    def require_open(self) -> None:
        if self.engine is None:
            raise StateError("OffloadAdam: %s: the optimizer was closed" % self.label)

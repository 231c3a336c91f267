"""OffloadAdam's exchange with strata when the parameters are CPU tensors: straight between the tensors and strata's
stores (strata.h, "host arrays, without the device"), never through strata's device window, which on the host
backend is host memory too and cost two extra passes over every gradient and weight (and device-budget room).

Where strata's stores are host memory and the group has no delayed update (one gradient store and one weight copy,
which stay put), the tensors become views of them, so that nothing is copied at all:
  - a parameter's data is its weights in strata's parameter tier: strata's Adam writes the new weights into the
    parameter itself (the Parameter object stays the same; only the storage behind p.data changes, once, at
    construction, with the same values);
  - after each step a parameter's .grad is its fp32 slot in strata's gradient store, holding the same values, so a
    backward that accumulates into it (zero_grad(set_to_none=False), or no zero_grad) writes where strata reads; a
    .grad that backward allocated afresh (set_to_none=True) is copied in once, at the next step.
A tensor strata cut into chunks is aliased only if the chunks lie back to back in strata's memory (bucket_bytes a
multiple of 16 KiB makes them so); the rest is copied, one pass each way. The views keep the engine alive; close()
gives the parameters their own storage back first.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set

import torch

from ._adam_memory import host_view
from ._tensors import Alive

if TYPE_CHECKING:
    from ._adam_group import GroupEngine


class HostExchange:
    """The gradients in and the weights out of one GroupEngine over CPU tensors."""

    def __init__(self, group: GroupEngine) -> None:
        self.group = group
        self.sources: List[Alive] = []  # weak references to the memory the views use (alive while a view is)
        self.grad_alias: Dict[int, torch.Tensor] = {}  # param index -> the tensor over its slot in the gradient store
        self.aliased: Set[int] = set()  # param indices whose data is strata's weights
        self.bind()

    # ---------------------------------------------------------------- aliases

    def _span(self, index: int, address_of: Callable[[int], Optional[int]], elem_bytes: int) -> Optional[int]:
        """The address of param index's elements in strata's memory (address_of(param id), elem_bytes each) if
        they lie back to back there, chunks included; else None."""
        start: Optional[int] = None
        expect: Optional[int] = None
        for _, chunks in self.group.modules:
            for c in chunks:
                if c.param != index:
                    continue
                at = address_of(c.pid)
                if at is None or (expect is not None and at != expect):
                    return None
                start = at if start is None else start
                expect = at + c.numel * elem_bytes
        return start

    def bind(self) -> None:
        """(Re)makes the aliases where strata's memory allows them: at construction and after a load."""
        g = self.group
        e = g.engine
        self.grad_alias.clear()
        if g.delayed:
            return  # the two copies of each store alternate: copies, not aliases
        for i, p in enumerate(g.params):
            data = p.detach()
            if data.is_contiguous():
                at = self._span(i, e.param_home_data, data.element_size())
                if at is not None and (i not in self.aliased or data.data_ptr() != at):
                    view, alive = host_view(at, data.numel(), data.dtype, e)
                    self.sources.append(alive)
                    p.data = view.view(data.shape)  # strata's copy holds the same values (it was built from them)
                    self.aliased.add(i)
            if p.dtype == torch.float32:
                at = self._span(i, e.grad_store_data, 4)
                if at is not None:
                    view, alive = host_view(at, p.numel(), torch.float32, e)
                    self.sources.append(alive)
                    self.grad_alias[i] = view.view(p.shape)

    def release(self) -> bool:
        """Gives every parameter (and .grad) that views strata's memory its own copy, before the engine goes.
        Returns whether some other view of strata's memory is still alive (the engine must then outlive it)."""
        for i in sorted(self.aliased):
            p = self.group.params[i]
            p.data = p.detach().clone()
        for i, alias in self.grad_alias.items():
            p = self.group.params[i]
            if p.grad is not None and p.grad.data_ptr() == alias.data_ptr():
                p.grad = p.grad.clone()
        self.aliased.clear()
        self.grad_alias.clear()
        return any(alive() is not None for alive in self.sources)

    # ---------------------------------------------------------------- the step

    def push_grads(self) -> None:
        """Hands every .grad to strata's gradient store: nothing to copy for one that is its slot there."""
        g = self.group
        flat: List[Optional[torch.Tensor]] = []
        for p in g.params:
            grad = p.grad
            flat.append(None if grad is None else grad.detach().reshape(-1).contiguous())
        for mid, chunks in g.modules:
            addresses: List[Optional[int]] = []
            for c in chunks:
                grad = flat[c.param]
                addresses.append(None if grad is None else grad.data_ptr() + c.offset * grad.element_size())
            g.engine.grads_from_host(mid, addresses)

    def after_step(self) -> None:
        """Points each fp32 .grad at its slot in the store (same values): the next backward accumulates there."""
        for i, alias in self.grad_alias.items():
            p = self.group.params[i]
            if p.grad is not None and p.grad.data_ptr() != alias.data_ptr():
                p.grad = alias

    def pull_weights(self) -> None:
        """Copies the visible weights into the parameters that do not view them already."""
        g = self.group
        targets: Dict[int, torch.Tensor] = {}
        for i, p in enumerate(g.params):
            if i in self.aliased:
                continue
            data = p.detach()
            targets[i] = data.view(-1) if data.is_contiguous() else torch.empty(data.numel(), dtype=data.dtype)
        if not targets:
            return
        for mid, chunks in g.modules:
            addresses: List[Optional[int]] = []
            for c in chunks:
                t = targets.get(c.param)
                addresses.append(None if t is None else t.data_ptr() + c.offset * t.element_size())
            g.engine.params_to_host(mid, addresses)
        for i, flat in targets.items():
            p = g.params[i]
            if not p.detach().is_contiguous():
                p.detach().copy_(flat.view(p.shape))

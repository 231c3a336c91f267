"""Saved-tensor hooks that compose with the ones already active.

torch applies only the innermost pair of saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks). strata must
see every tensor autograd saves inside a module it lends memory to, to keep views of lent parameters as recipes; but
when a user's torch.utils.checkpoint (or save_on_cpu) already has hooks active, those must still get every other
tensor, or checkpointing would silently stop saving memory. torch 1.13 cannot say which hooks are active, so this
module keeps a per-thread record of the pairs pushed through the saved_tensors_hooks class (what checkpoint and
save_on_cpu use) by wrapping its __enter__ and __exit__ once; strata's own pairs then hand what they do not keep to
the pair beneath them.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

import torch

# keep(t, alone): what an engine keeps of a saved tensor, or None; restore(kept): the tensor again.
Keep = Callable[[torch.Tensor, bool], Any]
Restore = Callable[[Any], torch.Tensor]

_local = threading.local()


def _stack() -> List[torch.autograd.graph.saved_tensors_hooks]:
    stack: Optional[List[torch.autograd.graph.saved_tensors_hooks]] = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _install() -> None:
    cls = torch.autograd.graph.saved_tensors_hooks
    if getattr(cls, "_strata_recorded", False):
        return
    enter: Callable[[Any], Any] = cls.__enter__
    exit_: Callable[..., Any] = cls.__exit__

    def recorded_enter(self: torch.autograd.graph.saved_tensors_hooks) -> Any:
        result = enter(self)
        _stack().append(self)
        return result

    def recorded_exit(self: torch.autograd.graph.saved_tensors_hooks, *exc: Any) -> Any:
        stack = _stack()
        if stack and stack[-1] is self:
            stack.pop()
        return exit_(self, *exc)

    setattr(cls, "__enter__", recorded_enter)
    setattr(cls, "__exit__", recorded_exit)
    setattr(cls, "_strata_recorded", True)


_install()


class _Delegated:
    """A tensor handed to the hooks beneath strata's: what their pack returned, and their unpack."""

    __slots__ = ("packed", "unpack")

    def __init__(self, packed: Any, unpack: Callable[[Any], torch.Tensor]) -> None:
        self.packed, self.unpack = packed, unpack


class StrataHooks(torch.autograd.graph.saved_tensors_hooks):
    """One engine's pair: keep(t, alone) returns what the engine keeps for t, or None when it does not keep it (alone:
    no pair is beneath); then the pair beneath, if any, packs t, else t itself is saved. restore(kept) turns what
    keep returned back into a tensor."""

    def __init__(self, owner: object, keep: Keep, restore: Restore,
                 below: Optional[torch.autograd.graph.saved_tensors_hooks]) -> None:
        self.below = below

        def pack(t: torch.Tensor) -> Any:
            kept = keep(t, below is None)
            if kept is not None:
                return kept
            if below is not None:
                return _Delegated(below.pack_hook(t), below.unpack_hook)
            return t

        def unpack(saved: Any) -> torch.Tensor:
            if isinstance(saved, _Delegated):
                return saved.unpack(saved.packed)
            if isinstance(saved, torch.Tensor):
                return saved
            return restore(saved)

        super().__init__(pack, unpack)
        self.owner = owner


def active_for(owner: object) -> bool:
    """True when owner's hooks are the innermost pair (nothing to push)."""
    stack = _stack()
    return bool(stack) and getattr(stack[-1], "owner", None) is owner


def innermost() -> Optional[torch.autograd.graph.saved_tensors_hooks]:
    """The innermost pair active now (a new pair of strata's hands tensors to it), or None."""
    stack = _stack()
    return stack[-1] if stack else None

"""Saved-tensor hooks that compose with the ones already active.

torch applies only the innermost pair of saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks). strata must
see every tensor autograd saves inside a module it lends memory to, to keep views of lent parameters as recipes; but
when a user's torch.utils.checkpoint (or save_on_cpu) already has hooks active, those must still get every other
tensor, or checkpointing would silently stop saving memory. torch 1.13 cannot say which hooks are active, so this
module keeps a per-thread record of the pairs pushed through the saved_tensors_hooks class (what checkpoint and
save_on_cpu use) by wrapping its __enter__ and __exit__ once; strata's own pairs then hand what they do not keep to
the pair beneath them.
"""
import threading

import torch

_local = threading.local()


def _stack():
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _install():
    cls = torch.autograd.graph.saved_tensors_hooks
    if getattr(cls, "_strata_recorded", False):
        return
    enter, exit_ = cls.__enter__, cls.__exit__

    def recorded_enter(self):
        result = enter(self)
        _stack().append(self)
        return result

    def recorded_exit(self, *exc):
        stack = _stack()
        if stack and stack[-1] is self:
            stack.pop()
        return exit_(self, *exc)

    cls.__enter__, cls.__exit__ = recorded_enter, recorded_exit
    cls._strata_recorded = True


_install()


class _Delegated:
    """A tensor handed to the hooks beneath strata's: what their pack returned, and their unpack."""

    __slots__ = ("packed", "unpack")

    def __init__(self, packed, unpack):
        self.packed, self.unpack = packed, unpack


class StrataHooks(torch.autograd.graph.saved_tensors_hooks):
    """One engine's pair: keep(t, alone) returns what the engine keeps for t, or None when it does not keep it (alone:
    no pair is beneath); then the pair beneath, if any, packs t, else t itself is saved. restore(kept) turns what
    keep returned back into a tensor."""

    def __init__(self, owner, keep, restore, below):
        self.below = below
        below_pack = below.pack_hook if below is not None else None
        below_unpack = below.unpack_hook if below is not None else None

        def pack(t):
            kept = keep(t, below is None)
            if kept is not None:
                return kept
            if below_pack is not None:
                return _Delegated(below_pack(t), below_unpack)
            return t

        def unpack(saved):
            if isinstance(saved, _Delegated):
                return saved.unpack(saved.packed)
            if isinstance(saved, torch.Tensor):
                return saved
            return restore(saved)

        super().__init__(pack, unpack)
        self.owner = owner


def active_for(owner):
    """True when owner's hooks are the innermost pair (nothing to push)."""
    stack = _stack()
    return bool(stack) and getattr(stack[-1], "owner", None) is owner


def innermost():
    """The innermost pair active now (a new pair of strata's hands tensors to it), or None."""
    stack = _stack()
    return stack[-1] if stack else None

"""The real weights in a managed model's state_dict(), and load_state_dict() refused.

Between uses the parameters of a model strata trains hold no storage, so torch's state_dict() would give empty
tensors, and save_pretrained() would write them (DeepSpeed's answer is stage3_gather_16bit_weights_on_model_save).
Each module owning a parameter strata holds (trained or frozen) gets a state_dict hook that puts the parameter's
weights there instead: strata's fp32 master weights in the model's dtype (a frozen parameter's: the weights strata
keeps, in that dtype already). A parameter under several names (tied weights) gives the same
tensor object under each, so save_pretrained sees them shared, as it does for an unmanaged model. With several ranks
state_dict() is a collective: every rank must call it.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Dict, Iterable, Optional, Set, Tuple

import torch
import torch.nn as nn

from ..errors import StateError

if TYPE_CHECKING:
    from .engine import StrataEngine


class _Weights:
    """The weights handed out since the last step, by parameter: the same tensor while anyone holds it."""

    def __init__(self) -> None:
        self.version: Optional[Tuple[int, int]] = None
        self.tensors: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


def install(engine: StrataEngine, modules: Iterable[nn.Module]) -> None:
    """Hooks the state_dict and load_state_dict of modules (those owning a parameter engine holds)."""
    weights = _Weights()
    managed = {id(p) for u in engine.units for _, p in u.params}
    handles = []
    for mod in modules:
        handles.append(mod._register_state_dict_hook(
            lambda m, sd, prefix, meta: _fill(engine, weights, managed, m, sd, prefix)))
        handles.append(mod._register_load_state_dict_pre_hook(
            lambda m, *args: _refuse(engine, m), with_module=True))
    engine._state_dict_handles = handles


def remove(engine: StrataEngine) -> None:
    for h in getattr(engine, "_state_dict_handles", []):
        h.remove()
    engine._state_dict_handles = []


def _fill(engine: StrataEngine, weights: _Weights, managed: Set[int], module: nn.Module, sd: Dict[str, Any],
          prefix: str) -> None:
    if engine.engine is None:
        return  # closed: the parameters are empty, as state_dict shows
    version = (engine.global_steps, engine.loads)
    if weights.version != version:
        weights.tensors = weakref.WeakValueDictionary()
        weights.version = version
    for name, p in module._parameters.items():
        if p is None or id(p) not in managed:
            continue
        t = weights.tensors.get(id(p))
        if t is None:
            t = engine.full_weight(p)
            weights.tensors[id(p)] = t
        sd[prefix + name] = t


def _refuse(engine: StrataEngine, module: nn.Module) -> None:
    if engine.engine is None:
        return
    raise StateError("strata: load_state_dict() on %s, whose parameters strata holds: strata keeps the weights and "
                     "their optimizer state; load the weights into the model before strata.torch.initialize, or "
                     "resume with engine.load_checkpoint(dir)" % type(module).__name__)

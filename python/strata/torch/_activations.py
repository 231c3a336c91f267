"""What strata keeps of a tensor autograd saved for backward, instead of the tensor itself.

A view of a lent parameter (nn.Linear saves weight.t()) is kept as a recipe over the parameter and rebuilt from the
parameter's memory of the moment, which backward has fetched: the memory the view pointed at in forward may be
released and reused by then. A large activation may be kept off the device by strata (strata_act_push).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

import torch

from ..errors import StateError
from . import _tensors

if TYPE_CHECKING:
    from .engine import StrataEngine


class ParamView:
    """A view of parameter p: rebuilt by restore() from p's memory of the moment."""

    __slots__ = ("param", "shape", "stride", "offset")

    def __init__(self, param: torch.nn.Parameter, shape: Tuple[int, ...], stride: Tuple[int, ...],
                 offset: int) -> None:
        self.param, self.shape, self.stride, self.offset = param, shape, stride, offset

    def restore(self, engine: StrataEngine) -> torch.Tensor:
        data = self.param.data
        if data.numel() == 0:
            raise StateError(
                "strata: backward needs parameter %s, which is not fetched (autograd saved a view of it in forward); "
                "run the module's backward through engine.backward(loss), or report the pattern that got here" %
                engine.param_name(self.param))
        view: torch.Tensor = data.as_strided(self.shape, self.stride, self.offset)
        return view


class KeptActivation:
    """A tensor autograd saved for backward, kept off the device by strata (strata_act_push) until backward unpacks
    it. Its copy is dropped when autograd lets go of it (after the node's backward, or with the graph)."""

    def __init__(self, owner: StrataEngine, t: torch.Tensor) -> None:
        src = t.contiguous()
        self.engine, self.shape, self.dtype, self.device = owner.engine, t.shape, t.dtype, t.device
        self.handle = owner.engine.act_push(src.data_ptr(), src.numel() * src.element_size())
        owner._act_source = src  # strata reads it until the next push or pop

    def restore(self, owner: StrataEngine) -> torch.Tensor:
        address = self.engine.act_pop(self.handle)
        owner._act_source = None
        numel = 1
        for n in self.shape:
            numel *= n
        kept: torch.Tensor = _tensors.wrap(address, numel, self.dtype, self.device).view(self.shape).clone()
        return kept

    def __del__(self) -> None:
        try:
            self.engine.act_drop(self.handle)
        except Exception:  # the engine is closed already: its store went with it
            pass

"""Where a parameter's initial values come from when they are not in its own tensor.

A parameter built on the meta device holds no values; strata.torch.load_pretrained gives it a source instead, which
strata.torch.initialize reads chunk by chunk into strata's tiers (engine.py, _register), so that the model's weights
never sit in host memory whole. The parameter stays on the meta device until then (no numbers can come of it). A source only reads: it converts its stored dtype to fp32 on the way.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Protocol, Tuple

import torch
from torch import nn

_ATTR = "_strata_source"


class WeightSource(Protocol):
    def read_into(self, offset: int, count: int, out: torch.Tensor) -> None:
        """Writes elements [offset, offset + count) of the tensor, flattened and as fp32, into out (1-D, fp32, CPU,
        count elements); raises a strata error naming the tensor and its file when they cannot be read."""

    def describe(self) -> str:
        """The tensor and where it is, for messages: 'h.0.attn.c_attn.weight in /path/model.safetensors'."""


def attach(p: torch.Tensor, source: WeightSource) -> None:
    setattr(p, _ATTR, source)


def source_of(p: torch.Tensor) -> Optional[WeightSource]:
    return getattr(p, _ATTR, None)


def detach_source(p: torch.Tensor) -> None:
    if hasattr(p, _ATTR):
        delattr(p, _ATTR)


Swap = Tuple[nn.Module, str, nn.Parameter]  # (a module, the key of its parameter, the meta parameter it held)


def stand_ins(model: nn.Module) -> List[Swap]:
    """Replaces each meta parameter with a source, in every module holding it, by a CPU parameter of its shape, dtype
    and requires_grad whose one NaN element is expanded (no storage), carrying the source and the attributes others
    set on it (transformers', peft's): torch cannot give a meta tensor CPU storage in place, and initialize lends
    each parameter strata's memory. Only initialize makes them, and empties them before the model runs; it puts the
    meta parameters back (put_back) if it fails first, so that no model is left to compute with the NaN."""
    made: Dict[int, nn.Parameter] = {}
    swaps: List[Swap] = []
    for mod in model.modules():
        for key, p in list(mod._parameters.items()):
            if p is None or not p.is_meta or source_of(p) is None:
                continue
            if id(p) not in made:
                fill = math.nan if p.dtype.is_floating_point else 0
                one = torch.full((), fill, dtype=p.dtype, device="cpu")
                stand_in = nn.Parameter(one.expand(p.shape), requires_grad=p.requires_grad)
                stand_in.__dict__.update(p.__dict__)  # the source among them
                made[id(p)] = stand_in
            mod._parameters[key] = made[id(p)]
            swaps.append((mod, key, p))
    return swaps


def put_back(swaps: List[Swap]) -> None:
    """The meta parameters stand_ins replaced, back where they were."""
    for mod, key, p in swaps:
        mod._parameters[key] = p

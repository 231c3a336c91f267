"""Where a parameter's initial values come from when they are not in its own tensor.

A parameter built on the meta device holds no values; strata.torch.load_pretrained gives it a source instead, which
strata.torch.initialize reads chunk by chunk into strata's tiers (engine.py, _register), so that the model's weights
never sit in host memory whole. A source only reads: it converts its stored dtype to fp32 on the way.
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch

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

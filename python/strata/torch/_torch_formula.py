"""The Adam update of the torch that runs, which strata's Adam follows bit for bit.

torch 2.0 changed how AdamW (and Adam) update the first moment: exp_avg.lerp_(grad, 1 - beta1) instead of torch
1.x's exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1). The two round differently in about a third of the elements,
and Adam amplifies a one-rounding difference through near-zero gradients, so strata picks the formula of the torch
it is compared with, once, when an engine is made from Python (strata.adam_first_moment, docs/config.md). A config
that names the formula itself keeps it.

One thing strata does not follow: the square root. strata's is IEEE's (correctly rounded, as the CPU's sqrt
instruction gives it). PyPI's torch computes a CPU tensor's sqrt with MKL, whose AVX-512 code path (the one MKL
picks on CPUs with AVX-512) rounds one unit low in about 0.6% of elements, those whose root lies near halfway
between two floats; its AVX2 path is IEEE. On such a machine torch.optim.AdamW's own result depends on which path
MKL takes, and strata's weights differ from it in those last bits: check_torch_sqrt() says so once, naming the
setting that makes torch's sqrt IEEE (MKL_ENABLE_INSTRUCTIONS=AVX2, read when torch starts).
"""
from __future__ import annotations

import math
import struct
import warnings
from typing import Any, Dict

import torch

_KEY = "adam_first_moment"
_checked = False


def torch_adam_formula() -> str:
    """strata.adam_first_moment's value for the running torch: "lerp" from 2.0 on, else "mul_add"."""
    major = int(torch.__version__.split(".")[0])
    return "lerp" if major >= 2 else "mul_add"


def follow_torch(strata_section: Dict[str, Any]) -> None:
    """Sets the config's strata section to the running torch's Adam formula unless it names one, and warns once
    when torch's CPU sqrt is not IEEE's (see the top)."""
    strata_section.setdefault(_KEY, torch_adam_formula())
    check_torch_sqrt()


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def torch_sqrt_differs() -> int:
    """How many of 8192 fixed random floats torch's CPU sqrt rounds otherwise than IEEE (the float nearest the
    double root, which is the correctly rounded float root)."""
    x = torch.rand(8192, generator=torch.Generator().manual_seed(0x5eed))
    got = torch.sqrt(x).tolist()
    return sum(g != _f32(math.sqrt(v)) for v, g in zip(x.tolist(), got))


def check_torch_sqrt() -> None:
    """Warns once per process when torch's CPU sqrt is not IEEE's, so that torch.optim.AdamW and strata differ."""
    global _checked
    if _checked:
        return
    _checked = True
    bad = torch_sqrt_differs()
    if bad:
        warnings.warn(
            "strata: this torch's CPU sqrt is not correctly rounded here (%d of 8192 probes differ, %.1f%%), so "
            "torch.optim.AdamW on the CPU rounds Adam's denominator one unit off in some elements where strata's IEEE "
            "sqrt does not; strata follows torch's Adam formula otherwise, and both are within a rounding of the exact "
            "update. On Intel CPUs the cause is MKL's AVX-512 path, and MKL_ENABLE_INSTRUCTIONS=AVX2 set before torch "
            "starts gives a bit-identical comparison; elsewhere (AMD EPYC with torch 2.15, measured) no setting "
            "does, and tests/helpers/adam_oracle.py compares with torch's optimizer under an IEEE sqrt instead"
            % (bad, 100.0 * bad / 8192), stacklevel=4)

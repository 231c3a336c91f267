"""The C library's names for its enums: statuses, tiers, dtypes and backends.

strata.h holds the one list of each; the package asks the loaded library (strata_status_name, strata_tier_name,
strata_dtype_name, strata_backend_name) instead of writing the lists again, so a status or a tier the library adds
is named here without a change.
"""
from __future__ import annotations

import functools
from typing import Dict

from . import _lib

# strata_status_name's answer past the last status (strata.h): where the enumeration stops.
_PAST_LAST_STATUS = "STRATA_E?"


def _ask(function: str, value: int) -> str:
    text: bytes = getattr(_lib.load(), function)(value)
    return text.decode()


def status_name(code: int) -> str:
    """"STRATA_EIO" for 6; "STRATA_E?" for a value the library does not name."""
    return _ask("strata_status_name", code)


@functools.lru_cache(maxsize=None)
def status_codes() -> Dict[str, int]:
    """{"STRATA_OK": 0, "STRATA_EINVAL": 1, ...}: every status of the loaded library, asked for 0, 1, ... until
    strata_status_name says a value is past the last."""
    codes: Dict[str, int] = {}
    code, name = 0, status_name(0)
    while name != _PAST_LAST_STATUS:
        codes[name] = code
        code += 1
        name = status_name(code)
    return codes


def status_code(name: str) -> int:
    """The value of a status by its C name ("STRATA_ESTATE" -> 4)."""
    return status_codes()[name]


def tier_name(tier: int) -> str:
    """"device", "host", "nvme", "auto"; "?" outside the enum."""
    return _ask("strata_tier_name", tier)


def dtype_name(dtype: int) -> str:
    """"fp32", "bf16", "fp16", "none"; "?" outside the enum."""
    return _ask("strata_dtype_name", dtype)


def backend_name(backend: int) -> str:
    """"auto", "host", "cuda"; "?" outside the enum."""
    return _ask("strata_backend_name", backend)

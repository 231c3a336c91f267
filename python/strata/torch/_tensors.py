"""strata's memory as torch tensors, without copies: host addresses through the buffer protocol, device
addresses through __cuda_array_interface__."""
from __future__ import annotations

import ctypes
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

import torch

# alive(): the object torch took the memory from while a tensor still refers to it, else None.
Alive = Callable[[], Optional[object]]

DTYPES: Dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# __cuda_array_interface__ has no bf16 type string: bf16 memory is taken as int16 and viewed as bf16.
_CAI_TYPESTR: Dict[torch.dtype, Tuple[str, Optional[torch.dtype]]] = {torch.float32: ("<f4", None), torch.float16: ("<f2", None), torch.bfloat16: ("<i2", torch.bfloat16)}


class _DeviceMemory:
    """A device address in the shape of __cuda_array_interface__ (version 2: no stream, strata orders the work)."""

    def __init__(self, address: int, numel: int, typestr: str) -> None:
        self.owner: Any = None
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": typestr, "data": (address, False),
                                         "version": 2}


def wrap(address: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D tensor of numel dtype elements over strata's memory at address on device. It does not own the
    memory: it is valid until strata releases it (the caller drops it before)."""
    return wrap_watched(address, numel, dtype, device)[0]


def wrap_watched(address: int, numel: int, dtype: torch.dtype, device: torch.device,
                 keep: Any = None) -> Tuple[torch.Tensor, Alive]:
    """(tensor, alive) as wrap, where alive() is true while any tensor still refers to the memory: the tensor, a
    view of it, a tensor autograd saved. Every such tensor keeps the object torch took the memory from, which
    alive watches through a weak reference; that object also keeps `keep` (the owner of the memory, say) alive."""
    if device.type == "cuda":
        typestr, view_as = _CAI_TYPESTR[dtype]
        source = _DeviceMemory(address, numel, typestr)
        source.owner = keep
        t = torch.as_tensor(source, device=device)
        assert t.data_ptr() == address  # a view of strata's memory, never a copy
        return (t.view(view_as) if view_as is not None else t), weakref.ref(source)
    nbytes = numel * torch.finfo(dtype).bits // 8
    host = (ctypes.c_byte * nbytes).from_address(address)
    setattr(host, "owner", keep)  # ctypes instances take attributes
    return torch.frombuffer(memoryview(host), dtype=dtype, count=numel), weakref.ref(host)


def empty(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The storage-less stand-in a parameter holds between uses."""
    return torch.empty(0, dtype=dtype, device=device)

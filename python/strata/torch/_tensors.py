"""strata's memory as torch tensors, without copies: host addresses through the buffer protocol, device
addresses through __cuda_array_interface__."""
import ctypes

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# __cuda_array_interface__ has no bf16 type string: bf16 memory is taken as int16 and viewed as bf16.
_CAI_TYPESTR = {torch.float32: ("<f4", None), torch.float16: ("<f2", None), torch.bfloat16: ("<i2", torch.bfloat16)}


class _DeviceMemory:
    """A device address in the shape of __cuda_array_interface__ (version 2: no stream, strata orders the work)."""

    def __init__(self, address, numel, typestr):
        self.__cuda_array_interface__ = {"shape": (numel,), "typestr": typestr, "data": (address, False),
                                         "version": 2}


def wrap(address, numel, dtype, device):
    """A 1-D tensor of numel dtype elements over strata's memory at address on device. It does not own the
    memory: it is valid until strata releases it (the caller drops it before)."""
    if device.type == "cuda":
        typestr, view_as = _CAI_TYPESTR[dtype]
        t = torch.as_tensor(_DeviceMemory(address, numel, typestr), device=device)
        assert t.data_ptr() == address  # a view of strata's memory, never a copy
        return t.view(view_as) if view_as is not None else t
    nbytes = numel * torch.finfo(dtype).bits // 8
    return torch.frombuffer((ctypes.c_byte * nbytes).from_address(address), dtype=dtype, count=numel)


def empty(dtype, device):
    """The storage-less stand-in a parameter holds between uses."""
    return torch.empty(0, dtype=dtype, device=device)

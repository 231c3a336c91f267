"""strata's parameter and gradient buffers as torch tensors, without copying them.

On the host backend strata_param_data / strata_grad_data are host addresses, readable when strata_fetch returns; on
the CUDA backend they are device pointers ordered on strata's compute stream (strata.h, strata_compute_stream), so
every copy OffloadAdam makes runs on that stream, after the trainer's own work, and the trainer's next work waits
for it. The CUDA path could not be run where it was written (no GPU): it follows strata.h's contract.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ContextManager, Iterator, Tuple, Union

import torch

from . import _tensors

if TYPE_CHECKING:
    from ..engine import Engine


class HostMemory:
    """The host backend: addresses in this process's memory; copies are synchronous."""

    def __init__(self, engine: Engine, device: torch.device) -> None:
        self.device = device

    def tensor(self, address: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return _tensors.wrap(address, numel, dtype, self.device)

    def exchange(self) -> ContextManager[None]:
        """The context of one pass of copies between the trainer's tensors and strata's buffers."""
        return contextlib.nullcontext()

    def keep(self, tensor: torch.Tensor) -> None:
        """Says tensor is read by the pass in flight (nothing to do when copies are synchronous)."""


class CudaMemory:
    """The CUDA backend: device pointers, copies on strata's compute stream."""

    def __init__(self, engine: Engine, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.ExternalStream(engine.compute_stream(), device=device)

    def tensor(self, address: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return _tensors.wrap(address, numel, dtype, self.device)

    @contextlib.contextmanager
    def exchange(self) -> Iterator[None]:
        trainer = torch.cuda.current_stream(self.device)
        # The trainer's gradients (and its last reads of the parameters) come before strata's copies ...
        self.stream.wait_stream(trainer)
        try:
            with torch.cuda.stream(self.stream):
                yield
        finally:
            # ... and its next forward comes after the new parameters are in place (or whatever a failed pass did).
            trainer.wait_stream(self.stream)

    def keep(self, tensor: torch.Tensor) -> None:
        # A gradient the trainer frees while the copy is queued must not be reused under it.
        tensor.record_stream(self.stream)


def host_view(address: int, numel: int, dtype: torch.dtype, keep: Engine) -> Tuple[torch.Tensor, _tensors.Alive]:
    """(tensor, alive): a 1-D CPU tensor over strata's host memory at address that keeps `keep` (the strata.Engine
    that owns the memory) alive for as long as the tensor, or any view of it, lives; alive() is true while one does.
    A parameter or gradient that aliases strata's store can so never outlive it, whatever order Python frees in."""
    return _tensors.wrap_watched(address, numel, dtype, torch.device("cpu"), keep=keep)


Memory = Union[HostMemory, CudaMemory]


def for_device(engine: Engine, device: torch.device) -> Memory:
    return CudaMemory(engine, device) if device.type == "cuda" else HostMemory(engine, device)

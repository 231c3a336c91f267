"""strata for PyTorch trainers.

    engine, optimizer, _, scheduler = strata.torch.initialize(model=model, config="ds_config.json")  # ZeRO-3
    loss = engine(x, y); engine.backward(loss); engine.step()

    opt = strata.torch.OffloadAdam(model.parameters(), lr=3e-4)  # ZeRO-Offload: only the optimizer in strata
"""
from __future__ import annotations

from ._initialize import initialize
from .engine import StrataEngine
from .offload_adam import OffloadAdam

__all__ = ["initialize", "StrataEngine", "OffloadAdam"]

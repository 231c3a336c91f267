"""strata for PyTorch trainers.

    engine, optimizer, _, scheduler = strata.torch.initialize(model=model, config="ds_config.json")  # ZeRO-3
    loss = engine(x, y); engine.backward(loss); engine.step()

    opt = strata.torch.OffloadAdam(model.parameters(), lr=3e-4)  # ZeRO-Offload: only the optimizer in strata

    with strata.torch.zero_init(config):  # a model larger than host memory, built on disk
        model = Model()
"""
from __future__ import annotations

from ._initialize import initialize
from .engine import StrataEngine
from ._zero_init import Init, zero_init
from .offload_adam import OffloadAdam
from ._pretrained import load_pretrained

__all__ = ["initialize", "StrataEngine", "OffloadAdam", "zero_init", "Init", "load_pretrained"]

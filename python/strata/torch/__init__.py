"""strata for PyTorch trainers.

    engine, optimizer, _, scheduler = strata.torch.initialize(model=model, config="ds_config.json")  # ZeRO-3
    loss = engine(x, y); engine.backward(loss); engine.step()

    opt = strata.torch.OffloadAdam(model.parameters(), lr=3e-4)  # ZeRO-Offload: only the optimizer in strata

    with strata.torch.zero_init(config):  # a model larger than host memory, built on disk
        model = Model()

    head = strata.torch.TiledLinear(4096, 128256, in_splits=4, out_splits=8)  # a layer larger than the device budget
"""
from __future__ import annotations

from ._initialize import initialize
from .engine import StrataEngine
from ._zero_init import Init, zero_init
from .offload_adam import OffloadAdam
from ._pretrained import load_pretrained
from ._tiled_linear import TiledLinear

__all__ = ["initialize", "StrataEngine", "OffloadAdam", "zero_init", "Init", "load_pretrained", "TiledLinear"]

"""strata for PyTorch trainers.

    engine = strata.torch.initialize(model, "ds_config.json")   # ZeRO-3: parameters and optimizer in strata
    loss = engine(x, y); engine.backward(loss); engine.step()

    opt = strata.torch.OffloadAdam(model.parameters(), lr=3e-4)  # ZeRO-Offload: only the optimizer in strata
"""
from .engine import StrataEngine, initialize
from .offload_adam import OffloadAdam

__all__ = ["initialize", "StrataEngine", "OffloadAdam"]

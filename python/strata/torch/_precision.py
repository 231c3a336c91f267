"""What bf16 / fp16 training changes in a model beyond the parameters strata lends it.

With bf16 or fp16 enabled DeepSpeed casts the whole module (module.bfloat16() / .half()) and scales the loss in fp32
(engine.backward takes loss.float()); torch's own recipe does the same (model.to(dtype); GradScaler multiplies by an
fp32 scale). strata lends the parameters in that dtype (frozen ones too: it keeps them in it, rounded as DeepSpeed's
module.bfloat16() rounds them), and the rest of the model has to follow, or it computes otherwise than
model.to(dtype) would: an fp32 buffer (a position table, a mask) promotes every activation it meets to fp32. And a
half loss scaled in its own dtype gets back the gradient 1 x scale before the division by the accumulation steps: inf
in fp16 at the default scale 2^16, so every step would overflow until the scale halved (and forever at a static
2^16), where in fp32 the half loss gets scale / steps.
"""
from __future__ import annotations

import torch
import torch.nn as nn


def cast_rest(model: nn.Module, dtype: torch.dtype) -> None:
    """Casts model's floating-point buffers to dtype in place, as model.to(dtype) would (its parameters, frozen ones
    too, are strata's, lent in dtype). Nothing to do for fp32."""
    if dtype == torch.float32:
        return
    for mod in model.modules():
        for key, buf in mod._buffers.items():
            if buf is not None and buf.is_floating_point() and buf.dtype != dtype:
                mod._buffers[key] = buf.to(dtype)


def fp32_loss(loss: torch.Tensor) -> torch.Tensor:
    """loss in fp32 when it is bf16 or fp16, so that dividing and scaling it rounds in fp32 (DeepSpeed's
    loss.float()); the gradient reaching the half loss is then the scale over the accumulation steps, rounded once."""
    return loss.float() if loss.dtype in (torch.float16, torch.bfloat16) else loss

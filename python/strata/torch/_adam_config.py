"""The strata configuration of one OffloadAdam parameter group.

The user's config (DeepSpeed vocabulary) says where the optimizer state lives (host or NVMe), the I/O settings and
strata's own knobs. OffloadAdam owns everything else: the optimizer section comes from the group's hyperparameters,
the precision and backend from its parameters, and the device windows from its bucket size. A key the user set that
contradicts what the parameters say is refused rather than overridden, so that no setting is silently ignored.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Dict, Iterable, Optional

import torch

from ..config import TRAINER_KEYS, Config, ConfigSource
from ..errors import ConfigError
from ._torch_formula import follow_torch

# What the C config table accepts for optimizer.params.lr; the lr of each step is passed with it, so the configured
# one only documents the group (it shows in checkpoint manifests).
CONFIG_LR_RANGE = (1.1754943508222875e-38, 1e6)

# Mirrors engine/plan/plan.h (PLAN_PARAM_ALIGN, PLAN_MODULE_ALIGN): a module's parameters start on 128-element
# boundaries and the module is padded to 4096 elements. Used only to size the device windows, with slack.
_PARAM_ALIGN = 128
_MODULE_ALIGN = 4096


def user_document(config: ConfigSource) -> Dict[str, Any]:
    """The user's config as a plain dict (a copy), checked once by strata so its errors name the user's keys."""
    if config is None:
        return {}
    if isinstance(config, Config):
        doc = config.document
    elif isinstance(config, (str, os.PathLike)):
        doc = Config(config).document
    elif isinstance(config, dict):
        Config(config)  # strata's own check, naming every wrong key
        doc = config
    else:
        raise ConfigError("OffloadAdam: config must be a dict, a JSON file path or a strata.Config, not %s" %
                          type(config).__name__)
    doc = copy.deepcopy(doc)
    trainer = [k for k in TRAINER_KEYS if k in doc]
    if trainer:
        raise ConfigError("OffloadAdam config: %s %s the trainer's (your training loop's) business, not the "
                          "optimizer's; remove %s (use a torch.optim.lr_scheduler for the learning rate)" %
                          (", ".join(trainer), "is" if len(trainer) == 1 else "are",
                           "it" if len(trainer) == 1 else "them"))
    if float(doc.get("gradient_clipping", 0) or 0) > 0:
        raise ConfigError("OffloadAdam config: gradient_clipping = %r would clip each parameter group by its own "
                          "norm; clip with torch.nn.utils.clip_grad_norm_ before optimizer.step() instead and remove "
                          "the key" % doc["gradient_clipping"])
    return doc


def _section(doc: Dict[str, Any], name: str) -> Dict[str, Any]:
    value = doc.setdefault(name, {})
    if not isinstance(value, dict):
        raise ConfigError("OffloadAdam config: %s must be an object, got %r" % (name, value))
    return value


def _demand(section: Dict[str, Any], key: str, want: Any, path: str, why: str) -> None:
    """Sets section[key] = want unless the user set another value, which is refused naming both."""
    have = section.get(key, want)
    if have != want:
        raise ConfigError("OffloadAdam config: %s = %s, but %s; remove the key" %
                          (path, json.dumps(have), why % json.dumps(want)))
    section[key] = want


def module_bytes(numels: Iterable[int], elem_bytes: int) -> int:
    """The bytes strata's layout gives a module of parameters of these sizes (see _PARAM_ALIGN)."""
    used = 0
    for n in numels:
        used = -(-used // _PARAM_ALIGN) * _PARAM_ALIGN + n
    return -(-max(used, 1) // _MODULE_ALIGN) * _MODULE_ALIGN * elem_bytes


def group_document(user_doc: Dict[str, Any], hp: Dict[str, Any], precision: str, device: torch.device,
                   largest_module_bytes: int, delayed_update: Optional[bool], label: str,
                   numel: int = 0) -> Dict[str, Any]:
    """The engine config of one group.

    hp: the group's lr, betas, eps, weight_decay, adamw_mode, bias_correction. precision: "fp32" or "bf16" (of the parameters).
    device: the parameters' torch.device. largest_module_bytes: of the group's strata modules.
    delayed_update: None (the config decides) or a bool. label names the group in messages ("param group 0").
    numel: the group's elements (sizes the NVMe tier's host memory).
    """
    doc = copy.deepcopy(user_doc)
    where = "the parameters of %s are %s on %s" % (label, precision, device)

    opt = _section(doc, "optimizer")
    params = opt.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError("OffloadAdam config: optimizer.params must be an object, got %r" % (params,))
    # The constructor and the param groups own the hyperparameters; a bias_correction in the config that contradicts
    # the group's is refused rather than overridden.
    _demand(params, "bias_correction", bool(hp["bias_correction"]), "optimizer.params.bias_correction",
            "%s has bias_correction = %%s (OffloadAdam's argument, or the group's key)" % label)
    kept = {"bias_correction": params["bias_correction"]}
    # adam_w_mode is explicit: DeepSpeed's "Adam" means AdamW unless adam_w_mode is false.
    kept.update(betas=[float(hp["betas"][0]), float(hp["betas"][1])], eps=float(hp["eps"]),
                weight_decay=float(hp["weight_decay"]), adam_w_mode=bool(hp["adamw_mode"]))
    lr = float(hp["lr"])
    if CONFIG_LR_RANGE[0] <= lr <= CONFIG_LR_RANGE[1]:
        kept["lr"] = lr
    doc["optimizer"] = {"type": "AdamW" if hp["adamw_mode"] else "Adam", "params": kept}

    bf16, fp16 = _section(doc, "bf16"), _section(doc, "fp16")
    _demand(bf16, "enabled", precision == "bf16", "bf16.enabled", where + ", which needs %s")
    _demand(fp16, "enabled", False, "fp16.enabled", where + "; OffloadAdam does not run fp16 (needs %s)")

    zero = _section(doc, "zero_optimization")
    zero.setdefault("stage", 3)
    # The trainer keeps its own parameters; strata's copy of them stays on the host and only the module being
    # exchanged visits the device (at stage 3; other stages keep a whole copy on the device).
    zero.setdefault("offload_param", {"device": "cpu" if zero["stage"] == 3 else "none"})
    if isinstance(zero["offload_param"], dict):
        zero["offload_param"].setdefault("device", "cpu" if zero["stage"] == 3 else "none")
    offload_opt = zero.setdefault("offload_optimizer", {})
    if isinstance(offload_opt, dict):
        offload_opt.setdefault("device", "cpu")
    # Persistent modules would stay on the device beside the trainer's own parameters: none by default.
    zero.setdefault("stage3_param_persistence_threshold", 0)

    own = _section(doc, "strata")
    follow_torch(own)
    if isinstance(offload_opt, dict) and offload_opt.get("device") == "nvme" and numel:
        # The NVMe tier is there to keep the state out of host memory. strata's defaults would stage whole sub-groups
        # of up to 1e8 elements (four pinned slots of master, moments and gradients: up to 16 x the state of a
        # group that size) and mirror the drive in a host cache; an eighth of the group per sub-group keeps the
        # slots at half the host tier's state, still overlapping reads with Adam, and no mirror.
        zero.setdefault("sub_group_size", max(_MODULE_ALIGN, -(-numel // 8)))
        own.setdefault("host_cache", False)
    if device.type == "cuda":
        _demand(own, "backend", "cuda", "strata.backend", where + ", which needs %s")
        _demand(own, "device_id", device.index if device.index is not None else 0, "strata.device_id",
                where + ", which needs %s")
    else:
        _demand(own, "backend", "host", "strata.backend", where + ", which needs %s")
    if delayed_update is not None:
        own["delayed_update"] = bool(delayed_update)
    # Two modules held plus two in flight, and one module's gradient buffers: the device arena is sized from the
    # modules instead of taking the whole GPU, which belongs to the trainer.
    big = largest_module_bytes
    own.setdefault("prefetch_bytes", 2 * big)
    own.setdefault("max_live_bytes", 4 * big)
    own.setdefault("device_budget_bytes", 6 * big + (1 << 20))
    return doc

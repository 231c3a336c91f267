"""The param groups strata.torch.initialize is given, as strata's parameter groups.

A torch.optim.AdamW or Adam (optimizer=) brings its param_groups; DeepSpeed's model_parameters= may be a list of
dicts too, each a group whose keys override the config's "optimizer" section (as DeepSpeed builds its optimizer from
them). Each group becomes one of strata's parameter groups, in order: torch's group i is strata's group i (group 0 is
strata's "default"; the others are added as "param_groups[i]", the names checkpoints record), with its own lr,
weight_decay, betas and eps, so each group's update is torch.optim's bit for bit.

What strata's engine runs for every group alike is checked here, before the model moves into strata: the update
(AdamW's decoupled decay or Adam's L2 term: the optimizer's class, or torch 2's decoupled_weight_decay, the same in
every group) and torch's switches strata's Adam does not have (amsgrad, maximize, capturable, differentiable: only
off). foreach and fused choose among torch's implementations of the same arithmetic and are accepted. Refused,
naming the group's index and the key or the parameter: a key torch's Adam does not have, a value out of the range
strata's groups take, a parameter in two groups.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Iterable, List, Mapping, NoReturn, Optional, Tuple

import torch

from ..errors import InvalidArgument
from ._param_groups import BOOKKEEPING

# strata_group_hparams' ranges (include/strata.h): (low, high, low included, high included).
_RANGES = {"lr": (0.0, 1e6, True, True), "weight_decay": (0.0, 1e6, True, True), "eps": (0.0, 1.0, False, True),
           "beta": (0.0, 1.0, True, False)}
PER_GROUP = ("lr", "betas", "eps", "weight_decay")
# torch's switches that strata's Adam does not have: accepted off only.
OFF = ("amsgrad", "maximize", "capturable", "differentiable")
# torch's choice of implementation (a loop, multi-tensor kernels, a fused kernel) of the same update.
IMPLEMENTATION = ("foreach", "fused")
DECOUPLED = "decoupled_weight_decay"  # torch 2's Adam: AdamW's update when true
NAMES = "param_names"                 # torch 2.6's named parameters: names only


def _refuse(message: str) -> NoReturn:
    raise InvalidArgument("strata.torch.initialize: " + message)


class ParamGroup:
    """One param group as strata takes it: its parameters and the hyperparameters it sets (of lr, betas, eps,
    weight_decay; the others are the config's)."""

    def __init__(self, params: List[torch.Tensor], hparams: Dict[str, Any]) -> None:
        self.params = params
        self.hparams = hparams

    def values(self, default: Mapping[str, float]) -> Dict[str, float]:
        """strata_group_hparams' fields: this group's values over default's (the config's, as Engine.group(0)
        gives them)."""
        out = dict(default)
        for key, value in self.hparams.items():
            if key == "betas":
                out["beta1"], out["beta2"] = value
            else:
                out[key] = value
        return out


def _number(where: str, value: Any, kind: str) -> float:
    """value (a real number, or a one-element tensor as torch 2 allows for lr) checked against kind's range."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    low, high, low_in, high_in = _RANGES[kind]
    number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not ((number >= low if low_in else number > low) and (number <= high if high_in else number < high)):
        _refuse("%s = %r is out of range %s%g, %g%s (what strata's parameter groups take)" % (
            where, value, "[" if low_in else "(", low, high, "]" if high_in else ")"))
    return number


def _hparam(where: str, key: str, value: Any) -> Any:
    if key != "betas":
        return _number(where, value, key)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        _refuse("%s = %r: betas are two numbers (beta1, beta2), each in [0, 1)" % (where, value))
    return tuple(_number("%s[%d]" % (where, i), b, "beta") for i, b in enumerate(value))


def _params(where: str, group: Mapping[str, Any]) -> List[torch.Tensor]:
    if "params" not in group:
        _refuse("%s has no 'params'; a param group is a dict {\"params\": [...], ...}" % where)
    params = group["params"]
    params = [params] if isinstance(params, torch.Tensor) else list(params)
    bad = [type(p).__name__ for p in params if not isinstance(p, torch.Tensor)]
    if bad:
        _refuse("%s['params'] holds a %s, not a tensor" % (where, bad[0]))
    return params


def _group(label: str, index: int, group: Mapping[str, Any], torch_keys: Tuple[str, ...]) -> ParamGroup:
    """One group, every key checked. torch_keys: the keys of torch's own beyond PER_GROUP, OFF and IMPLEMENTATION
    that this source may hold (its group's names, its decoupling, a scheduler's bookkeeping)."""
    where = "%s[%d]" % (label, index)
    if not isinstance(group, Mapping):
        _refuse("%s is a %s; a param group is a dict {\"params\": [...], ...}" % (where, type(group).__name__))
    hparams: Dict[str, Any] = {}
    for key, value in group.items():
        if key in PER_GROUP:
            hparams[key] = _hparam("%s[%r]" % (where, key), key, value)
        elif key in OFF:
            if value:
                _refuse("%s sets %s = %r, which strata's Adam does not do (for any group); hint: leave it False" %
                        (where, key, value))
        elif key != "params" and key not in IMPLEMENTATION and key not in torch_keys:
            allowed = ("params",) + PER_GROUP + OFF + IMPLEMENTATION + torch_keys
            _refuse("%s has the key %r, which strata does not take: a param group's keys are those of torch's "
                    "Adam/AdamW (%s); hint: drop it" % (where, key, ", ".join(allowed)))
    return ParamGroup(_params(where, group), hparams)


def _disjoint(label: str, groups: List[ParamGroup], names: Mapping[int, str]) -> None:
    """A parameter is in one group (as torch.optim requires; a torch optimizer's groups may have been changed since
    it checked)."""
    first: Dict[int, int] = {}
    for i, group in enumerate(groups):
        for p in group.params:
            j = first.setdefault(id(p), i)
            if j != i:
                name = names.get(id(p)) or "a tensor of shape %s" % (tuple(p.shape),)
                _refuse("%s[%d] holds %s, which %s[%d] holds too; a parameter is in one group (as in torch.optim); "
                        "hint: keep it in one of them" % (label, i, name, label, j))


def from_optimizer(optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> Tuple[List[ParamGroup], bool]:
    """(the groups, True for AdamW's decoupled decay or False for Adam's L2 term) of a torch Adam / AdamW."""
    label = "the optimizer's param_groups"
    # decoupled_weight_decay is a key of torch 2's Adam only: an older torch ignores it, and so it is not taken there.
    known = (DECOUPLED,) if DECOUPLED in optimizer.defaults else ()
    groups = [_group(label, i, g, known + (NAMES,) + BOOKKEEPING) for i, g in enumerate(optimizer.param_groups)]
    adamw = isinstance(optimizer, torch.optim.AdamW)
    decoupled = [(i, bool(g.get(DECOUPLED))) for i, g in enumerate(optimizer.param_groups)] if known else []
    if decoupled:
        adamw = decoupled[0][1]
        other = [i for i, flag in decoupled if flag != adamw]
        if other:
            _refuse("%s[%d] sets %s = %r and %s[%d] %r; strata's engine runs one update for every group (the "
                    "config's optimizer.type: AdamW or Adam); hint: the same in every group" % (
                        label, other[0], DECOUPLED, not adamw, label, decoupled[0][0], adamw))
    _disjoint(label, groups, names)
    return groups, adamw


def from_dicts(items: List[Any], names: Mapping[int, str]) -> Optional[List[ParamGroup]]:
    """DeepSpeed's model_parameters as param groups (dicts whose keys override the config's optimizer.params), or
    None for a list of tensors (one group: the config's)."""
    if not any(isinstance(item, Mapping) for item in items):
        return None
    if not all(isinstance(item, Mapping) for item in items):
        _refuse("model_parameters mixes param group dicts and tensors; as torch.optim, give either tensors or dicts "
                "{\"params\": [...], ...}")
    groups = [_group("model_parameters", i, g, BOOKKEEPING) for i, g in enumerate(items)]
    _disjoint("model_parameters", groups, names)
    return groups


def listed(items: Iterable[Any]) -> List[Any]:
    """model_parameters as a list, each group dict's params a list (a generator, as model.parameters() gives, is read
    once and initialize reads them more than once)."""
    out: List[Any] = []
    for item in items:
        if isinstance(item, Mapping) and "params" in item and not isinstance(item["params"], torch.Tensor):
            item = dict(item, params=list(item["params"]))
        out.append(item)
    return out


def members(groups: Iterable[ParamGroup]) -> List[torch.Tensor]:
    return [p for g in groups for p in g.params]

"""engine.optimizer.param_groups: every write honoured or refused at the write.

engine.optimizer has one param group per strata parameter group, in order (one for the config's "optimizer"
section; one per torch param group given to initialize). Of a group strata reads "lr" and "weight_decay" before
each step (strata_group_set), so a torch lr scheduler or a script drives that group at the next step. A group also
takes the keys torch's lr schedulers store in it for their own reading ("initial_lr", "max_lr", "min_lr",
"base_momentum", "max_momentum"), and the Adam hyperparameters it shows ("betas", "eps", "amsgrad", "maximize") only
at the value strata runs: the engine fixes them when it is made. Anything else raises InvalidArgument naming the
group, the key, why, and what to do. The list of groups is fixed: append, insert and add_param_group raise.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Iterable, List, Mapping, NoReturn, Optional, Tuple

import torch

from ..engine import Engine
from ..errors import InvalidArgument

# Keys torch's lr schedulers write into a group and read back themselves (torch/optim/lr_scheduler.py, 1.13 and
# 2.x); strata never reads them.
BOOKKEEPING = ("initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum")
# torch's Adam switches that strata's Adam does not have: only off.
_SWITCHES = ("amsgrad", "maximize")
_MOMENTUM_HINT = ("if an lr scheduler writes it (OneCycleLR, CyclicLR, strata's OneCycle), build it with "
                  "cycle_momentum=False")
_MAX = 1e6  # strata_group_hparams' lr and weight_decay are in [0, 1e6]


def _same(key: str, value: Any, current: Any) -> bool:
    try:
        if key == "betas":
            return len(value) == len(current) and all(float(a) == float(b) for a, b in zip(value, current))
        if key in _SWITCHES:
            return bool(value) == bool(current)
        return float(value) == float(current)
    except (TypeError, ValueError):
        return False


def _number(where: str, value: Any) -> float:
    """A group's lr or weight_decay as strata steps with it: a finite number in [0, 1e6] (a one-element tensor, as
    torch 2 allows for lr, too)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    if not 0 <= number <= _MAX:
        raise InvalidArgument("%s = %r is not allowed: strata steps with a finite number >= 0 and <= %g" % (
            where, value, _MAX))
    return number


class Group(dict):  # type: ignore[type-arg]
    """engine.optimizer's param group `index`: a dict whose writes are checked (see the top)."""

    def __init__(self, group: Mapping[str, Any], index: int, fixed: Dict[str, Any]) -> None:
        super().__init__(group)
        self._index = index
        self._fixed = fixed
        for key, v in fixed.items():
            dict.__setitem__(self, key, v)

    def _where(self, key: str) -> str:
        return "engine.optimizer.param_groups[%d][%r]" % (self._index, key)

    def __setitem__(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, self._checked(key, value))

    def _checked(self, key: str, value: Any) -> Any:
        where = "%s = %r" % (self._where(key), value)
        if key == "lr":
            _number(self._where(key), value)
            return value  # a tensor stays one (torch 2's schedulers may write them); its value is read at the step
        if key == "weight_decay":
            return _number(self._where(key), value)
        if key in BOOKKEEPING:
            return value
        if key == "params":
            raise InvalidArgument("%s: the parameters strata trains are fixed at initialize; hint: choose them with "
                                  "model_parameters= (or requires_grad) before strata.torch.initialize" % where)
        if key in self._fixed:
            if _same(key, value, self._fixed[key]):
                return value
            raise InvalidArgument(
                "%s is not honoured: strata's Adam runs %s = %r in this group at every step, as initialize set it, "
                "and cannot change it between steps (only lr and weight_decay); hint: %s, or set it in the group "
                "before strata.torch.initialize" % (where, key, self._fixed[key],
                                                    _MOMENTUM_HINT if key == "betas" else "leave it as it is"))
        if key == "momentum":
            raise InvalidArgument("%s is not honoured: strata runs Adam, which has no momentum to change (its betas "
                                  "are fixed at initialize); hint: %s" % (where, _MOMENTUM_HINT))
        raise InvalidArgument(
            "%s is not honoured: strata reads only 'lr' and 'weight_decay' of a param group (at each step); it keeps "
            "%s as torch's lr schedulers store them, and %s at the values it runs; hint: drop the key" % (
                where, ", ".join(BOOKKEEPING), ", ".join(self._fixed)))

    def hparams(self) -> Dict[str, float]:
        """strata_group_hparams' fields for this group's next step."""
        beta1, beta2 = self._fixed["betas"]
        return {"lr": _number(self._where("lr"), self["lr"]), "weight_decay": float(self["weight_decay"]),
                "beta1": beta1, "beta2": beta2, "eps": self._fixed["eps"]}

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def _refuse_removal(self, key: Any) -> NoReturn:
        raise InvalidArgument("engine.optimizer.param_groups[%d]: removing %r is not honoured: strata's param group "
                              "keeps its keys; hint: write 'lr' or 'weight_decay' instead" % (self._index, key))

    def __delitem__(self, key: str) -> None:
        if key not in BOOKKEEPING:
            self._refuse_removal(key)
        dict.__delitem__(self, key)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self and key not in BOOKKEEPING:
            self._refuse_removal(key)
        return dict.pop(self, key, *default)

    def popitem(self) -> Tuple[str, Any]:
        self._refuse_removal("an item")

    def clear(self) -> None:
        self._refuse_removal("every key")

    def __ior__(self, other: Any) -> Group:  # type: ignore[misc]
        self.update(other)
        return self

    def __reduce__(self) -> Any:  # copies and pickles are plain dicts: only the engine's own groups are checked
        return (dict, (dict(self),))


class Groups(list):  # type: ignore[type-arg]
    """engine.optimizer.param_groups: one Group per strata parameter group; the list cannot grow or be replaced
    piece by piece."""

    def _refuse(self, what: str) -> NoReturn:
        raise InvalidArgument("engine.optimizer.param_groups.%s is not honoured: strata's parameter groups are made "
                              "with the engine, from the param groups given at initialize; hint: pass them to "
                              "strata.torch.initialize (the optimizer's param groups, or model_parameters=)" % what)

    def append(self, item: Any) -> None:
        self._refuse("append(...)")

    def extend(self, items: Iterable[Any]) -> None:
        self._refuse("extend(...)")

    def insert(self, index: Any, item: Any) -> None:
        self._refuse("insert(...)")

    def __iadd__(self, items: Iterable[Any]) -> Groups:  # type: ignore[misc]
        self._refuse("+= [...]")

    def __setitem__(self, index: Any, item: Any) -> None:
        self._refuse("[%r] = ..." % (index,))

    def __delitem__(self, index: Any) -> None:
        self._refuse("del [%r]" % (index,))

    def pop(self, index: Any = -1) -> Any:
        self._refuse("pop()")

    def remove(self, item: Any) -> None:
        self._refuse("remove(...)")

    def clear(self) -> None:
        self._refuse("clear()")

    def push(self, engine: Engine) -> None:
        """Each group's lr and weight_decay into its strata group, for the step that follows (strata_group_set)."""
        for index, group in enumerate(self):
            engine.set_group(index, group.hparams())

    def __reduce__(self) -> Any:
        return (list, (list(self),))


def guard(groups: List[Dict[str, Any]], values: List[Dict[str, float]]) -> Groups:
    """The checked list for the holder's groups (as torch.optim.Optimizer built them), values[i] the hyperparameters
    of strata's group i (Engine.group), whose betas and eps it shows."""
    out = Groups()
    for index, (group, v) in enumerate(zip(groups, values)):
        fixed = {"betas": (v["beta1"], v["beta2"]), "eps": v["eps"], "amsgrad": False, "maximize": False}
        list.append(out, Group(group, index, fixed))
    return out


def refuse_add_param_group(group: Optional[Mapping[str, Any]]) -> NoReturn:
    raise InvalidArgument("engine.optimizer.add_param_group(...) is not honoured: strata's engine trains the "
                          "parameters given at initialize, in the param groups it was given there; hint: pass every "
                          "group to strata.torch.initialize (the optimizer's param groups, or model_parameters=)")


def load(groups: List[Dict[str, Any]], state_dict: Mapping[str, Any]) -> None:
    """engine.optimizer.load_state_dict: each saved group's keys, written as param_groups[i][key] = value."""
    saved = state_dict.get("param_groups") or []
    if len(saved) != len(groups):
        raise InvalidArgument("engine.optimizer.load_state_dict: the state holds %d param groups; strata's optimizer "
                              "has %d; hint: load a state that engine.optimizer.state_dict() gave" % (
                                  len(saved), len(groups)))
    for group, entry in zip(groups, saved):
        for key, value in entry.items():
            if key != "params":
                group[key] = value

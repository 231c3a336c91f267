"""engine.optimizer.param_groups: every write honoured or refused at the write.

strata's engine runs one set of Adam hyperparameters, fixed at initialize, for every parameter; of a param group it
reads only "lr", at each step. So the one group takes "lr" (a number >= 0, read at the next step), the keys torch's
lr schedulers store in a group for their own reading ("initial_lr", "max_lr", "min_lr", "base_momentum",
"max_momentum"), and the Adam hyperparameters it shows ("betas", "eps", "weight_decay", "amsgrad", "maximize")
only at the value strata runs: the C engine has no way to change them per step (strata_step_args holds the lr
alone). Anything else raises InvalidArgument naming the key, why, and what to do. The list of groups is fixed:
append, insert and add_param_group raise.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Iterable, List, Mapping, NoReturn, Optional, Tuple

import torch

from ..config import Config
from ..errors import InvalidArgument

# Keys torch's lr schedulers write into a group and read back themselves (torch/optim/lr_scheduler.py, 1.13 and
# 2.x); strata never reads them.
BOOKKEEPING = ("initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum")
# torch's Adam switches that strata's Adam does not have: only off.
_SWITCHES = ("amsgrad", "maximize")
_MOMENTUM_HINT = ("if an lr scheduler writes it (OneCycleLR, CyclicLR, strata's OneCycle), build it with "
                  "cycle_momentum=False")


def hyperparameters(config: Config) -> Dict[str, Any]:
    """The Adam hyperparameters strata runs, as the config writes them (the resolved ones are rounded to fp32)."""
    written = config.document.get("optimizer", {})
    written = written.get("params", {}) if isinstance(written, dict) else {}
    written = written if isinstance(written, dict) else {}

    def value(key: str) -> Any:
        v = written.get(key)
        return v if v is not None else config.resolved["optimizer.params." + key]
    return {"betas": tuple(float(b) for b in value("betas")), "eps": float(value("eps")),
            "weight_decay": float(value("weight_decay")), "amsgrad": False, "maximize": False}


def _same(key: str, value: Any, current: Any) -> bool:
    try:
        if key == "betas":
            return len(value) == len(current) and all(float(a) == float(b) for a, b in zip(value, current))
        if key in _SWITCHES:
            return bool(value) == bool(current)
        return float(value) == float(current)
    except (TypeError, ValueError):
        return False


def _lr_value(value: Any) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise InvalidArgument("engine.optimizer.param_groups[0]['lr'] = %r is not allowed: strata steps with a finite "
                              "number >= 0" % (value,))
    return float(value)


class Group(dict):  # type: ignore[type-arg]
    """engine.optimizer's param group: a dict whose writes are checked (see the top)."""

    def __init__(self, group: Mapping[str, Any], fixed: Dict[str, Any]) -> None:
        super().__init__(group)
        self._fixed = fixed
        for key, v in fixed.items():
            dict.__setitem__(self, key, v)

    def __setitem__(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, self._checked(key, value))

    def _checked(self, key: str, value: Any) -> Any:
        where = "engine.optimizer.param_groups[0][%r] = %r" % (key, value)
        if key == "lr":
            return value if isinstance(value, torch.Tensor) else _lr_value(value)
        if key in BOOKKEEPING:
            return value
        if key == "params":
            raise InvalidArgument("%s: the parameters strata trains are fixed at initialize; hint: choose them with "
                                  "model_parameters= (or requires_grad) before strata.torch.initialize" % where)
        if key in self._fixed:
            if _same(key, value, self._fixed[key]):
                return value
            raise InvalidArgument(
                "%s is not honoured: strata's Adam runs %s = %r at every step, from the config's \"optimizer\" "
                "section, and cannot change it between steps (only the lr); hint: %s, or set it in the config" % (
                    where, key, self._fixed[key], _MOMENTUM_HINT if key == "betas" else "leave it as it is"))
        if key == "momentum":
            raise InvalidArgument("%s is not honoured: strata runs Adam, which has no momentum to change (its betas "
                                  "are fixed by the config); hint: %s" % (where, _MOMENTUM_HINT))
        raise InvalidArgument(
            "%s is not honoured: strata reads only 'lr' of a param group (at each step); it keeps %s as torch's lr "
            "schedulers store them, and %s at the config's values; hint: change the strata config or drop the key"
            % (where, ", ".join(BOOKKEEPING), ", ".join(self._fixed)))

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def _refuse_removal(self, key: Any) -> NoReturn:
        raise InvalidArgument("engine.optimizer.param_groups[0]: removing %r is not honoured: strata's param group "
                              "keeps its keys; hint: write 'lr' instead" % (key,))

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

    def __reduce__(self) -> Any:  # copies and pickles are plain dicts: only the engine's own group is checked
        return (dict, (dict(self),))


class Groups(list):  # type: ignore[type-arg]
    """engine.optimizer.param_groups: one Group; the list cannot grow or be replaced piece by piece."""

    def _refuse(self, what: str) -> NoReturn:
        raise InvalidArgument("engine.optimizer.param_groups.%s is not honoured: strata's engine runs one set of "
                              "optimizer hyperparameters over the parameters given at initialize; hint: choose what "
                              "to train with model_parameters= before strata.torch.initialize, or use "
                              "strata.torch.OffloadAdam for param groups of their own" % what)

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

    def __reduce__(self) -> Any:
        return (list, (list(self),))


def guard(groups: List[Dict[str, Any]], config: Config) -> Groups:
    """The checked list for an optimizer's one group (the holder's, as torch.optim.Optimizer built it)."""
    out = Groups()
    list.append(out, Group(groups[0], hyperparameters(config)))
    return out


def refuse_add_param_group(group: Optional[Mapping[str, Any]]) -> NoReturn:
    raise InvalidArgument("engine.optimizer.add_param_group(...) is not honoured: strata's engine trains the "
                          "parameters given at initialize, with one set of hyperparameters; hint: pass every "
                          "parameter to strata.torch.initialize (model_parameters=), or use strata.torch.OffloadAdam "
                          "for param groups of their own")


def load(groups: List[Dict[str, Any]], state_dict: Mapping[str, Any]) -> None:
    """engine.optimizer.load_state_dict: the saved group's keys, each written as param_groups[0][key] = value."""
    saved = state_dict.get("param_groups") or []
    if len(saved) != 1:
        raise InvalidArgument("engine.optimizer.load_state_dict: the state holds %d param groups; strata's optimizer "
                              "has one; hint: load a state that engine.optimizer.state_dict() gave" % len(saved))
    for key, value in saved[0].items():
        if key != "params":
            groups[0][key] = value

"""DeepSpeed's "scheduler" config section for the PyTorch engine: WarmupLR, WarmupDecayLR, WarmupCosineLR and
OneCycle, with DeepSpeed's parameter names, defaults and formulas (deepspeed/runtime/lr_schedules.py), as torch lr
schedulers that set each param group's "lr" (and OneCycle's "betas").

    {"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10000, "warmup_num_steps": 100}}}
    scheduler = strata.torch.schedulers.build(config.trainer["scheduler"], engine.optimizer)

The counting is DeepSpeed's, so a config gives the same learning rates here as there: the optimizer's step k
(from 0) runs with DeepSpeed's formula at last_batch_iteration = k - 1 (its value at construction for k = 0; the
engine calls scheduler.step() after each optimizer step that was not skipped). torch's schedulers count last_epoch
from 0 at construction, so last_batch_iteration is last_epoch - 1 here.

Where strata is stricter than DeepSpeed: an unknown type or parameter, a bad value and an unknown warmup_type raise
ConfigError naming it and what is allowed (DeepSpeed raises TypeError for a parameter and falls back to "log" with a
warning for a warmup_type); OneCycle's stair counts, which DeepSpeed accepts and never reads, are refused unless
off; WarmupCosineLR refuses total_num_steps <= warmup_num_steps, where DeepSpeed's cosine divides by zero or runs
backwards. Before its first step WarmupCosineLR gives every group lr 0 (DeepSpeed sets only the first group's).
"""
from __future__ import annotations

import difflib
import math
import numbers
import warnings
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Type, Union

import torch

from ..config import Config
from ..errors import ConfigError, InvalidArgument

LOG, LINEAR = "log", "linear"
_REQUIRED = object()  # a parameter without a default

# One value for every param group, or one per group.
PerGroup = Union[float, Sequence[float]]
# check(key, value): raises ConfigError naming scheduler.params.<key> when value is not allowed.
Check = Callable[[str, Any], None]


class _DeepSpeedSchedule(torch.optim.lr_scheduler._LRScheduler):
    """A DeepSpeed schedule as a torch lr scheduler. A subclass sets its attributes, then calls this __init__, and
    defines lrs(iteration): the group lrs DeepSpeed's get_lr gives at last_batch_iteration = iteration."""

    PARAMS: ClassVar[Dict[str, Any]] = {}  # DeepSpeed's parameter names and defaults, in its order

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(optimizer)  # runs step() once: last_epoch 0, the lrs of last_batch_iteration -1

    @property
    def last_batch_iteration(self) -> int:
        """DeepSpeed's counter: -1 before the first scheduler.step(), then the index of the last batch."""
        epoch: int = self.last_epoch
        return epoch - 1

    # torch 1.13's annotation says one float; every scheduler, torch's own included, returns one lr per group.
    def get_lr(self) -> List[float]:  # type: ignore[override]
        return self.lrs(self.last_batch_iteration)

    def lrs(self, iteration: int) -> List[float]:
        raise NotImplementedError


def _per_group(optimizer: torch.optim.Optimizer, value: Any, name: str) -> List[float]:
    """DeepSpeed's _format_param: one value for every group, or a list with one per group."""
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ConfigError("config: scheduler.params.%s has %d values but the optimizer has %d param groups; "
                              "hint: give one number for all, or one per group" % (name, len(value), groups))
        return [float(v) for v in value]
    return [float(value)] * groups


class _Warmup(_DeepSpeedSchedule):
    """What WarmupLR, WarmupDecayLR and WarmupCosineLR share: the log or linear warmup over warmup_num_steps
    (at least 2, as in DeepSpeed)."""

    def _init_warmup(self, warmup_num_steps: int, warmup_type: str) -> None:
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)

    def _warmup_gamma(self, iteration: int) -> float:
        """From 0 at iteration 0 towards 1 at warmup_num_steps."""
        if self.warmup_type == LOG:
            return self.inverse_log_warm_up * math.log(iteration + 1)
        return iteration / self.warmup_num_steps


class WarmupLR(_Warmup):
    """From warmup_min_lr to warmup_max_lr over warmup_num_steps steps (log or linear), then warmup_max_lr. The
    optimizer's own lr is not used (as in DeepSpeed)."""

    PARAMS = {"warmup_min_lr": 0.0, "warmup_max_lr": 0.001, "warmup_num_steps": 1000, "warmup_type": LOG}

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_min_lr: PerGroup = 0.0,
                 warmup_max_lr: PerGroup = 0.001, warmup_num_steps: int = 1000, warmup_type: str = LOG) -> None:
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [big - small for big, small in zip(self.max_lrs, self.min_lrs)]
        self._init_warmup(warmup_num_steps, warmup_type)
        super().__init__(optimizer)

    def _gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return self._warmup_gamma(iteration)
        return 1.0

    def lrs(self, iteration: int) -> List[float]:
        if iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma(iteration)
        return [low + delta * gamma for low, delta in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR's warmup, then a linear decay to 0 at total_num_steps."""

    PARAMS = {"total_num_steps": _REQUIRED, **WarmupLR.PARAMS}

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_lr: PerGroup = 0.0,
                 warmup_max_lr: PerGroup = 0.001, warmup_num_steps: int = 1000, warmup_type: str = LOG) -> None:
        self.total_num_steps = total_num_steps
        if total_num_steps < max(2, warmup_num_steps):
            warnings.warn("strata: scheduler WarmupDecayLR: total_num_steps = %d is less than warmup_num_steps = %d; "
                          "the lr drops to 0 when the warmup ends" % (total_num_steps, max(2, warmup_num_steps)))
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type)

    def _gamma(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return self._warmup_gamma(iteration)
        return max(0.0, float(self.total_num_steps - iteration) /
                   float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(_Warmup):
    """The optimizer's lr times a ratio: from warmup_min_ratio to 1 over warmup_num_steps (log or linear), then a
    cosine from 1 down to cos_min_ratio at total_num_steps."""

    PARAMS = {"total_num_steps": _REQUIRED, "warmup_min_ratio": 0.0, "warmup_num_steps": 1000,
              "cos_min_ratio": 0.0001, "warmup_type": LOG}

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = LOG) -> None:
        self._init_warmup(warmup_num_steps, warmup_type)
        if total_num_steps <= self.warmup_num_steps:
            raise ConfigError("config: scheduler WarmupCosineLR: total_num_steps = %d must exceed warmup_num_steps "
                              "(%d; at least 2): the cosine runs over the steps between them" %
                              (total_num_steps, self.warmup_num_steps))
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.cos_min_ratio = cos_min_ratio
        self.org_lrs: List[float] = [group["lr"] for group in optimizer.param_groups]
        super().__init__(optimizer)

    def lr_ratio(self, iteration: int) -> float:
        if iteration < self.warmup_num_steps:
            return self.warmup_min_ratio + self._warmup_gamma(iteration) * (1.0 - self.warmup_min_ratio)
        real_last_step = iteration - self.warmup_num_steps + 1
        real_total_steps = self.total_num_steps - self.warmup_num_steps
        ratio = (1 + math.cos(math.pi * real_last_step / real_total_steps)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)

    def lrs(self, iteration: int) -> List[float]:
        if iteration < 0:
            return [0.0] * len(self.org_lrs)
        ratio = self.lr_ratio(iteration)
        return [lr * ratio for lr in self.org_lrs]


class OneCycle(_DeepSpeedSchedule):
    """One cycle from cycle_min_lr up to cycle_max_lr (cycle_first_step_size steps) and back down
    (cycle_second_step_size, default the first), then cycle_min_lr / (1 + decay_lr_rate * n / decay_step_size).
    With cycle_momentum, beta1 cycles inversely between cycle_max_mom and cycle_min_mom and param groups get
    betas (beta1, 0.99), as in DeepSpeed; an optimizer without betas in its defaults (strata.torch's, whose
    betas come from the config) turns momentum cycling off with a warning, as DeepSpeed does."""

    PARAMS = {"cycle_min_lr": _REQUIRED, "cycle_max_lr": _REQUIRED, "decay_lr_rate": 0.0,
              "cycle_first_step_size": 2000, "cycle_second_step_size": None, "cycle_first_stair_count": 0,
              "cycle_second_stair_count": None, "decay_step_size": 0, "cycle_momentum": True, "cycle_min_mom": 0.8,
              "cycle_max_mom": 0.9, "decay_mom_rate": 0.0}

    def __init__(self, optimizer: torch.optim.Optimizer, cycle_min_lr: PerGroup, cycle_max_lr: PerGroup,
                 decay_lr_rate: float = 0.0, cycle_first_step_size: int = 2000,
                 cycle_second_step_size: Optional[int] = None, cycle_first_stair_count: Optional[int] = 0,
                 cycle_second_stair_count: Optional[int] = None, decay_step_size: int = 0, cycle_momentum: bool = True,
                 cycle_min_mom: float = 0.8, cycle_max_mom: float = 0.9, decay_mom_rate: float = 0.0) -> None:
        for name, value in (("cycle_first_stair_count", cycle_first_stair_count),
                            ("cycle_second_stair_count", cycle_second_stair_count)):
            if value is not None and value > 0:
                raise ConfigError("config: scheduler.params.%s = %r is not implemented: DeepSpeed's OneCycle accepts "
                                  "it but never reads it (its lr is not staircased); hint: remove it" % (name, value))
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.decay_step_size = decay_step_size
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_lr_rate, 0)
        self.cycle_momentum = cycle_momentum
        if cycle_momentum and "betas" not in optimizer.defaults:
            warnings.warn("strata: scheduler OneCycle: cycle_momentum is off: %s has no betas in its defaults" %
                          type(optimizer).__name__)
            self.cycle_momentum = False
        if self.cycle_momentum:
            self.min_moms = [(cycle_min_mom, 0.99)] * len(optimizer.param_groups)
            self.max_moms = [(cycle_max_mom, 0.99)] * len(optimizer.param_groups)
            self.decay_mom_rate = decay_mom_rate
            self.skip_mom_decay = math.isclose(decay_step_size, 0) or math.isclose(decay_mom_rate, 0)
        super().__init__(optimizer)

    def _scale_factor(self, iteration: int) -> float:
        batch_iteration = iteration + 1
        cycle = math.floor(1 + batch_iteration / self.total_size)
        x = 1.0 + batch_iteration / self.total_size - cycle
        if x <= self.step_ratio:
            return x / self.step_ratio
        return (x - 1) / (self.step_ratio - 1)

    def lrs(self, iteration: int) -> List[float]:
        if iteration < self.total_size:
            scale = self._scale_factor(iteration)
            return [low + (high - low) * scale for low, high in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        interval = (iteration - self.total_size + 1) / self.decay_step_size
        return [low / (1 + self.decay_lr_rate * interval) for low in self.min_lrs]

    def momentums(self, iteration: int) -> List[Tuple[float, float]]:
        """The (beta1, beta2) of each group at last_batch_iteration = iteration (cycle_momentum only). Before the
        first step DeepSpeed sets cycle_min_mom, not its formula's value (cycle_max_mom) there."""
        if iteration < 0:
            return list(self.min_moms)
        if iteration < self.total_size:
            scale = self._scale_factor(iteration)
            return [(high[0] - (high[0] - low[0]) * scale, low[1]) for low, high in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        interval = (iteration - self.total_size + 1) / self.decay_step_size
        return [(beta0 * (1 + self.decay_mom_rate * interval), beta1) for beta0, beta1 in self.max_moms]

    def step(self, epoch: Optional[int] = None) -> None:
        super().step(epoch)
        if self.cycle_momentum:
            for group, betas in zip(self.optimizer.param_groups, self.momentums(self.last_batch_iteration)):
                group["betas"] = betas


SCHEDULERS: Dict[str, Type[_DeepSpeedSchedule]] = {cls.__name__: cls for cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)}


# ---------------------------------------------------------------- checking the section


def _number(key: str, value: Any, low: float = 0.0) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < low:
        raise ConfigError("config: scheduler.params.%s = %r is not allowed: it must be a number >= %g" %
                          (key, value, low))


def _lr(key: str, value: Any) -> None:
    for v in (value if isinstance(value, (list, tuple)) and value else [value]):
        _number(key, v)


def _integer(low: int) -> Check:
    def check(key: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ConfigError("config: scheduler.params.%s = %r is not allowed: it must be an integer >= %d" %
                              (key, value, low))
    return check


def _optional_integer(low: int) -> Check:
    inner = _integer(low)

    def check(key: str, value: Any) -> None:
        if value is not None:
            inner(key, value)
    return check


def _warmup_type(key: str, value: Any) -> None:
    if value not in (LOG, LINEAR):
        raise ConfigError("config: scheduler.params.%s = %r is not allowed: it must be \"%s\" or \"%s\"" %
                          (key, value, LOG, LINEAR))


def _boolean(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError("config: scheduler.params.%s = %r is not allowed: it must be true or false" % (key, value))


def _stair_count(key: str, value: Any) -> None:
    if value is not None:
        _integer(-1)(key, value)


_CHECKS: Dict[str, Check] = {
    "warmup_min_lr": _lr, "warmup_max_lr": _lr, "warmup_num_steps": _integer(0), "warmup_type": _warmup_type,
    "total_num_steps": _integer(1), "warmup_min_ratio": _number, "cos_min_ratio": _number,
    "cycle_min_lr": _lr, "cycle_max_lr": _lr, "decay_lr_rate": _number, "cycle_first_step_size": _integer(1),
    "cycle_second_step_size": _optional_integer(1), "cycle_first_stair_count": _stair_count,
    "cycle_second_stair_count": _stair_count, "decay_step_size": _integer(0), "cycle_momentum": _boolean,
    "cycle_min_mom": _number, "cycle_max_mom": _number, "decay_mom_rate": _number,
}


def build(scheduler_cfg: Union[None, Dict[str, Any], Config], optimizer: torch.optim.Optimizer
          ) -> Optional[_DeepSpeedSchedule]:
    """The torch lr scheduler for a DeepSpeed "scheduler" section ({"type": ..., "params": {...}}, or a
    strata.Config holding one; None gives None), driving optimizer (a torch.optim.Optimizer). ConfigError names an
    unknown type or parameter with the allowed ones, a missing required parameter, or a bad value;
    InvalidArgument an optimizer that is not a torch one."""
    if isinstance(scheduler_cfg, Config):
        scheduler_cfg = scheduler_cfg.trainer.get("scheduler")
    if scheduler_cfg is None:
        return None
    if not isinstance(scheduler_cfg, dict) or "type" not in scheduler_cfg:
        raise ConfigError("config: scheduler must be an object with a \"type\" (and \"params\"), got %r; hint: "
                          "{\"type\": \"WarmupLR\", \"params\": {...}}" % (scheduler_cfg,))
    extra = sorted(set(scheduler_cfg) - {"type", "params"})
    if extra:
        raise ConfigError("config: scheduler.%s is not a key of the scheduler section; allowed: type, params" %
                          extra[0])
    kind = scheduler_cfg["type"]
    cls = SCHEDULERS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        close = difflib.get_close_matches(str(kind), SCHEDULERS, n=1)
        hint = " did you mean %s?" % close[0] if close else ""
        raise ConfigError("config: scheduler.type = %r is not a scheduler strata implements;%s allowed: %s "
                          "(DeepSpeed's LRRangeTest is not implemented)" % (kind, hint, ", ".join(SCHEDULERS)))
    params = scheduler_cfg.get("params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise ConfigError("config: scheduler.params must be an object, got %r" % (params,))
    for key in params:
        if key not in cls.PARAMS:
            close = difflib.get_close_matches(key, cls.PARAMS, n=1)
            raise ConfigError("config: scheduler.params.%s is not a parameter of %s;%s allowed: %s" % (
                key, kind, " did you mean %s?" % close[0] if close else "", ", ".join(cls.PARAMS)))
        _CHECKS[key](key, params[key])
    missing = [key for key, default in cls.PARAMS.items() if default is _REQUIRED and key not in params]
    if missing:
        raise ConfigError("config: scheduler.params.%s is required by %s (allowed: %s)" %
                          (missing[0], kind, ", ".join(cls.PARAMS)))
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgument("scheduler %s needs a torch.optim.Optimizer to drive, got %s" %
                              (kind, type(optimizer).__name__))
    return cls(optimizer, **params)

"""Who drives strata's lr: the lr scheduler given to strata.torch.initialize, moved onto engine.optimizer.

A scheduler is built on an optimizer and writes that optimizer's param_groups[i]['lr']. strata steps each of its
parameter groups with engine.optimizer.param_groups[i]['lr'], so a scheduler built on the user's torch.optim.AdamW
(the one passed as optimizer=) would drive an optimizer strata never reads. initialize therefore rebinds it: every
scheduler in it (SequentialLR's and ChainedScheduler's nested ones too) takes engine.optimizer as its optimizer,
engine.optimizer's group i (strata's group i is the user's group i) takes the lr and the bookkeeping keys the
scheduler set on the user's group i ('initial_lr', OneCycleLR's 'max_lr' / 'min_lr'), and engine.optimizer.step gets
torch's step-counting patch, so the scheduler goes on exactly where it was, for every group, without torch's
"lr_scheduler.step() before optimizer.step()" warning.

What cannot be moved exactly is refused at initialize, before the model moves into strata, with the fix: a callable
lr_scheduler=lambda opt: ... builds the scheduler on engine.optimizer itself.
"""
from __future__ import annotations

from typing import Any, List, NoReturn, Optional

import torch

from ..errors import InvalidArgument
from ._param_groups import BOOKKEEPING

_HINT = ("hint: pass a callable that builds it on strata's optimizer, lr_scheduler=lambda opt: %s(opt, ...); "
         "initialize calls it with engine.optimizer")


def _tree(scheduler: Any) -> List[Any]:
    """scheduler and every scheduler nested in it (SequentialLR, ChainedScheduler), depth first."""
    out = [scheduler]
    for inner in getattr(scheduler, "_schedulers", None) or []:
        out.extend(_tree(inner))
    return out


def _refuse(scheduler: Any, why: str, hint: Optional[str] = None) -> NoReturn:
    name = type(scheduler).__name__
    raise InvalidArgument("strata.torch.initialize: lr_scheduler=%s %s, so it cannot be moved onto engine.optimizer "
                          "(whose lr strata steps with); %s" % (name, why, hint or _HINT % name))


def is_plateau(scheduler: Any) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def step(scheduler: Any) -> None:
    """The engine's step of its scheduler, after each optimizer step that was not skipped. A ReduceLROnPlateau is
    the caller's to step, with its metric (scheduler.step(val_loss)), as in torch: the engine has none to give."""
    if scheduler is not None and not is_plateau(scheduler):
        scheduler.step()


def check_engine_argument(lr_scheduler: Any) -> None:
    """StrataEngine's lr_scheduler: None, or a callable making one from engine.optimizer. An instance was built on an
    optimizer that is not this engine's (which does not exist yet); initialize rebinds one, the engine does not."""
    if lr_scheduler is None or (callable(lr_scheduler) and not hasattr(lr_scheduler, "step")):
        return
    if hasattr(lr_scheduler, "step"):
        raise InvalidArgument("StrataEngine: lr_scheduler=%s was built on an optimizer that is not this engine's; "
                              "pass a callable (lr_scheduler=lambda opt: ...), or give the scheduler and its "
                              "optimizer to strata.torch.initialize, which moves it onto engine.optimizer" %
                              type(lr_scheduler).__name__)
    raise InvalidArgument("strata.torch.initialize: lr_scheduler must be a torch lr scheduler or a callable making one "
                          "from an optimizer, got %s" % type(lr_scheduler).__name__)


def adopt(lr_scheduler: Any, optimizer: Optional[torch.optim.Optimizer]) -> Any:
    """initialize's lr_scheduler as the engine takes it: None or a callable unchanged; a scheduler built on
    optimizer (the torch optimizer given to initialize) as a callable that moves it onto engine.optimizer. Raises
    InvalidArgument for a scheduler that cannot be moved exactly (see the top)."""
    if lr_scheduler is None or (callable(lr_scheduler) and not hasattr(lr_scheduler, "step")):
        return lr_scheduler
    if not hasattr(lr_scheduler, "step"):
        check_engine_argument(lr_scheduler)  # raises: neither a scheduler nor a callable
    if optimizer is None:
        _refuse(lr_scheduler, "drives an optimizer strata was not given (optimizer= is not set: the config's "
                "\"optimizer\" section is strata's own)")
    user: torch.optim.Optimizer = optimizer
    for s in _tree(lr_scheduler):
        owner = getattr(s, "optimizer", None)
        if owner is None and getattr(s, "_schedulers", None):
            continue  # a container that names no optimizer of its own
        if id(owner) != id(user):
            _refuse(s, "drives %s, not the optimizer given to initialize" % type(owner).__name__)
        if getattr(s, "cycle_momentum", False):
            _refuse(s, "cycles the momentum (cycle_momentum=True writes 'betas' at each step, which strata's Adam "
                    "cannot change between steps)", "hint: build it with cycle_momentum=False (strata runs the "
                    "optimizer's betas throughout)")
        groups = user.param_groups
        held = [k for k, v in vars(s).items() if k != "optimizer" and (v is user or any(v is g for g in groups))]
        if held:
            _refuse(s, "keeps its optimizer (or a param group) in %s as well, which strata cannot move" %
                    ", ".join(held))
    sources = list(user.param_groups)

    def rebind(holder: torch.optim.Optimizer) -> Any:
        _patch_step_counting(holder)
        for group, source in zip(holder.param_groups, sources):  # initialize made one group of each of the user's
            for key in ("lr",) + BOOKKEEPING:
                if key in source:
                    group[key] = source[key]
        for s in _tree(lr_scheduler):
            if getattr(s, "optimizer", None) is user:
                s.optimizer = holder
        return lr_scheduler
    return rebind


def _patch_step_counting(holder: torch.optim.Optimizer) -> None:
    """torch's patch of holder.step that counts its calls for the "lr_scheduler.step() before optimizer.step()"
    check (torch 1.13: _with_counter and _step_count; 2.x: _wrapped_by_lr_sched and _opt_called), made the way that
    works for every torch: by building a scheduler on holder that leaves each group's lr as it is (x 1.0). The
    'initial_lr' it stores is taken back from the groups that had none."""
    before = [("initial_lr" in group, group["lr"]) for group in holder.param_groups]
    torch.optim.lr_scheduler.LambdaLR(holder, lambda _: 1.0)
    for group, (had, lr) in zip(holder.param_groups, before):
        group["lr"] = lr
        if not had:
            group.pop("initial_lr", None)


"""strata under a Hugging Face transformers Trainer: change Trainer to StrataTrainer and give it a strata config.

    from strata.torch.hf import StrataTrainer
    trainer = StrataTrainer(model=model, args=training_args, train_dataset=ds,
                            strata_config={"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                           "nvme_path": "/local/nvme"}, "offload_optimizer": {"device": "nvme",
                                           "nvme_path": "/local/nvme"}}})
    trainer.train()

Why a Trainer subclass rather than a callback: strata must own the optimizer step, the backward's loss scaling and
gradient clipping all at once, and Trainer's callbacks can observe those but not replace them. The subclass replaces
exactly the methods Trainer documents for that (create_optimizer, create_scheduler, training_step, the checkpoint's
optimizer and model loading) and leaves the loop, logging, evaluation, data and callbacks to Trainer.

The config's "auto" values are filled as transformers' DeepSpeed integration fills them (fill_auto below, also for
strata.torch.initialize): from TrainingArguments learning_rate, adam_beta1/2, adam_epsilon, weight_decay,
per_device_train_batch_size, gradient_accumulation_steps, max_grad_norm (strata clips: Trainer's own clipping would
see no gradients, strata holds them), fp16 / bf16; from the model's hidden size the ZeRO bucket sizes; from the
number of training steps the scheduler's. A value the config sets itself must agree with the argument. StrataTrainer
also sets the optimizer, batch, clipping and precision keys a config leaves out, since strata runs the optimizer.

The learning rate has one owner: a config "scheduler" section (WarmupLR, WarmupDecayLR, ... as in DeepSpeed)
becomes Trainer's lr_scheduler, which Trainer steps once per optimizer step; without one, Trainer's own schedule
(lr_scheduler_type) drives strata's optimizer. A non-default lr_scheduler_type or warmup that the config's scheduler
would leave unused is refused.

Precision: TrainingArguments bf16 (Trainer's autocast, which stays on) fills bf16.enabled as transformers does:
strata then keeps the parameters and gradients in bf16 (DeepSpeed's bf16), which matches Trainer's bf16 run within
bf16 rounding. A config "bf16": {"enabled": false} with bf16=True keeps strata's parameters in fp32 under Trainer's
autocast: Trainer's bf16 bit for bit, at twice the parameter memory and traffic.

Logged: Trainer's loss (normalised as Trainer normalises it: by num_items_in_batch when the model takes it), and
grad_norm, the norm strata measured while clipping (none when max_grad_norm is 0: strata then measures none).

Weight decay: with TrainingArguments weight_decay above 0, the parameters go into Trainer's own two param groups
(those Trainer.get_decay_parameter_names names decay, the others, biases and norms, do not), as strata's parameter
groups, so that each parameter is updated as Trainer's AdamW updates it.

A peft model (LoRA, IA3, ...) trains as it is: its frozen base is strata's too, offloaded like the rest, and
trainer.save_model() writes the adapter (tests/py_peft.py).

Refused, with the reason: optimizers other than AdamW, a user-made optimizer, more than one process (Trainer's data
sharding and DDP are not strata's ranks).
"""
from __future__ import annotations

import copy
import os
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
import transformers

from ..config import Config, ConfigSource
from ..errors import ConfigError, InvalidArgument
from . import _lr_owner, schedulers
from ._initialize import _document, initialize

_ADAMW = ("adamw_torch", "adamw_hf", "adamw_torch_fused")
_SCHEDULER_FILE = "scheduler.pt"
_CHECKPOINT_TAG = "strata"
_TRAINER_SCHEDULE = "linear"  # TrainingArguments' default lr_scheduler_type


class StrataTrainer(transformers.Trainer):  # type: ignore[misc]  # transformers may be untyped: a class of Any
    """transformers.Trainer with the model's parameters, gradients and optimizer state in strata (ZeRO-3 with
    offload). strata_config: a dict, JSON path or strata.Config in the DeepSpeed vocabulary; TrainingArguments fill
    its "auto" values and the optimizer, batch and precision keys (see the top). trainer.engine is the strata.torch
    engine."""

    def __init__(self, model: Any = None, args: Any = None, *rest: Any, strata_config: ConfigSource = None,
                 optimizers: Tuple[Any, Any] = (None, None), **kwargs: Any) -> None:
        if optimizers[0] is not None:
            raise InvalidArgument("StrataTrainer: optimizers=(%s, ...) is not taken: strata runs its own AdamW on its "
                                  "tiers from the TrainingArguments' hyperparameters" %
                                  type(optimizers[0]).__name__)
        if args is None:
            raise InvalidArgument("StrataTrainer: pass args= (TrainingArguments): its learning rate, batch sizes and "
                                  "precision configure strata")
        config = _fill(strata_config, args, model)
        # The config's schedule is built when Trainer knows the number of steps (create_scheduler); the engine does
        # not get it, so that only Trainer steps it.
        self._schedule: Optional[Dict[str, Any]] = config.pop("scheduler", None)
        if optimizers[1] is not None:
            # It was built on an optimizer strata does not step (engine.optimizer does not exist yet): it would set
            # the lr of nothing.
            raise InvalidArgument(
                "StrataTrainer: optimizers=(None, %s): that scheduler drives an optimizer strata never steps, so it "
                "would set no lr; hint: TrainingArguments' lr_scheduler_type / lr_scheduler_kwargs, or the config's "
                "\"scheduler\" section" % type(optimizers[1]).__name__)
        if self._schedule is not None:
            _check_schedule_args(args, self._schedule)
        # Trainer clips what it finds in .grad, which strata has taken by then: strata clips instead (config above).
        args = copy.copy(args)
        args.max_grad_norm = 0.0
        super().__init__(model, args, *rest, optimizers=optimizers, **kwargs)
        # With fp16, accelerate makes a GradScaler that would unscale and step engine.optimizer: its parameters never
        # hold a gradient (strata does), so torch's scaler.step asserts that it recorded no inf check. strata scales
        # the loss and skips overflowing steps itself (engine.backward, skip_with_strata), as DeepSpeed does.
        if getattr(self.accelerator, "scaler", None) is not None:
            self.accelerator.scaler = None
        self.engine, _, _, _ = initialize(model=self.model, config=config, device=self.args.device,
                                          model_parameters=self._decay_groups())
        if self.engine.world_size > 1 or self.args.world_size > 1:
            ranks = (self.engine.world_size, self.args.world_size)
            self.engine.close()
            raise InvalidArgument(
                "StrataTrainer: strata's world has %d rank(s) and Trainer's %d process(es); StrataTrainer trains one "
                "process for now (Trainer would shard its data over torch.distributed and wrap the model in DDP, which "
                "strata's ranks do not use); hint: one process, or strata.torch.initialize with your own sharded "
                "loader under mpirun" % ranks)

    def _decay_groups(self) -> Optional[List[Dict[str, Any]]]:
        """Trainer.create_optimizer's param groups (decayed, and not: biases and norms) when weight_decay is above 0,
        each a strata parameter group; None (one group) without weight decay, where the two would run alike."""
        if not self.args.weight_decay:
            return None
        decay = set(self.get_decay_parameter_names(self.model))
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        return [{"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
                {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]

    def create_optimizer(self, *unused: Any) -> torch.optim.Optimizer:
        """engine.optimizer: what strata reads the lr of each step from (transformers 5 passes the model)."""
        self.optimizer: torch.optim.Optimizer = self.engine.optimizer
        return self.optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: Optional[torch.optim.Optimizer] = None) -> Any:
        """The config's scheduler with its "auto" values filled for num_training_steps, else Trainer's own; either
        drives engine.optimizer and is stepped by Trainer once per optimizer step (the engine has none to step)."""
        if self._schedule is None:
            scheduler: Any = super().create_scheduler(num_training_steps, optimizer=self.engine.optimizer)
        else:
            scheduler = getattr(self, "lr_scheduler", None)
            if scheduler is None:
                filled = fill_auto({"scheduler": self._schedule}, self.args, num_training_steps=num_training_steps)
                scheduler = self.lr_scheduler = schedulers.build(filled["scheduler"], self.engine.optimizer)
        skip_with_strata(scheduler, self.engine)
        return scheduler

    def training_step(self, model: torch.nn.Module, inputs: Dict[str, Any],
                      num_items_in_batch: Any = None) -> torch.Tensor:
        """Trainer's step with the backward through strata. The gradient is Trainer's: a loss the model normalised
        by num_items_in_batch (the tokens of the whole accumulated batch) is not divided again, any other by the
        number of micro-batches accumulated (engine.backward's 1 / gradient_accumulation_steps, or the fewer
        micro-batches of an epoch's last step)."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            if num_items_in_batch is None:  # transformers 4.45 and older take no num_items_in_batch
                loss = self.compute_loss(model, inputs)
            else:
                loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        del inputs
        part: torch.Tensor
        if self._loss_is_scaled_for_ga(num_items_in_batch):
            _backward_unscaled(self.engine, loss)
            part = loss.detach()
            return part
        steps = getattr(self, "current_gradient_accumulation_steps", None) or self.args.gradient_accumulation_steps
        if steps == self.engine.gradient_accumulation_steps():
            self.engine.backward(loss)  # loss / steps, as Trainer divides it
            part = loss.detach() / steps
            return part
        loss = loss / steps
        _backward_unscaled(self.engine, loss)
        part = loss.detach()
        return part

    def _loss_is_scaled_for_ga(self, num_items_in_batch: Any) -> bool:
        """transformers 5's rule (Trainer.loss_is_scaled_for_ga): whether compute_loss's loss already is the
        accumulated batch's share; older versions never say so."""
        flag = getattr(self, "loss_is_scaled_for_ga", None)
        if flag is not None:
            return bool(flag)
        return bool((getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None) or
                    getattr(self, "compute_loss_func", None) is not None)

    # ---------------------------------------------------------------- logging

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> Any:
        """transformers 5 measures the norm of model.parameters()' .grad before the step; strata holds the gradients
        and measures it in its step, so _maybe_log_save_evaluate logs that one."""
        return grad_norm

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> Any:
        """Trainer's logging with grad_norm = the norm strata's last step measured (engine.last_step), when it
        measured one (it does when it clips)."""
        last = self.engine.last_step
        norm = float(last["grad_norm"]) if last is not None and last["grad_norm"] >= 0 else None
        return super()._maybe_log_save_evaluate(tr_loss, norm, *args, **kwargs)

    # ---------------------------------------------------------------- checkpoints

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """strata's checkpoint (weights, optimizer state, counters) and the lr scheduler's state in output_dir."""
        self.engine.save_checkpoint(output_dir, tag=_CHECKPOINT_TAG, save_latest=False)
        if self.args.should_save and self.lr_scheduler is not None:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, _SCHEDULER_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint: Optional[str]) -> None:
        if checkpoint is None:
            return
        self.engine.load_checkpoint(checkpoint, tag=_CHECKPOINT_TAG)
        path = os.path.join(checkpoint, _SCHEDULER_FILE)
        if self.lr_scheduler is not None and os.path.exists(path):
            self.lr_scheduler.load_state_dict(torch.load(path))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Optional[torch.nn.Module] = None) -> None:
        """Nothing here: the weights are part of strata's checkpoint, which _load_optimizer_and_scheduler loads."""
        if not os.path.isdir(os.path.join(resume_from_checkpoint, _CHECKPOINT_TAG)):
            raise ConfigError("StrataTrainer: %s holds no strata checkpoint (%s/); resume from a checkpoint a "
                              "StrataTrainer saved" % (resume_from_checkpoint, _CHECKPOINT_TAG))


# The engine whose skipped steps each scheduler skip_with_strata changed follows (kept outside the scheduler, whose
# __dict__ is its state_dict, which Trainer saves).
_SKIP_ENGINES: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_SKIP_CLASSES: Dict[type, type] = {}


def _step_unless_skipped(self: Any, *args: Any, **kwargs: Any) -> Any:
    last = _SKIP_ENGINES[self].last_step
    if last is not None and last.get("skipped"):
        return None
    scheduler_class: Any = type(self).__mro__[1]  # the scheduler's own class, whose step this one wraps
    return scheduler_class.step(self, *args, **kwargs)


def skip_with_strata(scheduler: Any, engine: Any) -> None:
    """Makes scheduler.step() do nothing after a step strata skipped (an fp16 overflow), as DeepSpeed's engine skips
    its scheduler then. Trainer asks accelerate whether the step was skipped, which only knows its own GradScaler's
    overflows, not strata's. The scheduler becomes an instance of a subclass of its own class whose step() asks the
    engine first. A ReduceLROnPlateau, stepped with a metric at evaluation, is left as it is."""
    if scheduler is None or scheduler in _SKIP_ENGINES or _lr_owner.is_plateau(scheduler):
        return
    cls = type(scheduler)
    if cls not in _SKIP_CLASSES:
        _SKIP_CLASSES[cls] = type(cls.__name__, (cls,), {"step": _step_unless_skipped, "__module__": cls.__module__})
    _SKIP_ENGINES[scheduler] = engine
    scheduler.__class__ = _SKIP_CLASSES[cls]


def _backward_unscaled(engine: Any, loss: torch.Tensor) -> None:
    """engine.backward(loss) without its 1 / gradient_accumulation_steps: the loss already is the accumulated
    batch's share (DeepSpeed's engine.backward(loss, scale_wrt_gas=False), which transformers passes)."""
    engine.backward(loss, scale_wrt_gas=False)


# ---------------------------------------------------------------- the config's "auto" values


def fill_auto(config: ConfigSource, args: Any, model: Optional[torch.nn.Module] = None,
              num_training_steps: Optional[int] = None) -> Dict[str, Any]:
    """A copy of config (a dict, JSON path or strata.Config in DeepSpeed's vocabulary) with its "auto" values filled
    as transformers' DeepSpeed integration fills them (HfTrainerDeepSpeedConfig.trainer_config_process and
    trainer_config_finalize, transformers 5): from TrainingArguments args, from the model's hidden size (the ZeRO
    bucket sizes) and from num_training_steps (the scheduler's total_num_steps and warmup_num_steps). model or
    num_training_steps None leaves the keys that need them as they are. Only keys present are filled. ConfigError
    names every value the config sets that disagrees with args, as transformers refuses them. For
    strata.torch.initialize with a config written for Trainer:

        engine, *_ = strata.torch.initialize(model=model, config=fill_auto("ds_config.json", training_args, model,
                                                                           num_training_steps=1000))"""
    doc = _document(config)
    problems: List[str] = []
    _fill_args(doc, args, problems, add=False)
    if model is not None:
        _fill_hidden_size(doc, model)
    if num_training_steps is not None:
        _fill_schedule(doc, args, num_training_steps, problems)
    _raise_mismatches(problems)
    return doc


def _from_args(args: Any) -> List[Tuple[str, Any, str, bool, bool]]:
    """(config path, value, TrainingArguments' name for it, must the config's own value agree, does StrataTrainer add
    it when absent) for each key transformers fills from TrainingArguments."""
    batch = args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps
    return [
        ("train_micro_batch_size_per_gpu", args.per_device_train_batch_size, "per_device_train_batch_size", True, True),
        ("gradient_accumulation_steps", args.gradient_accumulation_steps, "gradient_accumulation_steps", True, True),
        ("train_batch_size", batch, "world_size x per_device_train_batch_size x gradient_accumulation_steps", True,
         False),
        ("gradient_clipping", float(args.max_grad_norm or 0.0), "max_grad_norm", True, True),
        ("optimizer.params.lr", args.learning_rate, "learning_rate", True, True),
        ("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "[adam_beta1, adam_beta2]", True, True),
        ("optimizer.params.eps", args.adam_epsilon, "adam_epsilon", True, True),
        ("optimizer.params.weight_decay", args.weight_decay, "weight_decay", True, True),
        ("scheduler.params.warmup_min_lr", 0, "", False, False),
        ("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate", True, False),
        ("fp16.enabled", bool(args.fp16 or getattr(args, "fp16_full_eval", False)), "fp16", True, True),
        ("bf16.enabled", bool(args.bf16 or getattr(args, "bf16_full_eval", False)), "bf16", True, True),
    ]


def _fill_args(doc: Dict[str, Any], args: Any, problems: List[str], add: bool, leave: Tuple[str, ...] = ()) -> None:
    for path, value, name, must_match, addable in _from_args(args):
        if path not in leave:
            _fill_key(doc, path, value, name if must_match else None, problems, add and addable)


def _fill_key(doc: Dict[str, Any], path: str, value: Any, name: Optional[str], problems: List[str],
              add: bool = False) -> None:
    """transformers' fill_match: "auto" at path becomes value; another value must equal it (name given) or is left
    (name None). An absent key is added only with add (its sections made on the way)."""
    node: Any = doc
    keys = path.split(".")
    for key in keys[:-1]:
        if not isinstance(node, dict) or (key not in node and not add):
            return
        node = node.setdefault(key, {})
    if not isinstance(node, dict):
        return
    have = node.get(keys[-1], "auto" if add else None)
    if have == "auto":
        node[keys[-1]] = value
    elif have is not None and name is not None and not _same(have, value):
        problems.append("config: %s = %r but TrainingArguments say %s = %r" % (path, have, name, value))


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, list):
        return isinstance(have, (list, tuple)) and list(have) == want
    return bool(have == want)


def _raise_mismatches(problems: List[str]) -> None:
    if problems:
        raise ConfigError("\n".join("%s; set it in one place (or \"auto\" in the config)" % p for p in problems))


def _hidden_size(model: torch.nn.Module) -> Optional[int]:
    """The model's hidden size as transformers reads it for the bucket sizes (the largest of hidden_sizes)."""
    for config in (getattr(model, "config", None), getattr(getattr(model, "config", None), "text_config", None)):
        if config is None:
            continue
        if getattr(config, "hidden_size", None) is not None:
            return int(config.hidden_size)
        if getattr(config, "hidden_sizes", None):
            return int(max(config.hidden_sizes))
    return None


def _fill_hidden_size(doc: Dict[str, Any], model: torch.nn.Module) -> None:
    """reduce_bucket_size = hidden², and at stage 3 stage3_prefetch_bucket_size = 0.9 hidden² and
    stage3_param_persistence_threshold = 10 hidden, where they are "auto" (transformers' trainer_config_finalize)."""
    zero = doc.get("zero_optimization")
    if not isinstance(zero, dict):
        return
    keys = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    auto = [k for k in keys if zero.get(k) == "auto"]
    if not auto:
        return
    hidden = _hidden_size(model)
    if hidden is None:
        raise ConfigError("StrataTrainer: the model's config has neither hidden_size nor hidden_sizes, so the "
                          "\"auto\" of zero_optimization.%s cannot be filled (transformers fills them from it); hint: "
                          "write numbers there" % ", zero_optimization.".join(auto))
    if zero.get("reduce_bucket_size") == "auto":
        zero["reduce_bucket_size"] = hidden * hidden
    if zero.get("stage") == 3:
        if zero.get("stage3_prefetch_bucket_size") == "auto":
            zero["stage3_prefetch_bucket_size"] = int(0.9 * hidden * hidden)
        if zero.get("stage3_param_persistence_threshold") == "auto":
            zero["stage3_param_persistence_threshold"] = 10 * hidden


def _fill_schedule(doc: Dict[str, Any], args: Any, num_training_steps: int, problems: List[str]) -> None:
    """The scheduler's step counts (transformers' trainer_config_finalize; warmup at least 1, as transformers 5)."""
    _fill_key(doc, "scheduler.params.total_num_steps", num_training_steps,
              "max_steps (the steps this run trains)", problems)
    _fill_key(doc, "scheduler.params.warmup_num_steps", max(1, args.get_warmup_steps(num_training_steps)),
              "warmup_steps", problems)


def _check_schedule_args(args: Any, section: Dict[str, Any]) -> None:
    """The config's scheduler owns the lr: TrainingArguments that choose another schedule are refused, not ignored."""
    kind = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    name = section.get("type") if isinstance(section, dict) else section
    if kind != _TRAINER_SCHEDULE or getattr(args, "lr_scheduler_kwargs", None):
        raise ConfigError(
            "StrataTrainer: TrainingArguments lr_scheduler_type = %r%s would be ignored: the config's scheduler (%s) "
            "sets the learning rate, as with transformers' DeepSpeed integration; hint: leave lr_scheduler_type at "
            "its default, or remove the config's \"scheduler\" section to use Trainer's" % (
                kind, " with lr_scheduler_kwargs" if getattr(args, "lr_scheduler_kwargs", None) else "", name))
    warmup = bool(args.warmup_steps or getattr(args, "warmup_ratio", 0))
    params = section.get("params") if isinstance(section, dict) else None
    if warmup and not (isinstance(params, dict) and "warmup_num_steps" in params):
        raise ConfigError(
            "StrataTrainer: TrainingArguments warmup_steps = %r%s would be ignored: the config's scheduler (%s) has no "
            "warmup_num_steps (its default applies); hint: \"warmup_num_steps\": \"auto\" in its params takes "
            "the argument" % (args.warmup_steps, ", warmup_ratio = %r" % args.warmup_ratio
                              if getattr(args, "warmup_ratio", 0) else "", name))


def _fill(strata_config: ConfigSource, args: Any, model: Any) -> Dict[str, Any]:
    """The strata config with what TrainingArguments and the model decide, refusing what strata cannot do as
    asked."""
    if args.optim not in _ADAMW:
        raise InvalidArgument("StrataTrainer: optim = %r: strata runs AdamW (allowed: %s)" % (args.optim,
                                                                                          ", ".join(_ADAMW)))
    doc = _document(strata_config) if strata_config is not None else {}
    optimizer = doc.setdefault("optimizer", {"type": "AdamW"})
    if optimizer.get("type", "AdamW") != "AdamW":
        raise ConfigError("StrataTrainer: the config's optimizer.type = %r; Trainer's optim %r is AdamW" % (
            optimizer.get("type"), args.optim))
    optimizer["type"] = "AdamW"
    problems: List[str] = []
    # bf16 with the config's bf16 off: strata keeps fp32 parameters and Trainer's autocast computes in bf16, which
    # is Trainer's own bf16 bit for bit (transformers' DeepSpeed integration would refuse the disagreement).
    bf16 = doc.get("bf16")
    autocast = bool(args.bf16) and isinstance(bf16, dict) and bf16.get("enabled") is False
    _fill_args(doc, args, problems, add=True, leave=("bf16.enabled",) if autocast else ())
    _raise_mismatches(problems)
    if model is not None:
        _fill_hidden_size(doc, model)
    Config({k: v for k, v in doc.items() if k != "scheduler"})  # the keys strata checks, named now
    return doc

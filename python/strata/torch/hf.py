"""strata under a Hugging Face transformers Trainer: change Trainer to StrataTrainer and give it a strata config.

    from strata.torch.hf import StrataTrainer
    trainer = StrataTrainer(model=model, args=training_args, train_dataset=ds,
                            strata_config={"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme",
                                           "nvme_path": "/local/nvme"}, "offload_optimizer": {"device": "nvme",
                                           "nvme_path": "/local/nvme"}}})
    trainer.train()

Why a Trainer subclass rather than a callback: strata must own the optimizer step, the backward's loss scaling and
gradient clipping all at once, and Trainer's callbacks can observe those but not replace them. The subclass replaces
exactly the methods Trainer documents for that (create_optimizer, training_step, the checkpoint's optimizer and
model loading) and leaves the loop, logging, evaluation, data and callbacks to Trainer.

What comes from TrainingArguments, as transformers' own DeepSpeed integration fills a config's "auto" values:
learning_rate, adam_beta1/2, adam_epsilon, weight_decay, per_device_train_batch_size, gradient_accumulation_steps,
max_grad_norm (strata clips: Trainer's own clipping would see no gradients, strata holds them), fp16 / bf16. A key
the strata config sets itself must agree with the argument or be "auto". Refused, with the reason: optimizers other
than AdamW, a weight_decay above 0 (Trainer decays all but biases and norms, and strata's engine runs one set of
hyperparameters), a user-made optimizer, more than one process (Trainer's data sharding and DDP are not strata's ranks).
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Optional, Tuple

import torch
import transformers

from ..config import Config, ConfigSource
from ..errors import ConfigError, InvalidArgument
from ._initialize import _document, initialize

_ADAMW = ("adamw_torch", "adamw_hf", "adamw_torch_fused")
_SCHEDULER_FILE = "scheduler.pt"
_CHECKPOINT_TAG = "strata"


class StrataTrainer(transformers.Trainer):  # type: ignore[misc]  # transformers may be untyped: a class of Any
    """transformers.Trainer with the model's parameters, gradients and optimizer state in strata (ZeRO-3 with
    offload). strata_config: a dict, JSON path or strata.Config in the DeepSpeed vocabulary; TrainingArguments fill
    the optimizer, batch and precision keys (see the top). trainer.engine is the strata.torch engine."""

    def __init__(self, model: Any = None, args: Any = None, *rest: Any, strata_config: ConfigSource = None,
                 optimizers: Tuple[Any, Any] = (None, None), **kwargs: Any) -> None:
        if optimizers[0] is not None:
            raise InvalidArgument("StrataTrainer: optimizers=(%s, ...) is not taken: strata runs its own AdamW on its "
                                  "tiers from the TrainingArguments' hyperparameters" %
                                  type(optimizers[0]).__name__)
        if args is None:
            raise InvalidArgument("StrataTrainer: pass args= (TrainingArguments): its learning rate, batch sizes and "
                                  "precision configure strata")
        config = _fill(strata_config, args)
        # Trainer clips what it finds in .grad, which strata has taken by then: strata clips instead (config above).
        args = copy.copy(args)
        args.max_grad_norm = 0.0
        super().__init__(model, args, *rest, optimizers=optimizers, **kwargs)
        self.engine, _, _, _ = initialize(model=self.model, config=config, device=self.args.device)
        if self.engine.world_size > 1 or self.args.world_size > 1:
            ranks = (self.engine.world_size, self.args.world_size)
            self.engine.close()
            raise InvalidArgument(
                "StrataTrainer: strata's world has %d rank(s) and Trainer's %d process(es); StrataTrainer trains one "
                "process for now (Trainer would shard its data over torch.distributed and wrap the model in DDP, which "
                "strata's ranks do not use); hint: one process, or strata.torch.initialize with your own sharded "
                "loader under mpirun" % ranks)

    def create_optimizer(self) -> torch.optim.Optimizer:
        self.optimizer: torch.optim.Optimizer = self.engine.optimizer
        return self.optimizer

    def training_step(self, model: torch.nn.Module, inputs: Dict[str, Any]) -> torch.Tensor:
        """Trainer's step, with the backward through engine.backward (which scales by 1 / accumulation steps)."""
        model.train()
        inputs = self._prepare_inputs(inputs)
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        self.engine.backward(loss)
        part: torch.Tensor = loss.detach() / self.args.gradient_accumulation_steps
        return part

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


def _fill(strata_config: ConfigSource, args: Any) -> Dict[str, Any]:
    """The strata config with what TrainingArguments decide, refusing what strata cannot do as asked."""
    if args.optim not in _ADAMW:
        raise InvalidArgument("StrataTrainer: optim = %r: strata runs AdamW (allowed: %s)" % (args.optim,
                                                                                          ", ".join(_ADAMW)))
    if args.weight_decay:
        raise InvalidArgument(
            "StrataTrainer: weight_decay = %g: Trainer decays every parameter but biases and norms, and strata's "
            "engine runs one set of hyperparameters for all; hint: weight_decay=0, or strata.torch.initialize with "
            "the decay in the config's optimizer section applied to every parameter" % args.weight_decay)
    doc = _document(strata_config) if strata_config is not None else {}
    wanted = {
        "train_micro_batch_size_per_gpu": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "gradient_clipping": float(args.max_grad_norm or 0.0),
    }
    for key, value in wanted.items():
        _agree(doc, [key], value)
    params = {"lr": args.learning_rate, "betas": [args.adam_beta1, args.adam_beta2], "eps": args.adam_epsilon,
              "weight_decay": 0.0}
    optimizer = doc.setdefault("optimizer", {"type": "AdamW"})
    if optimizer.get("type", "AdamW") != "AdamW":
        raise ConfigError("StrataTrainer: the config's optimizer.type = %r; Trainer's optim %r is AdamW" % (
            optimizer.get("type"), args.optim))
    optimizer["type"] = "AdamW"
    for key, value in params.items():
        _agree(doc, ["optimizer", "params", key], value)
    for flag in ("fp16", "bf16"):
        _agree(doc, [flag, "enabled"], bool(getattr(args, flag)))
    Config(doc)  # the keys strata checks, named now rather than in initialize
    return doc


def _agree(doc: Dict[str, Any], path: List[str], value: Any) -> None:
    """Sets doc[path] to value when absent or "auto"; refuses a value that differs."""
    node = doc
    for key in path[:-1]:
        node = node.setdefault(key, {})
    have = node.get(path[-1], "auto")
    if have == "auto":
        node[path[-1]] = value
        return
    same = list(have) == list(value) if isinstance(value, list) else have == value
    if not same:
        raise ConfigError("StrataTrainer: config %s = %r but TrainingArguments say %r; set it in one place (or "
                          "\"auto\" in the config)" % (".".join(path), have, value))

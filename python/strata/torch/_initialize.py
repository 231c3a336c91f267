"""strata.torch.initialize: deepspeed.initialize's signature and return value, each argument honoured or refused
with its reason."""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, Union

import torch
import torch.nn as nn

from ..config import ConfigSource, read_document
from ..engine import Comm, check_launcher, world
from ..errors import ConfigError, InvalidArgument
from . import _lr_owner, _torch_groups
from ._adam_config import CONFIG_LR_RANGE
from .engine import StrataEngine

_DEEPSPEED_DEFAULT_PORT = 29500


def initialize(args: Any = None, model: Optional[nn.Module] = None, optimizer: Any = None,
               model_parameters: Optional[Iterable[Any]] = None, training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int = _DEEPSPEED_DEFAULT_PORT, mpu: Any = None,
               dist_init_required: Optional[bool] = None, collate_fn: Optional[Callable[..., Any]] = None,
               config: ConfigSource = None, mesh_param: Any = None, config_params: ConfigSource = None,
               comm: Optional[Comm] = None, device: Union[None, str, torch.device] = None
               ) -> Tuple[StrataEngine, torch.optim.Optimizer, Any, Any]:
    """Moves model's parameters and their optimizer state into strata; returns DeepSpeed's 4-tuple
    (engine, optimizer, training_dataloader, lr_scheduler):

        engine, optimizer, _, scheduler = strata.torch.initialize(model=model, config="ds_config.json")

    config / config_params: a dict, a JSON path or a strata.Config in the DeepSpeed vocabulary; else
        args.deepspeed_config (DeepSpeed's command-line argument), as DeepSpeed reads it.
    args: DeepSpeed's argparse namespace: deepspeed_config is read; local_rank, when set, must agree with the
        launcher's (strata takes ranks from MPI).
    optimizer: a torch.optim.AdamW or Adam (or a callable making one from the parameters), with any number of param
        groups: each becomes one of strata's parameter groups with its own lr, weight_decay, betas and eps
        (engine.optimizer.param_groups[i] is torch's group i), and its update (AdamW or Adam with L2) and first
        group the config's "optimizer" section; strata runs that update itself, on its CPU Adam, bit for bit as
        torch does. Refused, naming the group and the key: amsgrad, maximize, capturable or differentiable on, groups
        that differ in decoupled_weight_decay, a key torch's Adam does not have, a value out of range, a parameter
        in two groups. Any other optimizer is refused.
    model_parameters: what to train (default: every parameter that requires grad, or the optimizer's); as in
        DeepSpeed, a list of param group dicts makes strata's parameter groups, each key (lr, betas, eps,
        weight_decay) overriding the config's optimizer.params for its group, and of what is listed only the
        parameters that require grad train (DeepSpeed's ZeRO optimizers drop the others from their groups). Every
        other parameter of the model (requires_grad=False: a LoRA model's base) is strata's too, frozen: partitioned,
        on the parameters' tier, fetched around its use, in state_dict() and checkpoints, with no gradient and no
        optimizer state. Which parameters train is fixed here: a requires_grad changed later is refused at the next
        forward or step, naming the parameter.
    training_data: a torch Dataset; the returned loader gives train_micro_batch_size_per_gpu samples a batch through
        a DistributedSampler over the ranks (as DeepSpeed's), with collate_fn and dataloader_drop_last.
    lr_scheduler: a torch lr scheduler or a callable making one from engine.optimizer; else the config's
        "scheduler" section, if any. A scheduler built on optimizer= is moved onto engine.optimizer and drives
        strata's lr exactly (SequentialLR's and ChainedScheduler's nested ones too); one that cannot be moved exactly
        (another optimizer, cycle_momentum=True) is refused, naming the callable as the fix.
        A ReduceLROnPlateau is stepped by the caller with its metric, as in torch.
    distributed_port, dist_init_required: strata's ranks talk through MPI and never set up torch.distributed, so
        these have nothing to do; a non-default port is refused (it would be ignored). mpu and mesh_param (model,
        sequence and pipeline parallelism) are refused: strata is data-parallel only.
    comm (strata): a strata.Comm (default: the launcher's world under mpirun, else a world of 1). Under torchrun,
        accelerate launch or the deepspeed launcher (WORLD_SIZE > 1 in the environment, not strata's world size)
        initialize refuses at once, naming mpirun -np N: strata does not form its world from torch.distributed.
    device (strata): where to compute ("cpu", "cuda", "cuda:1"; default: the config's strata.backend, else the
        model's GPU, else any GPU torch sees, else the CPU), so a model built on the CPU trains on a GPU it does not
        fit."""
    if isinstance(args, nn.Module):
        raise InvalidArgument("strata.torch.initialize: the first argument is DeepSpeed's args (an argparse "
                              "namespace), not the model; hint: initialize(model=model, config=...)")
    if mpu is not None:
        raise InvalidArgument("strata.torch.initialize: mpu (model parallelism) is not supported: strata is "
                              "data-parallel only (ZeRO stages 1-3); hint: drop mpu=")
    if mesh_param is not None:
        raise InvalidArgument("strata.torch.initialize: mesh_param (sequence / tensor parallel meshes) is not "
                              "supported: strata is data-parallel only; hint: drop mesh_param=")
    if distributed_port != _DEEPSPEED_DEFAULT_PORT:
        raise InvalidArgument("strata.torch.initialize: distributed_port = %r would be ignored: strata's ranks talk "
                              "through MPI (mpirun), not torch.distributed's TCP store; hint: drop distributed_port="
                              % (distributed_port,))
    if dist_init_required not in (None, True, False):
        raise InvalidArgument("strata.torch.initialize: dist_init_required = %r must be None, True or False" %
                              (dist_init_required,))
    if collate_fn is not None and training_data is None:
        raise InvalidArgument("strata.torch.initialize: collate_fn without training_data has nothing to collate; "
                              "hint: pass training_data= too, or drop collate_fn=")
    if model is None or not isinstance(model, nn.Module):
        raise InvalidArgument("strata.torch.initialize: model must be a torch.nn.Module, got %s" %
                              type(model).__name__)
    config = _config_from(args, config, config_params)
    comm = comm if comm is not None else world()
    check_launcher(comm)
    _check_local_rank(args, comm)
    if model_parameters is not None:
        model_parameters = _torch_groups.listed(model_parameters)  # read more than once
    groups: Optional[List[_torch_groups.ParamGroup]] = None
    if optimizer is not None:
        optimizer, config, model_parameters, groups = _adopt_optimizer(optimizer, config, model_parameters, model)
    elif model_parameters is not None:
        groups = _torch_groups.from_dicts(model_parameters, _names(model))
    lr_scheduler = _lr_owner.adopt(lr_scheduler, optimizer)
    engine = StrataEngine(model, config, lr_scheduler=lr_scheduler, comm=comm,
                         trainable=_trainable(model, model_parameters), device=device, groups=groups)
    engine.training_dataloader = None
    if training_data is not None:
        engine.training_dataloader = _loader(engine, training_data, collate_fn)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _config_from(args: Any, config: ConfigSource, config_params: ConfigSource) -> ConfigSource:
    if config is not None and config_params is not None:
        raise InvalidArgument("strata.torch.initialize: give config or config_params, not both")
    config = config if config is not None else config_params
    from_args = getattr(args, "deepspeed_config", None) if args is not None else None
    if from_args is not None and config is not None:
        raise InvalidArgument("strata.torch.initialize: a config came both in args.deepspeed_config (%r) and as "
                              "config=; give one (as DeepSpeed asks)" % (from_args,))
    if config is None:
        config = from_args
    if config is None:
        raise ConfigError("strata.torch.initialize: no config: pass config= (a dict or a JSON path), config_params=, "
                          "or args with deepspeed_config")
    return config


def _check_local_rank(args: Any, comm: Comm) -> None:
    local_rank = getattr(args, "local_rank", None) if args is not None else None
    if local_rank is None or local_rank < 0:
        return
    if local_rank != comm.local_rank:
        raise InvalidArgument("strata.torch.initialize: args.local_rank = %d but the launcher made this process local "
                              "rank %d; strata takes ranks from MPI: hint: launch with mpirun and drop --local_rank"
                              % (local_rank, comm.local_rank))


def _adopt_optimizer(optimizer: Any, config: ConfigSource, model_parameters: Optional[List[Any]], model: nn.Module
                     ) -> Tuple[torch.optim.Optimizer, Dict[str, Any], List[Any], List[_torch_groups.ParamGroup]]:
    """(the torch optimizer, config, model_parameters, its param groups) with a torch Adam/AdamW's update and first
    group turned into the config's optimizer section (the optimizer itself is not used again: a scheduler built on it
    is moved onto engine.optimizer, and each of its groups becomes one of strata's)."""
    if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        params = model_parameters if model_parameters is not None else [p for p in model.parameters()
                                                                          if p.requires_grad]
        optimizer = optimizer(params)
    kind = type(optimizer)
    if kind not in (torch.optim.AdamW, torch.optim.Adam):
        raise InvalidArgument(
            "strata.torch.initialize: optimizer=%s is not taken: strata runs its own Adam/AdamW on the CPU; pass a "
            "torch.optim.AdamW or Adam (its hyperparameters are used), or give them in the config's \"optimizer\" "
            "section (or keep your parameters and use strata.torch.OffloadAdam)" % kind.__name__)
    groups, adamw = _torch_groups.from_optimizer(optimizer, _names(model))
    held = _torch_groups.members(groups)
    if model_parameters is not None and {id(p) for p in _flat(model_parameters)} != {id(p) for p in held}:
        raise InvalidArgument("strata.torch.initialize: model_parameters and the optimizer's param groups hold "
                              "different parameters; hint: pass the optimizer alone (its param groups say what to "
                              "train)")
    doc = _document(config)
    if "optimizer" in doc:
        raise InvalidArgument("strata.torch.initialize: an optimizer came both as optimizer= and in the config's "
                              "\"optimizer\" section; give one (as DeepSpeed asks)")
    first = groups[0].hparams
    section: Dict[str, Any] = {"betas": list(first["betas"]), "eps": first["eps"],
                               "weight_decay": first["weight_decay"]}
    if CONFIG_LR_RANGE[0] <= first["lr"] <= CONFIG_LR_RANGE[1]:
        section["lr"] = first["lr"]  # documents group 0 (the engine sets it exactly, lr 0 included)
    if not adamw:
        section["adam_w_mode"] = False  # torch's Adam adds weight decay to the gradient (L2)
    doc["optimizer"] = {"type": "AdamW" if adamw else "Adam", "params": section}
    return optimizer, doc, held, groups


def _names(model: nn.Module) -> Dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()}


def _flat(model_parameters: List[Any]) -> List[Any]:
    """The tensors of model_parameters (tensors, or param group dicts)."""
    out: List[Any] = []
    for item in model_parameters:
        if isinstance(item, dict):
            params = item.get("params", [])
            out.extend([params] if isinstance(params, torch.Tensor) else params)
        else:
            out.append(item)
    return out


def _document(config: ConfigSource) -> Dict[str, Any]:
    """The config's JSON object, a copy the caller may change (values are filled in before strata checks it)."""
    return copy.deepcopy(read_document(config)[1])


def _loader(engine: StrataEngine, dataset: Any, collate_fn: Optional[Callable[..., Any]]) -> Any:
    _, micro, _ = engine.config.batch_sizes(engine.world_size)
    if micro is None:
        engine.close()
        raise ConfigError("strata.torch.initialize: training_data needs a batch size: set "
                          "train_micro_batch_size_per_gpu (or train_batch_size) in the config")
    sampler: torch.utils.data.DistributedSampler[Any] = torch.utils.data.DistributedSampler(dataset, num_replicas=engine.world_size, rank=engine.rank)
    return torch.utils.data.DataLoader(dataset, batch_size=micro, sampler=sampler, collate_fn=collate_fn,
                                       drop_last=engine.config.trainer.get("dataloader_drop_last", False))


def _trainable(model: nn.Module, model_parameters: Optional[List[Any]]) -> Optional[Set[int]]:
    """The ids of model_parameters' tensors (tensors, or the params of param group dicts), of which strata trains
    those that require grad; None without model_parameters."""
    if model_parameters is None:
        return None
    ids = {id(p) for p in _flat(model_parameters)}
    names = _names(model)
    stray = [i for i in ids if i not in names]
    if stray:
        raise InvalidArgument("strata.torch.initialize: model_parameters holds %d tensor(s) that are not parameters of "
                              "the model" % len(stray))
    untrained = [n for n, p in model.named_parameters() if id(p) not in ids and p.requires_grad]
    if untrained:
        raise InvalidArgument("strata.torch.initialize: %s require(s) grad but is not in model_parameters; hint: "
                              "p.requires_grad_(False) for what stays frozen" % ", ".join(untrained[:5]))
    return ids

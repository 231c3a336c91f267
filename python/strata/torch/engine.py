"""StrataEngine: a PyTorch model trained ZeRO-3 style, its parameters and optimizer state held by strata.

Every unit of the model becomes a strata module: each element of an nn.ModuleList / nn.Sequential (a transformer
block, say) with everything under it, and every other module with parameters of its own (an embedding, a final
LayerNorm); units that share a parameter (GPT's tied embedding and head) are one module. After initialize the
model's parameter tensors hold no storage. Around each use strata lends them its memory without a copy.

Frozen parameters (requires_grad=False at initialize: a LoRA model's base weights) are strata's too: each unit puts
them in a frozen strata module of its own (strata_module_freeze), partitioned, tiered, fetched with the unit and
checkpointed like the rest, with no gradient and no optimizer state. Which parameters train is fixed at initialize:
a forward with grad enabled, or a step, that finds a parameter's requires_grad changed raises, naming it.

The protocol belongs to the modules, not to the engine's call: the forward of every unit's top module and of every
module that owns one of its parameters is replaced (on the instance) by one that runs the protocol, so engine(x),
engine.module(x), a parent calling a child's .forward and a checkpoint's recompute inside backward all go through it:

  forward   fetch, point the parameters at strata's memory  ->  the module's own forward  ->  release
  backward  the unit's outputs pass through _BackwardFetch, whose backward runs before the unit's own: fetch
            again and point each parameter's .grad at strata's gradient buffer, so autograd accumulates into it
            in place; when the last of the unit's gradients is accumulated (a hook on its AccumulateGrad node),
            grads_ready hands them to strata and the unit is released. A unit with frozen parameters needs them
            until backward has also passed the gradient of each of its inputs out of it (a frozen layer computes
            only its input's gradient): its inputs that require grad pass through _BackwardRelease in forward, and
            it is released when the last of those and of its trained gradients is through. A callback at the end of
            backward finishes units some of whose parameters got no gradient.

Autograd saves tensors for backward, and some are views of a parameter (nn.Linear saves weight.t()). Those views
would point into memory strata reuses after the release, so while a module runs, saved-tensor hooks keep them as
recipes rebuilt from the parameter's memory of the moment (_activations.ParamView); every other tensor goes to the
hooks that were active before (a user's torch.utils.checkpoint), see _saved_hooks. No tensor may keep strata's
memory past its release: an output that is a view of a parameter is copied, and a release that finds the memory
still referenced (a view kept elsewhere) raises instead of letting it be read after strata reuses it.
"""
from __future__ import annotations

import functools
import gc
import json
import warnings
from types import TracebackType
from typing import Any, Callable, ContextManager, Dict, List, Optional, Sequence, Set, Tuple, Type, Union, cast

import torch
import torch.nn as nn

from .._typing import StrPath
from ..config import Config, ConfigSource
from ..engine import Comm, Engine, check_launcher, world
from ..errors import ConfigError, InvalidArgument, StateError
from . import _checkpoint, _lr_owner, _param_groups, _saved_hooks, _state_dict, _tensors, _torch_formula, _zero_init
from ._activations import KeptActivation, ParamView
from ._precision import cast_rest, fp32_loss
from ._sources import WeightSource, detach_source, put_back, source_of, stand_ins
from ._torch_groups import ParamGroup
from ._units import InputToken, Unit, common_prefix, find_units, short_name, tensors_in

class _BackwardFetch(torch.autograd.Function):
    """Identity in forward; its backward runs before the unit's backward and fetches the unit."""

    @staticmethod
    def forward(ctx: Any, engine: StrataEngine, unit: Unit, tensor: torch.Tensor) -> torch.Tensor:
        ctx.engine, ctx.unit = engine, unit
        return tensor.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[None, None, torch.Tensor]:
        ctx.engine._enter_backward(ctx.unit)
        return None, None, grad


class _BackwardRelease(torch.autograd.Function):
    """Identity in forward on an input of a unit with frozen parameters; its backward runs once the unit's backward
    has passed the gradient of that input out of the unit (see Unit.armed)."""

    @staticmethod
    def forward(ctx: Any, engine: StrataEngine, unit: Unit, token: InputToken, tensor: torch.Tensor) -> torch.Tensor:
        ctx.engine, ctx.unit, ctx.token = engine, unit, token
        return tensor.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[None, None, None, torch.Tensor]:
        ctx.engine._input_passed(ctx.unit, ctx.token)
        return None, None, None, grad


class _LrHolder(torch.optim.Optimizer):
    """engine.optimizer: what torch's lr schedulers drive. One param group per strata parameter group, showing its
    hyperparameters; strata reads each group's 'lr' and 'weight_decay' at every step, and every other write is
    honoured or refused at the write (_param_groups)."""

    def __init__(self, engine: StrataEngine, groups: List[List[nn.Parameter]]) -> None:
        values = [engine.engine.group(i) for i in range(len(groups))]
        super().__init__([{"params": params, "lr": v["lr"], "weight_decay": v["weight_decay"]}
                          for params, v in zip(groups, values)], {"lr": values[0]["lr"]})
        self._engine = engine
        self.param_groups = _param_groups.guard(self.param_groups, values)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if not hasattr(self, "_engine"):  # torch's __init__ adds the groups
            super().add_param_group(param_group)
            return
        _param_groups.refuse_add_param_group(param_group)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Each saved group's keys, written as param_groups[i][key] = value would be (strata keeps no state)."""
        _param_groups.load(self.param_groups, state_dict)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """A strata step now, whatever the accumulation count (engine.step() calls it at the boundary)."""
        loss = closure() if closure is not None else None
        self._engine._optimizer_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: strata zeroes its gradients at every step."""


class StrataEngine:
    """What strata.torch.initialize returns; shaped like DeepSpeed's engine.

    With strata.offload_activations in the config, the tensors autograd saves in forward (those of at least
    activation_min_bytes, in a floating dtype, not views of parameters) are kept off the device by strata until
    backward needs them: copied to pinned host memory or NVMe on strata's streams and restored ahead of backward.
    A user's own saved-tensor hooks (torch.utils.checkpoint) take precedence: what they handle is not offloaded.

    groups (initialize's, from a torch optimizer's param groups or model_parameters dicts: _torch_groups): each
    becomes one of strata's parameter groups, and one of engine.optimizer's param groups; without them there is one,
    with the config's "optimizer" section."""

    activation_min_bytes = 64 << 10

    def __init__(self, model: nn.Module, config: ConfigSource, lr_scheduler: Any = None, comm: Optional[Comm] = None,
                 trainable: Optional[Set[int]] = None, device: Union[None, str, torch.device] = None,
                 groups: Optional[Sequence[ParamGroup]] = None) -> None:
        if not isinstance(model, nn.Module):
            raise InvalidArgument("strata.torch.initialize: model must be a torch.nn.Module, got %s" %
                                  type(model).__name__)
        if getattr(model, "_strata_engine", None) is not None:
            raise StateError("strata.torch.initialize: this model is already trained by a strata engine; close() "
                             "that engine first, or build a new model")
        _lr_owner.check_engine_argument(lr_scheduler)
        self.module = model
        self.comm = comm if comm is not None else world()
        check_launcher(self.comm)
        self.rank, self.world_size = self.comm.rank, self.comm.size
        _check_values(model)
        swaps = stand_ins(model)  # load_pretrained's meta parameters, until their storage is emptied below
        try:
            devices = {p.device for p in model.parameters()}  # a stand-in's is the CPU, where its source is read
            if len(devices) != 1:
                raise InvalidArgument("strata.torch.initialize: the model's parameters are on %s; put them on one "
                                      "device (model.to(...)) first" % sorted(str(d) for d in devices))
            self.config, self.device = self._config_for_device(config, devices.pop(), device)
            _, _, self._gas = self.config.batch_sizes(self.world_size)
            self._step_in_backward = bool(self.config.get("strata.step_in_backward", False))
            _check_step_in_backward(self.config, self._step_in_backward, self._gas)
            self._step_begun = False  # with step_in_backward: strata_step_begin ran for the step under way
            self._begun_values: Tuple[Optional[float], List[Dict[str, float]]] = (None, [])  # the values it began with
            self.steps_per_print = self.config.trainer.get("steps_per_print")
            self.dtype = _tensors.DTYPES[self.config.param_dtype]
            _check_model_dtype(model, self.dtype)
            self.units = find_units(model, trainable)
            if not any(t for u in self.units for t in u.trained):
                raise InvalidArgument("strata.torch.initialize: the model has no trainable parameters")
            self.engine = Engine(self.config, comm=self.comm)
            self._register()
            self._names = {id(p): q for u in self.units for q, p in u.params}
            self._pids = {id(p): pid for u in self.units for (_, p), pid in zip(u.params, u.pids)}
            self._trained = {id(p) for u in self.units for _, p in u.trained_params()}
            group_params = self._assign_groups(groups)
            # The batch the ranks train with is the trainer's, not in strata's config: every rank must share it.
            micro = self.config.batch_sizes(self.world_size)[1]
            self.engine.agree_on("gradient_accumulation_steps", self._gas)
            if micro is not None:
                self.engine.agree_on("train_micro_batch_size_per_gpu", micro)
            self.engine.finalize()
            self._stream: Optional[torch.cuda.Stream] = None
            if self.device.type == "cuda":
                self._stream = torch.cuda.ExternalStream(self.engine.compute_stream(), device=self.device)
                torch.cuda.set_stream(self._stream)
            # sorted (start address, end address, parameter) of the lent parameters
            self._live: List[Tuple[int, int, nn.Parameter]] = []
            self._offload_acts = self.config.get("strata.offload_activations.device", "none") != "none"
            self._act_source: Optional[torch.Tensor] = None  # the last activation pushed, which strata may still read
            self._grad_nodes: List[Any] = []  # AccumulateGrad nodes, kept alive so the hooks stay theirs
            self._grad_hooks: List[Any] = []  # the handles of the hooks on them and on the trained parameters
            self.loads = 0              # checkpoints loaded: the weights state_dict() gave before are stale
            self._empty_parameters()
        except BaseException:
            put_back(swaps)  # the model as it came: no NaN stand-in left to compute with
            raise
        self._move_buffers()
        cast_rest(model, self.dtype)  # in bf16 / fp16 the model computes as model.to(dtype)
        # (module, its own forward attribute or None) to put back at close()
        self._wrapped: List[Tuple[nn.Module, Optional[Callable[..., Any]]]] = []
        self._state_dict_handles: List[Any] = []  # _state_dict's hooks on the model, removed at close()
        self._install_hooks()
        self.micro_steps = 0
        self.global_steps = 0
        self.last_step: Optional[Dict[str, Any]] = None
        self.training_dataloader: Any = None  # initialize's, from training_data
        self._callback_queued = False
        self._backward_active = False   # between the first unit's backward and the end of that backward
        self._backward_scaled = False   # the backward running is engine.backward's (the loss is scaled)
        self._warned_no_grad = False
        self._grad_seen: Set[int] = set()  # ids of the parameters a gradient reached since the last step
        self._forward_depth = 0
        self.optimizer = _LrHolder(self, group_params)
        self.lr_scheduler: Any = None
        try:  # a callable (initialize's rebinding of a scheduler built on optimizer= too) or the config's section
            if lr_scheduler is not None:
                self.lr_scheduler = lr_scheduler(self.optimizer)
            elif "scheduler" in self.config.trainer:
                from . import schedulers
                self.lr_scheduler = schedulers.build(self.config.trainer["scheduler"], self.optimizer)
        except BaseException:
            self.close()  # frees strata's engine; the model keeps its empty parameters, as after close()
            raise
        setattr(model, "_strata_engine", self)

    # ---------------------------------------------------------------- setup

    @staticmethod
    def _config_for_device(config: ConfigSource, model_device: torch.device,
                           device: Union[None, str, torch.device]) -> Tuple[Config, torch.device]:
        """(config, compute device): the device is `device`, else the config's strata.backend, else the model's
        GPU, else a GPU when torch sees one, else the CPU; the config's backend is made to agree. A model built on
        the CPU can so train on a GPU it does not fit."""
        cfg = config if isinstance(config, Config) else Config(config)
        doc = json.loads(json.dumps(cfg.document))
        section = doc.setdefault("strata", {})
        _torch_formula.follow_torch(section)
        asked = section.get("backend", "auto")
        if device is not None:
            where = torch.device(device)
        elif asked == "cuda":
            where = torch.device("cuda")
        elif asked == "host":
            where = torch.device("cpu")
        elif model_device.type == "cpu" and torch.cuda.is_available():
            where = torch.device("cuda")  # as DeepSpeed: a model built on the CPU computes on the GPU
        else:
            where = model_device
        want = "cuda" if where.type == "cuda" else "host" if where.type == "cpu" else None
        if want is None or asked not in ("auto", want):
            raise ConfigError("config: strata.backend = %r cannot compute on %s; strata computes on \"cpu\" (host) "
                              "or \"cuda\"; hint: remove strata.backend or pass device=" % (asked, where))
        section["backend"] = want
        if where.type == "cuda":
            if where.index is None:
                where = torch.device("cuda", torch.cuda.current_device())
            section.setdefault("device_id", where.index)
        out = Config(doc)
        out.origin = cfg.origin
        return out, where

    def _register(self) -> None:
        """Adds each unit's strata modules: its trained parameters' (_name_groups), then its frozen parameters' in
        frozen modules, named alike (_frozen_name), so that a tensor's name in a checkpoint is the model's own."""
        e = self.engine
        plans = [(unit, _name_groups(unit.name, unit.trained_params()), _name_groups(unit.name, unit.frozen_params()))
                 for unit in self.units]
        taken = {name for _, trained, _ in plans for name, _ in trained}
        for unit, trained, frozen in plans:
            index = {id(p): i for i, (_, p) in enumerate(unit.params)}
            unit.pids = [-1] * len(unit.params)  # each set below, in the order of the modules
            modules = [(name, name, params, False) for name, params in trained]
            for prefix, params in frozen:
                name, relative_to = _frozen_name(prefix, taken)
                taken.add(name)
                modules.append((name, relative_to, params, True))
            for name, prefix, params, freeze in modules:
                mid = e.add_module(short_name(name))
                unit.mids.append(mid)
                if freeze:
                    e.freeze_module(mid)
                else:
                    unit.trained_mids.append(mid)
                for qname, p in params:
                    init = _initial_values(p)
                    pname = qname[len(prefix) + 1:] if qname.startswith(prefix + ".") else qname
                    pid = e.add_param(mid, short_name(pname), p.numel(), init)
                    if p.dim():  # checkpoints record the shape; `strata ckpt export` writes the tensor in it
                        e.set_param_shape(pid, p.shape)
                    unit.pids[index[id(p)]] = pid

    def _assign_groups(self, groups: Optional[Sequence[ParamGroup]]) -> List[List[nn.Parameter]]:
        """Makes strata's parameter groups of the param groups initialize was given (torch's group i is strata's
        group i; group 0 takes its values exactly, over the config's) and puts each trained parameter in its group
        (a frozen one has no optimizer state, so no group, as DeepSpeed's ZeRO optimizers drop the parameters that do
        not require grad from their param groups). Returns each group's trained parameters; without groups, one group
        of every trained parameter with the config's values."""
        if not groups:
            return [[p for u in self.units for _, p in u.trained_params()]]
        default = self.engine.group(0)
        out = []
        for index, group in enumerate(groups):
            if index == 0:
                self.engine.set_group(0, group.values(default))
            else:
                gid = self.engine.add_group("param_groups[%d]" % index, group.values(default))
                for p in group.params:
                    if id(p) in self._trained:
                        self.engine.set_param_group(self._pids[id(p)], gid)
            out.append([p for p in group.params if id(p) in self._trained])
        return out

    def _empty_parameters(self) -> None:
        """Frees the model's own parameter storage and hooks each trained parameter's AccumulateGrad node."""
        for unit in self.units:
            for i, ((_, p), trained) in enumerate(zip(unit.params, unit.trained)):
                if trained:
                    # The node takes its shape, dtype and device from the parameter when it is made: make it while
                    # the parameter looks as it will when strata lends it memory.
                    p.data = torch.empty(1, dtype=self.dtype, device=self.device).expand(p.shape)  # no storage
                    p.grad = None
                    with torch.enable_grad():
                        node = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._grad_hooks.append(node.register_hook(
                        lambda grad_in, grad_out, u=unit, i=i: self._grad_accumulated(u, i)))
                    self._grad_nodes.append(node)
                    self._grad_hooks.append(p.register_hook(lambda grad, u=unit, p=p: self._grad_arriving(u, p)))
                setattr(p, "_strata_shape", tuple(p.shape))
                setattr(p, "_strata_numel", p.numel())
                p.data = _tensors.empty(self.dtype, self.device)
                detach_source(p)  # (a zero_init tensor's staging file goes with its last reference)

    def _move_buffers(self) -> None:
        """The model's buffers (masks, running statistics) go where it computes; its parameters are strata's."""
        for mod in self.module.modules():
            for key, buf in mod._buffers.items():
                if buf is not None and buf.device != self.device:
                    mod._buffers[key] = buf.to(self.device)

    def _install_hooks(self) -> None:
        """Runs the protocol in the forward of each unit's top modules and of every module owning a parameter of a
        unit (so a child called on its own, `.forward` called directly, fetches what it needs); the state_dict of
        those modules gives the real weights."""
        owner = {id(p): u for u in self.units for _, p in u.params}
        targets: Dict[int, Tuple[nn.Module, Unit]] = {}
        for unit in self.units:
            for mod in unit.modules:
                targets.setdefault(id(mod), (mod, unit))
        for mod in self.module.modules():
            units = {id(owner[id(p)]): owner[id(p)] for p in mod._parameters.values()
                     if p is not None and id(p) in owner}
            if len(units) > 1:
                raise InvalidArgument("strata.torch.initialize: module %s owns parameters of several strata "
                                      "modules (%s)" % (type(mod).__name__, ", ".join(u.name for u in units.values())))
            if units:
                targets.setdefault(id(mod), (mod, next(iter(units.values()))))
        for mod, unit in targets.values():
            self._wrap_forward(mod, unit)
        _state_dict.install(self, [mod for mod, _ in targets.values()])

    def _wrap_forward(self, mod: nn.Module, unit: Unit) -> None:
        own = mod.__dict__.get("forward")
        inner = mod.forward

        @functools.wraps(inner)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self._run(unit, inner, args, kwargs)
        mod.forward = forward
        self._wrapped.append((mod, own))

    def _remove_hooks(self) -> None:
        for mod, own in self._wrapped:
            if own is None:
                mod.__dict__.pop("forward", None)
            else:
                mod.forward = own
        self._wrapped = []

    # ---------------------------------------------------------------- lending memory

    def _lend(self, unit: Unit) -> None:
        e = self.engine
        unit.lent = []
        for (qname, p), pid in zip(unit.params, unit.pids):
            flat, alive = _tensors.wrap_watched(e.param_data(pid), _numel(p), self.dtype, self.device)
            t = flat.view(_shape(p))
            p.data = t
            start = t.data_ptr()
            self._live.append((start, start + t.numel() * t.element_size(), p))
            unit.lent.append((qname, alive))
        self._live.sort(key=lambda entry: entry[0])

    def _take_back(self, unit: Unit) -> None:
        ids = {id(p) for _, p in unit.params}
        self._live = [entry for entry in self._live if id(entry[2]) not in ids]
        for _, p in unit.params:
            p.data = _tensors.empty(self.dtype, self.device)
        kept = [q for q, alive in unit.lent if alive() is not None]
        if kept:
            gc.collect()  # a tensor in a reference cycle that is garbage already
            kept = [q for q, alive in unit.lent if alive() is not None]
        if kept:
            self._lend(unit)  # the memory stays strata's and valid: nothing reads it after a reuse
            raise StateError("strata: a tensor still refers to the memory of %s as strata takes it back (a view of "
                             "the parameter kept outside the module's forward: in an attribute, a global, a hook, or "
                             "saved by autograd past strata's hooks); strata keeps module %s fetched rather than let "
                             "that tensor read reused memory; copy what you keep (.clone()) or keep the parameter "
                             "itself" % (", ".join(kept[:3]), unit.name))
        unit.lent = []

    def _fetch(self, unit: Unit) -> None:
        for mid in unit.mids:
            self.engine.fetch(mid)
        self._lend(unit)

    def _release(self, unit: Unit) -> None:
        self._take_back(unit)
        for mid in unit.mids:
            self.engine.release(mid)

    def _lent_param(self, t: torch.Tensor) -> Optional[Tuple[nn.Parameter, int]]:
        """(parameter, its lent memory's start) when t's memory lies in a lent parameter's, else None."""
        if not self._live or not t.numel():
            return None
        ptr = t.data_ptr()
        lo, hi = 0, len(self._live)
        while lo < hi:  # the last entry starting at or before ptr
            mid = (lo + hi) // 2
            if self._live[mid][0] <= ptr:
                lo = mid + 1
            else:
                hi = mid
        if lo == 0:
            return None
        start, end, p = self._live[lo - 1]
        return (p, start) if ptr < end else None

    def param_name(self, p: torch.Tensor) -> str:
        """p's qualified name in the model (for messages)."""
        return self._names.get(id(p), "?")

    # ---------------------------------------------------------------- forward

    def _run(self, unit: Unit, inner: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """A wrapped module's forward: the unit is held (fetched) while it runs, with strata's saved-tensor hooks."""
        self._acquire(unit)
        outermost = unit.fwd_holds == 1
        try:
            if outermost and unit.has_frozen and not unit.in_backward and torch.is_grad_enabled():
                args, kwargs = self._watch_inputs(unit, args, kwargs)
            if _saved_hooks.active_for(self):
                out = inner(*args, **kwargs)
            else:
                with self._hooks():
                    out = inner(*args, **kwargs)
            if outermost:
                out = self._own_outputs(out)
        except BaseException:
            self._let_go(unit)
            raise
        return self._forward_done(unit, out, outermost)

    def _hooks(self) -> _saved_hooks.StrataHooks:
        return _saved_hooks.StrataHooks(self, self._keep, self._restore, _saved_hooks.innermost())

    def _acquire(self, unit: Unit) -> None:
        if unit.fwd_holds == 0 and not unit.in_backward:
            if torch.is_grad_enabled():
                self._check_trained(unit)
            self._fetch(unit)
        unit.fwd_holds += 1

    def _check_trained(self, unit: Unit) -> None:
        """Which parameters train is laid out at initialize (a frozen one has no gradient buffer and no optimizer
        state; a trained one is stepped whether or not a gradient reaches it): a requires_grad changed since then is
        refused, not ignored."""
        for (qname, p), trained in zip(unit.params, unit.trained):
            if p.requires_grad != trained:
                raise StateError(
                    "strata: %s.requires_grad is %s, but it was %s at strata.torch.initialize, which laid it out as %s; "
                    "strata cannot change that on a running engine; hint: set requires_grad before initialize: save "
                    "what you need (engine.save_checkpoint, or module.state_dict()), engine.close(restore_weights="
                    "True), set requires_grad, and strata.torch.initialize the model again" % (
                        qname, p.requires_grad, trained, "trained (with gradients and optimizer state)" if trained
                        else "frozen (no gradient, no optimizer state)"))

    def _watch_inputs(self, unit: Unit, args: Tuple[Any, ...], kwargs: Dict[str, Any]
                      ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """args and kwargs with each tensor that requires grad passed through _BackwardRelease (see Unit.armed)."""
        def watched(value: Any) -> Any:
            rebuild, tensors = tensors_in(value)
            if not any(t.requires_grad for t in tensors):
                return value
            out = []
            for t in tensors:
                if t.requires_grad:
                    token = InputToken()
                    unit.armed.add(token)
                    t = _BackwardRelease.apply(self, unit, token, t)
                out.append(t)
            return rebuild(out)
        return tuple(watched(a) for a in args), {k: watched(v) for k, v in kwargs.items()}

    def _let_go(self, unit: Unit) -> None:
        unit.fwd_holds -= 1
        if unit.fwd_holds == 0 and not unit.in_backward:
            self._release(unit)

    def _own_outputs(self, output: Any) -> Any:
        """output with every tensor that is a view of lent memory copied: it outlives the release."""
        rebuild, tensors = tensors_in(output)
        if not any(self._lent_param(t) for t in tensors):
            return output
        return rebuild([t.clone() if self._lent_param(t) else t for t in tensors])

    def _forward_done(self, unit: Unit, output: Any, outermost: bool) -> Any:
        if (outermost and self._backward_active and not unit.in_backward and unit.fwd_holds == 1 and
                torch.is_grad_enabled()):
            # A recompute inside backward (reentrant checkpointing): its backward follows at once, so the unit
            # stays fetched for it instead of being released and fetched again.
            unit.fwd_holds = 0
            self._start_backward(unit)
        else:
            self._let_go(unit)
        if not outermost or not torch.is_grad_enabled():
            return output
        rebuild, tensors = tensors_in(output)
        if not any(t.requires_grad for t in tensors):
            return output
        return rebuild([_BackwardFetch.apply(self, unit, t) if t.requires_grad else t for t in tensors])

    def _keep(self, t: torch.Tensor, alone: bool) -> Union[None, ParamView, KeptActivation]:
        """What strata keeps of a tensor autograd saves (see the top), or None to leave it to the hooks beneath."""
        lent = self._lent_param(t)
        if lent is not None and t.dtype == lent[0].dtype:
            p, start = lent
            return ParamView(p, tuple(t.shape), t.stride(), (t.data_ptr() - start) // t.element_size())
        if (alone and self._offload_acts and not self._backward_active and t.dtype in _tensors.DTYPES.values() and
                t.device == self.device and t.numel() * t.element_size() >= self.activation_min_bytes):
            return KeptActivation(self, t)
        return None

    def _restore(self, saved: Union[ParamView, KeptActivation]) -> torch.Tensor:
        return saved.restore(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped model's forward (on strata's compute stream on CUDA): the same as engine.module(...), with
        activation offload (when configured) also for what runs outside the units."""
        self._forward_depth += 1
        try:
            with self._hooks(), self._on_stream():
                return self.module(*args, **kwargs)
        finally:
            self._forward_depth -= 1

    def _on_stream(self) -> ContextManager[Any]:
        if self._stream is None:
            return _NoContext()
        return torch.cuda.stream(self._stream)

    # ---------------------------------------------------------------- backward

    def _enter_backward(self, unit: Unit) -> None:
        if not self._backward_active:
            scale = self._loss_scale()
            if not self._backward_scaled and scale != 1.0:
                raise StateError(
                    "strata: a backward that did not come through engine.backward(loss) reached module %s; this "
                    "engine scales the loss by %g (1/gradient_accumulation_steps %d, 1/world %d, the fp16 loss scale) "
                    "and a plain loss.backward() would give other gradients; call engine.backward(loss)" % (
                        unit.name, scale, self._gas, self.world_size))
            self._backward_active = True
            if self._step_in_backward and not self._step_begun:
                self._begin_step()
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._callback_queued = True
        if unit.in_backward:
            return
        if unit.fwd_holds == 0:
            self._fetch(unit)
        self._start_backward(unit)

    def _start_backward(self, unit: Unit) -> None:
        """The unit (fetched) takes its gradients now: a trained parameter's .grad points at strata's gradient
        buffer; and it waits for the inputs of its forwards whose graphs live."""
        unit.in_backward = True
        e = self.engine
        for i, ((_, p), pid, trained) in enumerate(zip(unit.params, unit.pids, unit.trained)):
            if trained:
                p.grad = _tensors.wrap(e.grad_data(pid), _numel(p), self.dtype, self.device).view(_shape(p))
                unit.pending.add(i)
        unit.waiting = set(unit.armed)

    def _grad_arriving(self, unit: Unit, p: nn.Parameter) -> None:
        """A gradient is about to be accumulated into p: p must be taking its gradients in strata's buffer."""
        if not unit.in_backward:
            raise StateError(
                "strata: a gradient for %s arrived before strata fetched module %s for backward: a tensor computed "
                "in that module's forward reached the loss without passing through the module's outputs (kept in an "
                "attribute or an object strata cannot see into); return it from the module's forward" % (
                    self.param_name(p), unit.name))

    def _grad_accumulated(self, unit: Unit, i: int) -> None:
        if not unit.in_backward:
            return  # a gradient refused by _grad_arriving: the error is on its way
        self._grad_seen.add(id(unit.params[i][1]))
        unit.pending.discard(i)
        if not unit.pending and not unit.waiting:
            self._finish_backward(unit)

    def _input_passed(self, unit: Unit, token: InputToken) -> None:
        """Backward has passed the gradient of one of the unit's inputs out of it (_BackwardRelease)."""
        unit.armed.discard(token)
        if unit.in_backward and token in unit.waiting:
            unit.waiting.discard(token)
            if not unit.pending and not unit.waiting:
                self._finish_backward(unit)

    def _finish_backward(self, unit: Unit) -> None:
        for _, p in unit.trained_params():
            p.grad = None
        unit.in_backward = False
        unit.pending.clear()
        unit.waiting.clear()
        for mid in unit.trained_mids:
            self.engine.grads_ready(mid)
        if unit.fwd_holds == 0:
            self._release(unit)

    def _backward_done(self) -> None:
        self._callback_queued = False
        self._backward_active = False
        missed = [u for u in self.units if u.in_backward]
        for unit in missed:
            self._finish_backward(unit)

    def _loss_scale(self) -> float:
        return self.engine.loss_scale() / (self._gas * self.world_size)

    def _scaled(self, loss: torch.Tensor, scale_wrt_gas: bool = True) -> torch.Tensor:
        """loss / (accumulation steps x ranks), as a torch recipe writes it (a division: for 3 steps, x (1/3) would
        round differently), times the fp16 loss scale; in fp32 for a half loss (_precision.fp32_loss). Without
        scale_wrt_gas only the ranks divide."""
        loss = fp32_loss(loss)
        divisor = (self._gas if scale_wrt_gas else 1) * self.world_size
        if divisor != 1:
            loss = cast(torch.Tensor, loss / divisor)  # mypy takes torch 1.13's Tensor / int for a float
        scale = self.engine.loss_scale()
        return cast(torch.Tensor, loss * scale) if scale != 1.0 else loss

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True) -> torch.Tensor:
        """loss.backward(), scaled as DeepSpeed scales it: by 1 / gradient_accumulation_steps (unless scale_wrt_gas is
        False: the loss already is its micro-batch's share, as transformers' Trainer passes it), averaged over the
        ranks, and by the fp16 loss scale. Returns loss."""
        if self._forward_depth or any(u.fwd_holds for u in self.units):
            raise StateError("strata: engine.backward(loss) while a forward is still running; call it after "
                             "engine(...) returns")
        self._backward_scaled = True
        try:
            with self._on_stream():
                self._scaled(loss, scale_wrt_gas).backward()
        except BaseException:
            self._abort_backward()
            raise
        finally:
            self._backward_scaled = False
        return loss

    def _abort_backward(self) -> None:
        """After a failed backward: the units still in it give their gradient buffers back unread (strata discards
        them on release); units that had finished keep their contribution in strata's gradient store."""
        self._callback_queued = False
        self._backward_active = False
        for unit in self.units:
            if unit.in_backward:
                for _, p in unit.trained_params():
                    p.grad = None
                unit.in_backward = False
                unit.pending.clear()
                unit.waiting.clear()
                if unit.fwd_holds == 0:
                    self._release(unit)

    # ---------------------------------------------------------------- the step

    def gradient_accumulation_steps(self) -> int:
        return self._gas

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self._gas == 0

    def get_lr(self) -> List[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self) -> None:
        """Counts a micro-batch; at the accumulation boundary runs strata's optimizer step with the lr of
        engine.optimizer (which a torch lr scheduler may drive) and steps engine.lr_scheduler (a ReduceLROnPlateau
        is the caller's to step, with its metric)."""
        self._check_between_steps("engine.step()")
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if boundary:
            self.optimizer.step()  # through torch's wrapper, which counts steps for the lr schedulers

    def _check_between_steps(self, what: str) -> None:
        if self._forward_depth:
            raise StateError("strata: %s inside forward; call it after engine.backward(loss) returns" % what)
        held = [u.name for u in self.units if u.fwd_holds or u.in_backward]
        if held:
            raise StateError("strata: %s while modules %s are still in use (inside backward?); call it after "
                             "engine.backward(loss) returns" % (what, ", ".join(held)))
        for unit in self.units:
            self._check_trained(unit)

    def _step_values(self) -> Tuple[Optional[float], List[Dict[str, float]]]:
        """(the lr that goes with the step: one group's, the C API's single-group form, or None with several, each
        group's own; every group's values) as engine.optimizer has them now."""
        groups = cast(_param_groups.Groups, self.optimizer.param_groups)
        values = [g.hparams() for g in groups]
        return (cast(float, groups[0]["lr"]) if len(groups) == 1 else None), values

    def _push_step_values(self) -> Optional[float]:
        """Each group's lr and weight_decay into strata for this step; returns the step's lr (_step_values)."""
        cast(_param_groups.Groups, self.optimizer.param_groups).push(self.engine)
        return self._step_values()[0]

    def _begin_step(self) -> None:
        """With step_in_backward, at the step's first backward: the step begins with the values engine.optimizer has
        now (a scheduler moved them after the last step), as each module's update runs while backward goes on."""
        self.engine.step_begin(lr=self._push_step_values())
        self._step_begun = True
        self._begun_values = self._step_values()

    def _check_begun_values(self) -> None:
        """The updates already ran with the values the step began with: a change since (an lr set between backward
        and engine.step()) would not apply, so it is refused rather than dropped."""
        now = self._step_values()
        if now != self._begun_values:
            raise StateError("strata: engine.optimizer's param groups changed between backward and step (%s, then %s), "
                             "but with strata.step_in_backward each module's update ran during backward with the values "
                             "the step began with; hint: change lr or weight_decay after engine.step() (as a scheduler "
                             "does), not between engine.backward and engine.step" % (self._begun_values[1],
                                                                                        now[1]))

    def _optimizer_step(self) -> None:
        """strata's optimizer step with engine.optimizer's lr; what engine.optimizer.step() does."""
        self._check_between_steps("engine.optimizer.step()")
        self._warn_no_grad()
        if self._step_in_backward:
            if not self._step_begun:
                self._begin_step()  # a step without a backward: begun here, it updates with zero gradients
            self._check_begun_values()
            self._step_begun = False
            lr = self._begun_values[0]
        else:
            lr = self._push_step_values()
        result = self.last_step = self.engine.step(lr=lr)
        self.global_steps += 1
        if not result["skipped"]:
            _lr_owner.step(self.lr_scheduler)
        if self.steps_per_print and self.global_steps % self.steps_per_print == 0 and self.rank == 0:
            print("strata: step %d lr %.4g grad_norm %.4g loss_scale %g" % (
                self.global_steps, self.optimizer.param_groups[0]["lr"], result["grad_norm"],
                result["loss_scale"]), flush=True)

    def _warn_no_grad(self) -> None:
        """Once: parameters that got no gradient since the last step (a MoE expert no token reached, a branch not
        taken) are stepped with a zero gradient, where torch.optim skips a None .grad."""
        if not self._warned_no_grad:
            names = [q for u in self.units for q, p in u.trained_params() if id(p) not in self._grad_seen]
            if names:
                warnings.warn(
                    "strata: %s got no gradient since the last step; strata steps every parameter, so they are updated "
                    "with a zero gradient (the moments decay, weight decay applies), as torch.optim does after "
                    "zero_grad(set_to_none=False), while after set_to_none=True torch skips them" %
                    ", ".join(names[:4] + (["..."] if len(names) > 4 else [])), stacklevel=3)
                self._warned_no_grad = True
        self._grad_seen = set()

    # ---------------------------------------------------------------- modes

    def train(self, mode: bool = True) -> StrataEngine:
        self.module.train(mode)
        return self

    def eval(self) -> StrataEngine:
        return self.train(False)

    # ---------------------------------------------------------------- state

    def fp32_state_dict(self) -> Dict[str, torch.Tensor]:
        """Every parameter's fp32 master weights as CPU tensors under the model's names (a collective with
        several ranks): a frozen parameter's are its weights as strata holds them (in the compute dtype), widened.
        For export and inspection; the model's own tensors stay empty."""
        out = {}
        for unit in self.units:
            for (qname, p), pid in zip(unit.params, unit.pids):
                t = torch.empty(_numel(p), dtype=torch.float32)
                self.engine.read_master(pid, 0, _numel(p), t.data_ptr())
                out[qname] = t.view(_shape(p))
        return out

    def full_weight(self, p: nn.Parameter) -> torch.Tensor:
        """Parameter p's weights as a CPU tensor in the model's dtype and shape (its fp32 master weights,
        rounded): what state_dict() gives. A collective with several ranks."""
        pid = self._pids[id(p)]
        t = torch.empty(_numel(p), dtype=torch.float32)
        self.engine.read_master(pid, 0, _numel(p), t.data_ptr())
        weight: torch.Tensor = t.view(_shape(p)).to(self.dtype)
        return weight

    def stats(self) -> Dict[str, Any]:
        return self.engine.stats()

    def save_checkpoint(self, save_dir: StrPath, tag: Optional[object] = None,
                        client_state: Optional[Dict[str, Any]] = None, save_latest: bool = True) -> str:
        """Writes the training state to save_dir/tag (tag default "global_step<N>"), atomically: strata's
        checkpoint, then this engine's counters, the lr scheduler's state and client_state beside it, then
        save_dir/latest. A collective with several ranks. Returns the checkpoint's path."""
        return _checkpoint.save(self, save_dir, tag, client_state, save_latest)

    def load_checkpoint(self, load_dir: StrPath, tag: Optional[object] = None, load_module_strict: bool = True,
                        load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                        load_module_only: bool = False, custom_load_fn: Any = None) -> Tuple[Optional[str], Any]:
        """Restores what save_checkpoint wrote: load_dir/tag, or the tag in load_dir/latest, or load_dir itself
        when it is a checkpoint, or the newest one under load_dir. Returns (path, client_state), or (None, None)
        with a warning when there is nothing to load (as DeepSpeed). Training then continues bit-identically.
        DeepSpeed's flags: load_lr_scheduler_states=False keeps the scheduler and the lr as they are;
        load_module_strict either way loads exactly the parameters strata holds; load_module_only=True and
        load_optimizer_states=False are refused (strata's checkpoint holds one whole training state)."""
        return _checkpoint.load(self, load_dir, tag, load_module_strict, load_optimizer_states,
                                load_lr_scheduler_states, load_module_only, custom_load_fn)

    def save_16bit_model(self, save_dir: StrPath, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """DeepSpeed's: the model's state_dict, the trained weights in the compute dtype, written by rank 0 with
        torch.save to save_dir/save_filename. A collective with several ranks. Returns True."""
        return _checkpoint.save_16bit(self, save_dir, save_filename, exclude_frozen_parameters)

    # ---------------------------------------------------------------- DeepSpeed's engine, the rest

    def get_global_grad_norm(self) -> Optional[float]:
        """The last step's global gradient norm (of the unscaled gradients), as DeepSpeed: None before the first
        step, and None when strata did not measure it (it does with gradient_clipping or fp16)."""
        if self.last_step is None or self.last_step["grad_norm"] < 0:
            return None
        return float(self.last_step["grad_norm"])

    @property
    def local_rank(self) -> int:
        """This process's rank among the ranks on its host (MPI's)."""
        return self.comm.local_rank

    def fp16_enabled(self) -> bool:
        return self.config.param_dtype == "fp16"

    def bfloat16_enabled(self) -> bool:
        return self.config.param_dtype == "bf16"

    def __getattr__(self, name: str) -> Any:
        """DeepSpeed's fall-through: a public attribute the engine does not have is the model's (engine.generate,
        engine.some_model_attr). Names with a leading underscore are the engine's own and never fall through, nor
        does any name before __init__ sets the model; the model is read from __dict__, so this never recurses."""
        module = self.__dict__.get("module")
        if module is None or name.startswith("_"):
            raise AttributeError("'%s' object has no attribute '%s'" % (type(self).__name__, name))
        try:
            return getattr(module, name)
        except AttributeError:
            raise AttributeError("'%s' object has no attribute '%s', nor has its model (%s)" % (
                type(self).__name__, name, type(module).__name__)) from None

    def close(self, restore_weights: bool = False) -> None:
        """Frees strata's engine (its memory and files) and gives the model its own forward and state_dict back.
        The model keeps its empty parameters; with restore_weights=True each parameter gets its weights back as
        storage of its own, on the compute device, in the compute dtype (what state_dict() gives), so the model runs
        without strata (PEFT's merge_and_unload, generate, a plain torch loop). With several ranks restore_weights is
        a collective."""
        if self.__dict__.get("engine") is not None:  # not through __getattr__: the model may have an "engine"
            weights = {id(p): self.full_weight(p) for u in self.units for _, p in u.params} if restore_weights else {}
            self._remove_hooks()
            for h in self._grad_hooks:
                h.remove()
            self._grad_hooks, self._grad_nodes = [], []
            for u in self.units:
                for _, p in u.params:
                    if id(p) in weights:
                        p.data = weights[id(p)].to(self.device)
            _state_dict.remove(self)
            if getattr(self.module, "_strata_engine", None) is self:
                del self.module._strata_engine
            self.engine.close()
            self.engine = None  # type: ignore[assignment]  # closed: _state_dict's hooks test for it


def _check_step_in_backward(config: Config, on: bool, gas: int) -> None:
    """strata.step_in_backward through torch: each module's update runs as its backward ends, so the step is
    begun at the first backward (engine._begin_step); what that cannot carry is refused before anything is made."""
    if not on:
        return
    if gas != 1:
        raise ConfigError("config: strata.step_in_backward updates each module during backward, so every step is one "
                          "micro-batch, but gradient_accumulation_steps = %d; hint: set it to 1 (raise "
                          "train_micro_batch_size_per_gpu instead), or turn strata.step_in_backward off" % gas)
    if config.get("strata.norm_pass", False):
        raise ConfigError("config: strata.norm_pass runs each step's forward and backward twice, which strata.torch "
                          "cannot do for the model's own code; hint: drop strata.norm_pass (with gradient_clipping "
                          "the step in backward speculates and stays exact)")


def _check_values(model: nn.Module) -> None:
    """Refuses a model with tensors that hold no values (the meta device) and have none to come, before anything is
    made."""
    empty = [n for n, p in model.named_parameters() if p.is_meta and source_of(p) is None]
    if empty:
        raise InvalidArgument("strata.torch.initialize: %d parameter(s) are on the meta device and have no values (%s); "
                              "hint: load them with strata.torch.load_pretrained(model, path) first, or build the model "
                              "under strata.torch.zero_init() so it is made on disk, not in memory"
                              % (len(empty), ", ".join(empty[:4])))
    buffers = [n for n, b in model.named_buffers() if b is not None and b.is_meta]
    if buffers:
        raise InvalidArgument("strata.torch.initialize: buffer(s) %s are on the meta device: they have no values and "
                              "strata does not make them; hint: build the model with accelerate's init_empty_weights() "
                              "(which keeps buffers, include_buffers=False) instead of torch.device(\"meta\"), or under "
                              "strata.torch.zero_init()" % ", ".join(buffers[:4]))


def _initial_values(p: nn.Parameter) -> Callable[[int, int, Any], None]:
    """strata's init callback for p: its source's values (load_pretrained) or its own, fp32, chunk by chunk; the
    pages of a zero_init tensor go back to the kernel after each chunk, so the whole model is never in memory."""
    source = source_of(p)
    if source is not None:
        def read(offset: int, count: int, out: Any, source: WeightSource = source) -> None:
            source.read_into(offset, count, torch.frombuffer(out, dtype=torch.float32))
        return read
    src = p.detach().reshape(-1)

    def copy(offset: int, count: int, out: Any, src: torch.Tensor = src) -> None:
        dst = torch.frombuffer(out, dtype=torch.float32)
        dst.copy_(src[offset:offset + count].to("cpu", torch.float32))
        _zero_init.drop_pages(src)
    return copy


def _check_model_dtype(model: nn.Module, dtype: torch.dtype) -> None:
    """A model built in half precision trains in that precision only when the config says so: strata computes in the
    config's dtype (fp32 without a bf16 or fp16 section), so a bf16 model under an fp32 config would silently train
    in fp32, and one under the other half dtype would lose range or precision. An fp32 model takes any config (the
    config's dtype is then its compute copy, as DeepSpeed casts the module)."""
    halves = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()
                     if p.is_floating_point() and p.dtype in (torch.bfloat16, torch.float16) and p.dtype != dtype})
    if halves:
        wanted = {"bfloat16": "{\"bf16\": {\"enabled\": true}}", "float16": "{\"fp16\": {\"enabled\": true}}"}
        raise ConfigError("strata.torch.initialize: the model's parameters are %s but the config computes in %s; "
                          "hint: add %s to the config, or build the model in float32 (model.float())" % (
                              " and ".join(halves), str(dtype).replace("torch.", ""),
                              " or ".join(wanted[h] for h in halves)))


def _shape(p: torch.Tensor) -> Tuple[int, ...]:
    """A managed parameter's own shape (its tensor is empty between uses)."""
    shape: Tuple[int, ...] = getattr(p, "_strata_shape")
    return shape


def _numel(p: torch.Tensor) -> int:
    """A managed parameter's own element count (its tensor is empty between uses)."""
    numel: int = getattr(p, "_strata_numel")
    return numel


def _name_groups(unit_name: str, params: List[Tuple[str, nn.Parameter]]
                 ) -> List[Tuple[str, List[Tuple[str, nn.Parameter]]]]:
    """[(strata module name, [(qualified name, parameter)])] of a unit's params (its trained ones, or its frozen
    ones; none: []). strata names a tensor "<module>.<param>" (in checkpoints, and so in `strata ckpt export`'s
    file): a module named by its parameters' common prefix makes those names the model's own state_dict keys. Tied
    units with no common prefix (BERT's word embeddings and its prediction head's bias) become one strata module per
    parent module, fetched together."""
    if not params:
        return []
    prefix = common_prefix([q for q, _ in params])
    if prefix:
        return [(prefix, params)]
    groups: Dict[str, List[Tuple[str, nn.Parameter]]] = {}
    for qname, p in params:
        groups.setdefault(qname.rpartition(".")[0] or unit_name, []).append((qname, p))
    return list(groups.items())


def _frozen_name(prefix: str, taken: Set[str]) -> Tuple[str, str]:
    """(module name, the prefix its parameter names are relative to) of a frozen module whose parameters share
    prefix: the nearest enclosing prefix that no other module has (a frozen LoRA block's base weights, say
    "layers.0" beside the trained "layers.0.attn"), so the tensors keep the model's names; where every enclosing
    prefix is taken, prefix + ".frozen" (the tensors are then "<prefix>.frozen.<rest of the name>")."""
    name = prefix
    while name in taken:
        name = name.rpartition(".")[0]
    if name:
        return name, name
    return prefix + ".frozen", prefix


class _NoContext:
    def __enter__(self) -> _NoContext:
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        pass

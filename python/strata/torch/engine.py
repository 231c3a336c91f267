"""strata.torch.initialize: a PyTorch model trained ZeRO-3 style, its parameters and optimizer state held by strata.

Every unit of the model becomes a strata module: each element of an nn.ModuleList / nn.Sequential (a transformer
block, say) with everything under it, and every other module with parameters of its own (an embedding, a final
LayerNorm); units that share a parameter (GPT's tied embedding and head) are one module. After initialize the
model's parameter tensors hold no storage. Around each use strata lends them its memory without a copy:

  forward   pre-hook: fetch, point the parameters at strata's memory  ->  module runs  ->  post-hook: release
  backward  the unit's outputs pass through _BackwardFetch, whose backward runs before the unit's own: fetch
            again and point each parameter's .grad at strata's gradient buffer, so autograd accumulates into it
            in place; when the last of the unit's gradients is accumulated (a hook on its AccumulateGrad node),
            grads_ready hands them to strata and the unit is released. A callback at the end of backward
            finishes units some of whose parameters got no gradient.

Autograd saves tensors for backward, and some are views of a parameter (nn.Linear saves weight.t()). Those views
would point into memory strata reuses after the release, so a saved-tensor hook records them as (parameter,
size, stride, offset) and rebuilds them from the parameter's memory of the moment, which backward has fetched.
"""
import bisect
import json

import torch
import torch.nn as nn

from ..config import Config
from ..engine import Engine, world
from ..errors import ConfigError, InvalidArgument, StateError
from . import _checkpoint, _tensors
from ._units import common_prefix, find_units, short_name, tensors_in

class _BackwardFetch(torch.autograd.Function):
    """Identity in forward; its backward runs before the unit's backward and fetches the unit."""

    @staticmethod
    def forward(ctx, engine, unit, tensor):
        ctx.engine, ctx.unit = engine, unit
        return tensor.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.engine._enter_backward(ctx.unit)
        return None, None, grad


class _LrHolder(torch.optim.Optimizer):
    """engine.optimizer: what torch's lr schedulers drive. strata reads param_groups[0]['lr'] at every step."""

    def __init__(self, engine, params, lr):
        super().__init__(params, {"lr": lr})
        self._engine = engine

    def step(self, closure=None):
        """A strata step now, whatever the accumulation count (engine.step() calls it at the boundary)."""
        loss = closure() if closure is not None else None
        self._engine._optimizer_step()
        return loss

    def zero_grad(self, set_to_none=True):
        """Nothing to do: strata zeroes its gradients at every step."""


class _KeptActivation:
    """A tensor autograd saved for backward, kept off the device by strata (strata_act_push) until backward unpacks
    it. Its copy is dropped when autograd lets go of it (after the node's backward, or with the graph)."""

    def __init__(self, owner, t):
        src = t.contiguous()
        self.engine, self.shape, self.dtype, self.device = owner.engine, t.shape, t.dtype, t.device
        self.handle = owner.engine.act_push(src.data_ptr(), src.numel() * src.element_size())
        owner._act_source = src  # strata reads it until the next push or pop

    def unpack(self, owner):
        address = self.engine.act_pop(self.handle)
        owner._act_source = None
        numel = 1
        for n in self.shape:
            numel *= n
        return _tensors.wrap(address, numel, self.dtype, self.device).view(self.shape).clone()

    def __del__(self):
        try:
            self.engine.act_drop(self.handle)
        except Exception:  # the engine is closed already: its store went with it
            pass


class StrataEngine:
    """What strata.torch.initialize returns; shaped like DeepSpeed's engine.

    With strata.offload_activations in the config, the tensors autograd saves in forward (those of at least
    activation_min_bytes, in a floating dtype, not views of parameters) are kept off the device by strata until
    backward needs them: copied to pinned host memory or NVMe on strata's streams and restored ahead of backward."""

    activation_min_bytes = 64 << 10

    def __init__(self, model, config, lr_scheduler=None, comm=None, trainable=None, device=None):
        if not isinstance(model, nn.Module):
            raise InvalidArgument("strata.torch.initialize: model must be a torch.nn.Module, got %s" %
                                  type(model).__name__)
        self.module = model
        self.comm = comm if comm is not None else world()
        self.rank, self.world_size = self.comm.rank, self.comm.size
        devices = {p.device for p in model.parameters()}
        if len(devices) != 1:
            raise InvalidArgument("strata.torch.initialize: the model's parameters are on %s; put them on one "
                                  "device (model.to(...)) first" % sorted(str(d) for d in devices))
        self.config, self.device = self._config_for_device(config, devices.pop(), device)
        _, _, self._gas = self.config.batch_sizes(self.world_size)
        self.steps_per_print = self.config.trainer.get("steps_per_print")
        self.dtype = _tensors.DTYPES[self.config.param_dtype]
        self.units = find_units(model, trainable)
        if not self.units:
            raise InvalidArgument("strata.torch.initialize: the model has no trainable parameters")
        self.engine = Engine(self.config, comm=self.comm)
        self._register()
        self.engine.finalize()
        self._stream = None
        if self.device.type == "cuda":
            self._stream = torch.cuda.ExternalStream(self.engine.compute_stream(), device=self.device)
            torch.cuda.set_stream(self._stream)
        self._live = []             # sorted (start address, end address, parameter) of the lent parameters
        self._offload_acts = self.config.get("strata.offload_activations.device", "none") != "none"
        self._act_source = None     # the last activation pushed, which strata may still be reading
        self._grad_nodes = []       # AccumulateGrad nodes, kept alive so the hooks stay theirs
        self._empty_parameters()
        self._move_buffers()
        self._install_hooks()
        self.micro_steps = 0
        self.global_steps = 0
        self.last_step = None
        self._callback_queued = False
        self._forward_depth = 0
        self.optimizer = _LrHolder(self, [p for u in self.units for _, p in u.params], self.config.lr)
        self.lr_scheduler = lr_scheduler(self.optimizer) if callable(lr_scheduler) and not hasattr(
            lr_scheduler, "step") else lr_scheduler
        if self.lr_scheduler is None and "scheduler" in self.config.trainer:
            from . import schedulers
            self.lr_scheduler = schedulers.build(self.config.trainer["scheduler"], self.optimizer)

    # ---------------------------------------------------------------- setup

    @staticmethod
    def _config_for_device(config, model_device, device):
        """(config, compute device): the device is `device`, else the config's strata.backend, else the model's
        GPU, else a GPU when torch sees one, else the CPU; the config's backend is made to agree. A model built on the CPU can so train on a GPU it does not fit."""
        cfg = config if isinstance(config, Config) else Config(config)
        doc = json.loads(json.dumps(cfg.document))
        section = doc.setdefault("strata", {})
        asked = section.get("backend", "auto")
        if device is not None:
            device = torch.device(device)
        elif asked == "cuda":
            device = torch.device("cuda")
        elif asked == "host":
            device = torch.device("cpu")
        elif model_device.type == "cpu" and torch.cuda.is_available():
            device = torch.device("cuda")  # as DeepSpeed: a model built on the CPU computes on the GPU
        else:
            device = model_device
        want = "cuda" if device.type == "cuda" else "host" if device.type == "cpu" else None
        if want is None or asked not in ("auto", want):
            raise ConfigError("config: strata.backend = %r cannot compute on %s; strata computes on \"cpu\" (host) "
                              "or \"cuda\"; hint: remove strata.backend or pass device=" % (asked, device))
        section["backend"] = want
        if device.type == "cuda":
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
            section.setdefault("device_id", device.index)
        out = Config(doc)
        out.origin = cfg.origin
        return out, device

    def _register(self):
        e = self.engine
        for unit in self.units:
            # strata names a tensor "<module>.<param>" (in checkpoints too): the module is named by its parameters'
            # common prefix, so those names are the model's own state_dict keys.
            prefix = common_prefix([q for q, _ in unit.params]) or unit.name
            unit.mid = e.add_module(short_name(prefix))
            for qname, p in unit.params:
                src = p.detach().reshape(-1)

                def init(offset, count, out, src=src):
                    dst = torch.frombuffer(out, dtype=torch.float32)
                    dst.copy_(src[offset:offset + count].to("cpu", torch.float32))
                pname = qname[len(prefix) + 1:] if qname.startswith(prefix + ".") else qname
                unit.pids.append(e.add_param(unit.mid, short_name(pname), p.numel(), init))

    def _empty_parameters(self):
        """Frees the model's own parameter storage and hooks each parameter's AccumulateGrad node."""
        for unit in self.units:
            for i, (_, p) in enumerate(unit.params):
                # The node takes its shape, dtype and device from the parameter when it is made: make it while the
                # parameter looks as it will when strata lends it memory.
                p.data = torch.empty(1, dtype=self.dtype, device=self.device).expand(p.shape)  # no real storage
                p.grad = None
                with torch.enable_grad():
                    node = p.expand_as(p).grad_fn.next_functions[0][0]
                node.register_hook(lambda grad_in, grad_out, u=unit, i=i: self._grad_accumulated(u, i))
                self._grad_nodes.append(node)
                p._strata_shape, p._strata_numel = tuple(p.shape), p.numel()
                p.data = _tensors.empty(self.dtype, self.device)

    def _move_buffers(self):
        """The model's buffers (masks, running statistics) go where it computes; its parameters are strata's."""
        for mod in self.module.modules():
            for key, buf in mod._buffers.items():
                if buf is not None and buf.device != self.device:
                    mod._buffers[key] = buf.to(self.device)

    def _install_hooks(self):
        for unit in self.units:
            for mod in unit.modules:
                mod.register_forward_pre_hook(lambda m, args, u=unit: self._acquire(u))
                mod.register_forward_hook(lambda m, args, out, u=unit: self._forward_done(u, out))

    # ---------------------------------------------------------------- lending memory

    def _lend(self, unit):
        e = self.engine
        for (_, p), pid in zip(unit.params, unit.pids):
            t = _tensors.wrap(e.param_data(pid), p._strata_numel, self.dtype, self.device).view(p._strata_shape)
            p.data = t
            start = t.data_ptr()
            bisect.insort(self._live, (start, start + t.numel() * t.element_size(), id(p), p))

    def _take_back(self, unit):
        ids = {id(p) for _, p in unit.params}
        self._live = [entry for entry in self._live if entry[2] not in ids]
        for _, p in unit.params:
            p.data = _tensors.empty(self.dtype, self.device)

    def _fetch(self, unit):
        self.engine.fetch(unit.mid)
        self._lend(unit)

    def _release(self, unit):
        self._take_back(unit)
        self.engine.release(unit.mid)

    # ---------------------------------------------------------------- forward

    def _acquire(self, unit):
        if unit.fwd_holds == 0 and not unit.in_backward:
            self._fetch(unit)
        unit.fwd_holds += 1

    def _forward_done(self, unit, output):
        unit.fwd_holds -= 1
        if unit.fwd_holds == 0 and not unit.in_backward:
            self._release(unit)
        if not torch.is_grad_enabled():
            return output
        rebuild, tensors = tensors_in(output)
        if not any(t.requires_grad for t in tensors):
            return output
        return rebuild([_BackwardFetch.apply(self, unit, t) if t.requires_grad else t for t in tensors])

    def _pack(self, t):
        """Saved for backward: a view of a lent parameter is kept as a recipe over the parameter (see the top)."""
        if self._live and t.numel():
            ptr = t.data_ptr()
            i = bisect.bisect_right(self._live, (ptr, float("inf"))) - 1
            if i >= 0:
                start, end, _, p = self._live[i]
                if ptr < end and t.dtype == p.dtype:
                    return (p, tuple(t.shape), t.stride(), (ptr - start) // t.element_size())
        if (self._offload_acts and t.dtype in _tensors.DTYPES.values() and t.device == self.device and
                t.numel() * t.element_size() >= self.activation_min_bytes):
            return _KeptActivation(self, t)
        return t

    def _unpack(self, saved):
        if isinstance(saved, _KeptActivation):
            return saved.unpack(self)
        if isinstance(saved, tuple):
            p, shape, stride, offset = saved
            if p.data.numel() == 0:
                raise StateError("strata: backward needs a parameter that is not fetched (a tensor saved in forward "
                                 "was a view of it); run backward through engine.backward(loss)")
            return p.data.as_strided(shape, stride, offset)
        return saved

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """The wrapped model's forward (on strata's compute stream on CUDA)."""
        self._forward_depth += 1
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), self._on_stream():
                return self.module(*args, **kwargs)
        except BaseException:
            self._drop_forward_holds()
            raise
        finally:
            self._forward_depth -= 1

    def _drop_forward_holds(self):
        """After a failed forward: give back what it held, so the engine stays usable."""
        for unit in self.units:
            if unit.fwd_holds and not unit.in_backward:
                unit.fwd_holds = 0
                self._release(unit)

    def _on_stream(self):
        if self._stream is None:
            return _NoContext()
        return torch.cuda.stream(self._stream)

    # ---------------------------------------------------------------- backward

    def _enter_backward(self, unit):
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._callback_queued = True
        if unit.in_backward:
            return
        if unit.fwd_holds == 0:
            self._fetch(unit)
        unit.in_backward = True
        e = self.engine
        for i, ((_, p), pid) in enumerate(zip(unit.params, unit.pids)):
            p.grad = _tensors.wrap(e.grad_data(pid), p._strata_numel, self.dtype, self.device).view(p._strata_shape)
            unit.pending.add(i)

    def _grad_accumulated(self, unit, i):
        if not unit.in_backward:
            return  # a backward outside the engine's (e.g. of a tensor computed without engine(...))
        unit.pending.discard(i)
        if not unit.pending:
            self._finish_backward(unit)

    def _finish_backward(self, unit):
        for _, p in unit.params:
            p.grad = None
        unit.in_backward = False
        unit.pending.clear()
        self.engine.grads_ready(unit.mid)
        if unit.fwd_holds == 0:
            self._release(unit)

    def _backward_done(self):
        self._callback_queued = False
        for unit in self.units:
            if unit.in_backward:
                self._finish_backward(unit)

    def backward(self, loss):
        """loss.backward(), scaled as DeepSpeed scales it: by 1 / gradient_accumulation_steps, averaged over the
        ranks, and by the fp16 loss scale. Returns loss."""
        if self._forward_depth or any(u.fwd_holds for u in self.units):
            raise StateError("strata: engine.backward(loss) while a forward is still running; call it after "
                             "engine(...) returns")
        scale = self.engine.loss_scale() / (self._gas * self.world_size)
        try:
            with self._on_stream():
                (loss * scale if scale != 1.0 else loss).backward()
        except BaseException:
            self._abort_backward()
            raise
        return loss

    def _abort_backward(self):
        """After a failed backward: the units still in it give their gradient buffers back unread (strata discards
        them on release); units that had finished keep their contribution in strata's gradient store."""
        self._callback_queued = False
        for unit in self.units:
            if unit.in_backward:
                for _, p in unit.params:
                    p.grad = None
                unit.in_backward = False
                unit.pending.clear()
                if unit.fwd_holds == 0:
                    self._release(unit)

    # ---------------------------------------------------------------- the step

    def gradient_accumulation_steps(self):
        return self._gas

    def is_gradient_accumulation_boundary(self):
        return (self.micro_steps + 1) % self._gas == 0

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def step(self):
        """Counts a micro-batch; at the accumulation boundary runs strata's optimizer step with the lr of
        engine.optimizer (which a torch lr scheduler may drive) and steps engine.lr_scheduler."""
        self._check_between_steps("engine.step()")
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_steps += 1
        if boundary:
            self.optimizer.step()  # through torch's wrapper, which counts steps for the lr schedulers

    def _check_between_steps(self, what):
        if self._forward_depth:
            raise StateError("strata: %s inside forward; call it after engine.backward(loss) returns" % what)
        held = [u.name for u in self.units if u.fwd_holds or u.in_backward]
        if held:
            raise StateError("strata: %s while modules %s are still in use (inside backward?); call it after "
                             "engine.backward(loss) returns" % (what, ", ".join(held)))

    def _optimizer_step(self):
        """strata's optimizer step with engine.optimizer's lr; what engine.optimizer.step() does."""
        self._check_between_steps("engine.optimizer.step()")
        self.last_step = self.engine.step(lr=self.optimizer.param_groups[0]["lr"])
        self.global_steps += 1
        if self.lr_scheduler is not None and not self.last_step["skipped"]:
            self.lr_scheduler.step()
        if self.steps_per_print and self.global_steps % self.steps_per_print == 0 and self.rank == 0:
            print("strata: step %d lr %.4g grad_norm %.4g loss_scale %g" % (
                self.global_steps, self.optimizer.param_groups[0]["lr"], self.last_step["grad_norm"],
                self.last_step["loss_scale"]), flush=True)

    # ---------------------------------------------------------------- modes

    def train(self, mode=True):
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    # ---------------------------------------------------------------- state

    def fp32_state_dict(self):
        """Every parameter's fp32 master weights as CPU tensors under the model's names (a collective with
        several ranks). For export and inspection; the model's own tensors stay empty."""
        out = {}
        for unit in self.units:
            for (qname, p), pid in zip(unit.params, unit.pids):
                t = torch.empty(p._strata_numel, dtype=torch.float32)
                self.engine.read_master(pid, 0, p._strata_numel, t.data_ptr())
                out[qname] = t.view(p._strata_shape)
        return out

    def stats(self):
        return self.engine.stats()

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True):
        """Writes the training state to save_dir/tag (tag default "global_step<N>"), atomically: strata's
        checkpoint, then this engine's counters, the lr scheduler's state and client_state beside it, then
        save_dir/latest. A collective with several ranks. Returns the checkpoint's path."""
        return _checkpoint.save(self, save_dir, tag, client_state, save_latest)

    def load_checkpoint(self, load_dir, tag=None):
        """Restores what save_checkpoint wrote: load_dir/tag, or the tag in load_dir/latest, or load_dir itself
        when it is a checkpoint. Returns (path, client_state). Training then continues bit-identically."""
        return _checkpoint.load(self, load_dir, tag)

    def close(self):
        """Frees strata's engine (its memory and files). The model keeps its empty parameters."""
        if getattr(self, "engine", None) is not None:
            self.engine.close()
            self.engine = None


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def initialize(model=None, config=None, lr_scheduler=None, comm=None, model_parameters=None, optimizer=None,
               config_params=None, device=None):
    """Moves model's parameters and their optimizer state into strata and returns the engine that trains it
    (DeepSpeed's deepspeed.initialize, returning the engine only: engine.optimizer and engine.lr_scheduler are
    on it). config: a dict, a JSON path or a strata.Config in the DeepSpeed vocabulary (config_params is
    DeepSpeed's other name for it). lr_scheduler: a torch lr scheduler or a callable making one from
    engine.optimizer; else the config's "scheduler" section, if any. comm: a strata.Comm (default: the launcher's
    world under mpirun, else a world of 1). model_parameters: what to train (default: every parameter that
    requires grad); the others must not require grad. device: where to compute ("cpu", "cuda", "cuda:1"; default:
    the config's strata.backend, else auto), so a model built on the CPU trains on a GPU it does not
    fit; "auto" picks the model's GPU, else any GPU torch sees, else the CPU. optimizer: refused, strata runs its own Adam (the config's
    "optimizer" section)."""
    if optimizer is not None:
        raise InvalidArgument("strata.torch.initialize: optimizer=%s is not taken: strata runs its own Adam/AdamW on "
                              "the CPU; give its hyperparameters in the config's \"optimizer\" section (or keep your "
                              "parameters and use strata.torch.OffloadAdam)" % type(optimizer).__name__)
    if config is not None and config_params is not None:
        raise InvalidArgument("strata.torch.initialize: give config or config_params, not both")
    return StrataEngine(model, config if config is not None else config_params, lr_scheduler=lr_scheduler,
                        comm=comm, trainable=_trainable(model, model_parameters), device=device)


def _trainable(model, model_parameters):
    """The set of ids of the parameters strata trains (one hyperparameter set: param groups may not differ)."""
    if model_parameters is None or not isinstance(model, nn.Module):
        return None
    ids = set()
    for item in model_parameters:
        if isinstance(item, dict):
            own = sorted(k for k in item if k != "params")
            if own:
                raise InvalidArgument("strata.torch.initialize: a param group sets %s; strata's engine runs one set "
                                      "of optimizer hyperparameters (the config's \"optimizer\" section); hint: use "
                                      "strata.torch.OffloadAdam for param groups of their own" % ", ".join(own))
            params = item["params"]
            ids.update(id(p) for p in ([params] if isinstance(params, torch.Tensor) else params))
        else:
            ids.add(id(item))
    names = {id(p): n for n, p in model.named_parameters()}
    stray = [names.get(i, "?") for i in ids if i not in names]
    if stray:
        raise InvalidArgument("strata.torch.initialize: model_parameters holds %d tensor(s) that are not parameters of "
                              "the model" % len(stray))
    untrained = [n for n, p in model.named_parameters() if id(p) not in ids and p.requires_grad]
    if untrained:
        raise InvalidArgument("strata.torch.initialize: %s require(s) grad but is not in model_parameters; hint: "
                              "p.requires_grad_(False) for what stays frozen" % ", ".join(untrained[:5]))
    return ids

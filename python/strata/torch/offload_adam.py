"""strata.torch.OffloadAdam: a torch.optim.Optimizer whose state lives in strata (ZeRO-Offload's case).

The trainer keeps its parameters where they are (CPU or GPU) and its own forward and backward; only the optimizer
is offloaded. strata holds the fp32 master weights and both Adam moments in its host or NVMe tier and runs its CPU
Adam on them; each step() hands it the gradients and copies the updated weights back into the parameters, in place.

    opt = OffloadAdam([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                      lr=3e-4, config={"zero_optimization": {"offload_optimizer": {"device": "nvme",
                                                                                   "nvme_path": "/local/nvme"}}})
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)   # drives param_groups[i]["lr"]

What matches torch, and what does not:
  - The update is torch 1.13's torch.optim.AdamW (adamw_mode=True) or torch.optim.Adam with L2 decay, bit for bit:
    strata derives its constants from the hyperparameters as doubles, as torch does from Python floats. The lr
    is passed as a double at every step; an lr of 0 is a step with lr 0.
  - A parameter whose .grad is None is updated with a zero gradient (its moments decay, weight decay applies),
    where torch's optimizers skip it: strata steps a group's parameters together. A warning says so once.
  - bf16 parameters get fp32 master weights in strata (the parameters receive them rounded to bf16); fp16
    parameters are refused (strata's fp16 needs its loss scaling, which this optimizer does not drive).
  - betas, eps, weight_decay and adamw_mode are fixed per group once it is added (changing them raises); the lr
    may change at every step.
  - With the delayed update (delayed_update=True, or strata.delayed_update in the config), after
    strata.delayed_warmup_steps ordinary steps each step() starts the update in the background and the
    parameters receive the previous step's result: the gradient of step k+1 is computed with the weights of
    step k-1 (ZeRO-Offload's one-step delay). sync() makes the update in flight visible.
  - state_dict() carries strata's own checkpoint files (bytes), so load_state_dict() resumes bit-identically,
    pending delayed update included; save_checkpoint()/load_checkpoint() do the same through a directory for
    state too large for memory. Loading sets the parameters to the loaded weights (the master weights are part of
    the optimizer state, as in DeepSpeed).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .. import checkpoint
from .._files import atomic_write
from ..config import ConfigSource
from ..errors import ConfigError
from . import _adam_config
from ._adam_group import GroupEngine, hyperparameters

DEFAULT_BUCKET_BYTES = 16 << 20
_MIN_BUCKET_BYTES = 4096
_FORMAT = 1
_META_FILE = "offload_adam.json"
_SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


class OffloadAdam(torch.optim.Optimizer):
    """Adam/AdamW with master weights and moments in strata's host or NVMe tier.

    The signature and defaults are DeepSpeedCPUAdam's (model_params, lr=1e-3, bias_correction=True,
    betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, adamw_mode=True, fp32_optimizer_states=True), so
    it replaces it as is. weight_decay defaults to 0 since issue 22 (it was 1e-2, torch.optim.AdamW's): pass
    weight_decay=1e-2 for the old behaviour.
    params: tensors or param groups (dicts with their own lr, betas, eps, weight_decay, adamw_mode).
    bias_correction: False drops Adam's bias corrections (as DeepSpeedCPUAdam and strata's optimizer.params do).
    amsgrad: only False (strata's Adam keeps no running maximum of the second moment).
    fp32_optimizer_states: only True (strata keeps the master weights and both moments in fp32).
    config: a dict, a JSON path or a strata.Config in the DeepSpeed vocabulary: the tiers
        (zero_optimization.offload_optimizer.device "cpu" | "nvme", nvme_path), aio, strata.host_budget_bytes,
        strata.delayed_update / delayed_warmup_steps, strata.cpu_threads ... (None: the host tier). Its optimizer
        section is replaced by the hyperparameters given here; precision and backend follow the parameters.
    delayed_update: None (the config decides), True or False.
    bucket_bytes: the size of the strata modules the parameters are packed (and large ones cut) into: the unit of
        each exchange with strata, and so of strata's device window on the GPU (about six buckets per group). CPU
        parameters never use the device window: they exchange with strata's stores directly and, where those are
        host memory (and without the delayed update), become views of them (see _adam_host.py).
    """

    def __init__(self, model_params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0,
                 amsgrad: bool = False, adamw_mode: bool = True, fp32_optimizer_states: bool = True, *,
                 config: ConfigSource = None, delayed_update: Optional[bool] = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        _check_deepspeed_flags(amsgrad, fp32_optimizer_states)
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < _MIN_BUCKET_BYTES:
            raise ValueError("OffloadAdam: bucket_bytes = %r must be an integer >= %d" %
                             (bucket_bytes, _MIN_BUCKET_BYTES))
        if delayed_update not in (None, True, False):
            raise ValueError("OffloadAdam: delayed_update = %r must be None (the config decides), True or False" %
                             (delayed_update,))
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adamw_mode=adamw_mode,
                        bias_correction=bias_correction)
        _check_hyperparameters(defaults, "OffloadAdam")
        # Set before torch's constructor, which calls add_param_group for each group.
        self._user_doc = _adam_config.user_document(config)
        self._delayed_update = delayed_update
        self._bucket_bytes = bucket_bytes
        self._engines: List[Optional[GroupEngine]] = []
        self._warned_missing_grad = False
        super().__init__(model_params, defaults)

    # ---------------------------------------------------------------- groups

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """torch's add_param_group, and the group's strata engine (built from the parameters' current values).
        Allowed at any time: a group added later starts its own step count, as torch's per-parameter state does."""
        if not isinstance(param_group, dict):
            raise TypeError("OffloadAdam: a param group must be a dict, not %s" % type(param_group).__name__)
        index = len(self.param_groups)
        label = "param group %d" % index
        if isinstance(param_group.get("params"), (list, tuple)):
            _check_unique(param_group["params"], label)  # before torch, which only warns
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            _check_unique(group["params"], label)  # what a generator gave
            _check_hyperparameters(group, "OffloadAdam: " + label)
            _check_params(group["params"], label)
            engine = self._build(group, label)
        except BaseException:
            self.param_groups.pop()  # a refused group leaves the optimizer as it was
            raise
        self._engines.append(engine)

    def _build(self, group: Dict[str, Any], label: str) -> Optional[GroupEngine]:
        if not group["params"]:
            return None  # an empty group (e.g. no biases) steps nothing
        return GroupEngine(group["params"], group, self._user_doc, self._bucket_bytes, self._delayed_update, label)

    # ---------------------------------------------------------------- the step

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """One Adam step of every group: gradients to strata, strata's CPU Adam at each group's current lr, weights
        back into the parameters. Returns closure's loss (closure is called with grad enabled)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = list(zip(self.param_groups, self._engines))
        for index, (group, engine) in enumerate(groups):
            self._check_step(group, engine, "param group %d" % index)  # everything, before any state moves
        for group, engine in groups:
            if engine is not None:
                engine.push_grads()
        for group, engine in groups:
            if engine is not None:
                engine.step(float(group["lr"]))
        for group, engine in groups:
            if engine is not None:
                engine.pull_weights()
        return loss

    def _check_step(self, group: Dict[str, Any], engine: Optional[GroupEngine], label: str) -> None:
        if engine is None:
            if group["params"]:
                raise ValueError("OffloadAdam: %s was empty when it was added and has parameters now; add them "
                                 "with add_param_group instead" % label)
            return
        engine.require_open()
        if len(group["params"]) != len(engine.params) or any(a is not b for a, b in zip(group["params"],
                                                                                        engine.params)):
            raise ValueError("OffloadAdam: the parameters of %s changed after it was added; strata's state belongs "
                             "to the tensors it was built from: add new tensors with add_param_group" % label)
        now = hyperparameters(group)
        for key, built in engine.hp.items():
            if now[key] != built:
                raise ValueError("OffloadAdam: %s: %s changed from %r to %r after the group was added; strata fixes "
                                 "it per group when the group is built (only the lr may change per step): add a "
                                 "new param group, or a new optimizer with load_state_dict" %
                                 (label, key, built, now[key]))
        _check_lr(group["lr"], "OffloadAdam: " + label)
        for i, p in enumerate(group["params"]):
            g = p.grad
            if g is None:
                if not self._warned_missing_grad:
                    warnings.warn("OffloadAdam: parameter %d of %s has no .grad; strata updates it with a zero "
                                  "gradient (its moments decay and weight decay applies), where torch's optimizers "
                                  "skip it (said once)" % (i, label), stacklevel=3)
                    self._warned_missing_grad = True
                continue
            where = "parameter %d of %s (shape %s)" % (i, label, list(p.shape))
            if g.is_sparse:
                raise RuntimeError("OffloadAdam does not support sparse gradients (%s); use a dense layer, e.g. "
                                   "nn.Embedding(..., sparse=False)" % where)
            if g.shape != p.shape or g.dtype != p.dtype or g.device != p.device:
                raise ValueError("OffloadAdam: the gradient of %s is %s %s on %s; it must be the parameter's shape, "
                                 "dtype (%s) and device (%s)" % (where, list(g.shape), g.dtype, g.device, p.dtype,
                                                                 p.device))

    def sync(self) -> None:
        """Lets a delayed update in flight finish, makes it visible and copies the weights into the parameters
        (before evaluating or exporting the model at the end of training). Harmless without the delayed update."""
        for engine in self._engines:
            if engine is not None:
                engine.require_open()
                engine.sync()

    def stats(self) -> List[Optional[Dict[str, Any]]]:
        """strata's counters per param group (strata_stats: steps, adam_ns, bytes moved between tiers, peaks ...);
        None for an empty group."""
        return [None if engine is None else engine.engine.stats() for engine in self._engines]

    def close(self) -> None:
        """Frees every strata engine (also done when the optimizer is garbage-collected)."""
        for engine in self._engines:
            if engine is not None:
                engine.close()

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError("OffloadAdam cannot be pickled or deep-copied (its state lives in strata): use state_dict()")

    # ---------------------------------------------------------------- state

    def state_dict(self) -> Dict[str, Any]:
        """torch's state_dict (hyperparameters, parameter indices) plus "strata": each group's strata checkpoint as
        {file name: bytes} (master weights, moments, step count, a pending delayed update). 'state' stays empty."""
        sd: Dict[str, Any] = super().state_dict()
        with tempfile.TemporaryDirectory(prefix="strata-offload-adam-") as tmp:
            sd["strata"] = self._save(tmp, keep_bytes=True)
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores a state_dict() of an OffloadAdam with the same groups and parameter shapes, bit-exactly, and sets
        the parameters to its weights. The groups' hyperparameters come from the state_dict, as in torch."""
        if not isinstance(state_dict, dict) or "param_groups" not in state_dict:
            raise ValueError("OffloadAdam.load_state_dict: expected a dict with 'param_groups', got %s" %
                             type(state_dict).__name__)
        saved = state_dict.get("strata")
        if saved is None:
            raise ValueError("OffloadAdam.load_state_dict: the state_dict has no 'strata' entry, so it was not "
                             "written by OffloadAdam.state_dict() (a torch.optim.Adam/AdamW state_dict cannot be "
                             "loaded into strata)")
        self._check_loadable(state_dict["param_groups"], saved, "OffloadAdam.load_state_dict")
        with tempfile.TemporaryDirectory(prefix="strata-offload-adam-") as tmp:
            for index, entry in enumerate(saved["groups"]):
                if entry.get("files"):
                    _write_files(os.path.join(tmp, "group%d" % index), entry["files"])
            self._restore(state_dict["param_groups"], saved, tmp)

    def save_checkpoint(self, directory: str) -> None:
        """Writes the optimizer state into directory (created if missing): one strata checkpoint per group, each
        streamed from its tier without gathering it in memory, and offload_adam.json with the param groups."""
        os.makedirs(directory, exist_ok=True)
        meta = self._save(directory, keep_bytes=False)
        meta["param_groups"] = [_jsonable(g) for g in super().state_dict()["param_groups"]]
        atomic_write(os.path.join(directory, _META_FILE), lambda f: f.write(json.dumps(meta, indent=1).encode()))

    def load_checkpoint(self, directory: str) -> None:
        """Restores what save_checkpoint wrote (same rules as load_state_dict)."""
        path = os.path.join(directory, _META_FILE)
        try:
            with open(path, encoding="utf-8") as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError("OffloadAdam.load_checkpoint: %s is missing: %s holds no OffloadAdam checkpoint "
                                    "(written by save_checkpoint)" % (path, directory)) from None
        self._check_loadable(meta["param_groups"], meta, "OffloadAdam.load_checkpoint")
        self._restore(meta["param_groups"], meta, directory)

    def _save(self, directory: str, keep_bytes: bool) -> Dict[str, Any]:
        groups: List[Dict[str, Any]] = []
        for index, engine in enumerate(self._engines):
            if engine is None:
                groups.append({"layout": {"precision": None, "shapes": [], "bucket_bytes": self._bucket_bytes}})
                continue
            engine.require_open()
            where = os.path.join(directory, "group%d" % index)
            engine.save(where)
            entry: Dict[str, Any] = {"layout": engine.layout()}
            if keep_bytes:
                entry["files"] = _read_files(where)
            groups.append(entry)
        return {"format": _FORMAT, "bucket_bytes": self._bucket_bytes, "groups": groups}

    def _check_loadable(self, saved_groups: List[Dict[str, Any]], saved: Dict[str, Any], who: str) -> None:
        """Every difference between the saved optimizer and this one, found before any state is touched."""
        if saved.get("format") != _FORMAT:
            raise ValueError("%s: format %r, this version reads format %d" % (who, saved.get("format"), _FORMAT))
        if len(saved_groups) != len(self.param_groups) or len(saved["groups"]) != len(self.param_groups):
            raise ValueError("%s: the saved optimizer has %d param groups, this one has %d" %
                             (who, len(saved_groups), len(self.param_groups)))
        for index, (group, saved_group, entry) in enumerate(zip(self.param_groups, saved_groups, saved["groups"])):
            label = "param group %d" % index
            if len(saved_group["params"]) != len(group["params"]):
                raise ValueError("%s: %s has %d parameters in the saved optimizer, %d here" %
                                 (who, label, len(saved_group["params"]), len(group["params"])))
            layout = entry["layout"]
            for i, (shape, p) in enumerate(zip(layout["shapes"], group["params"])):
                if list(shape) != list(p.shape):
                    raise ValueError("%s: parameter %d of %s has shape %s in the saved optimizer, %s here" %
                                     (who, i, label, list(shape), list(p.shape)))
            engine = self._engines[index]
            if engine is not None and layout["precision"] != engine.precision:
                raise ValueError("%s: %s was saved with %s parameters, these are %s; strata resumes in the same "
                                 "precision" % (who, label, layout["precision"], engine.precision))
            _check_hyperparameters(dict(saved_group, betas=tuple(saved_group["betas"])), "%s: saved %s" %
                                   (who, label))

    def _restore(self, saved_groups: List[Dict[str, Any]], saved: Dict[str, Any], directory: str) -> None:
        """Adopts the saved hyperparameters (rebuilding an engine whose fixed ones differ) and loads each group."""
        # strata refuses a pending delayed update into an engine without the delayed update; asking every group's
        # manifest first keeps a refusal from leaving some groups loaded and others not.
        for index, engine in enumerate(self._engines):
            if engine is not None and not engine.delayed:
                info = checkpoint.inspect(os.path.join(directory, "group%d" % index))
                if info["pending_update"]:
                    raise ConfigError("OffloadAdam: param group %d of the saved optimizer holds a delayed update not "
                                      "yet applied; resume it with the delayed update on (delayed_update=True or "
                                      "strata.delayed_update = true in the config)" % index)
        rebuild_all = saved["bucket_bytes"] != self._bucket_bytes
        self._bucket_bytes = saved["bucket_bytes"]
        for index, (group, saved_group) in enumerate(zip(self.param_groups, saved_groups)):
            adopted = {k: v for k, v in saved_group.items() if k != "params"}
            adopted["betas"] = tuple(adopted["betas"])
            adopted["params"] = group["params"]
            engine = self._engines[index]
            if engine is not None and (rebuild_all or hyperparameters(adopted) != engine.hp):
                fresh = self._build(adopted, "param group %d" % index)
                engine.close()
                self._engines[index] = engine = fresh
            if engine is not None:
                engine.load(os.path.join(directory, "group%d" % index))
            group.clear()
            group.update(adopted)  # the same dict object: schedulers holding it keep working


def _check_unique(params: Sequence[Any], label: str) -> None:
    if len(params) != len({id(p) for p in params}):
        raise ValueError("OffloadAdam: %s lists the same tensor twice; strata would keep two master copies of it "
                         "(pass each parameter once: model.parameters() already leaves out tied duplicates)" % label)


def _check_lr(lr: Any, who: str) -> None:
    value = lr.item() if isinstance(lr, torch.Tensor) else lr
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError("%s: lr = %r; it must be a finite number >= 0" % (who, lr))


def _check_hyperparameters(group: Dict[str, Any], who: str) -> None:
    eps, wd, betas = group["eps"], group["weight_decay"], group["betas"]
    _check_lr(group["lr"], who)
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError("%s: eps = %r; it must be a finite number > 0" % (who, eps))
    if not (isinstance(wd, (int, float)) and math.isfinite(wd) and wd >= 0):
        raise ValueError("%s: weight_decay = %r; it must be a finite number >= 0" % (who, wd))
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and
            all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas)):
        raise ValueError("%s: betas = %r; it must be two numbers in [0, 1)" % (who, betas))
    if not isinstance(group.get("bias_correction", True), bool):
        raise ValueError("%s: bias_correction = %r; it must be True or False" % (who, group["bias_correction"]))
    if not isinstance(group["adamw_mode"], bool):
        raise ValueError("%s: adamw_mode = %r; it must be True (AdamW) or False (Adam with L2 decay)" %
                         (who, group["adamw_mode"]))
    for key in ("amsgrad", "maximize"):
        if group.get(key):
            raise ValueError("%s: %s = True is not supported by strata's Adam" % (who, key))


def _check_deepspeed_flags(amsgrad: object, fp32_optimizer_states: object) -> None:
    """DeepSpeedCPUAdam's flags that strata's Adam cannot honour, refused with the reason."""
    if amsgrad is not False:
        raise ValueError("OffloadAdam: amsgrad = %r; strata's CPU Adam keeps no running maximum of the second moment, "
                         "so only amsgrad=False is supported (as DeepSpeedCPUAdam, which also refuses it)" % (amsgrad,))
    if fp32_optimizer_states is not True:
        raise ValueError("OffloadAdam: fp32_optimizer_states = %r; strata keeps the master weights and both moments "
                         "in fp32 whatever the parameters' dtype, so only True is supported (bf16 parameters already "
                         "get fp32 state)" % (fp32_optimizer_states,))


def _check_params(params: Iterable[torch.Tensor], label: str) -> None:
    first: Optional[Tuple[torch.dtype, torch.device]] = None
    for i, p in enumerate(params):
        where = "parameter %d of %s (shape %s)" % (i, label, list(p.shape))
        if p.is_sparse:
            raise TypeError("OffloadAdam: %s is a sparse tensor; strata keeps dense parameters" % where)
        if p.dtype not in _SUPPORTED_DTYPES:
            hint = (" strata's fp16 needs its own dynamic loss scaling, which a torch optimizer cannot drive: train "
                    "in bf16, or keep fp32 parameters under torch.autocast" if p.dtype == torch.float16 else "")
            raise TypeError("OffloadAdam: %s is %s; strata keeps fp32 master weights for torch.float32 or "
                            "torch.bfloat16 parameters.%s" % (where, p.dtype, hint))
        if p.device.type not in ("cpu", "cuda"):
            raise TypeError("OffloadAdam: %s is on %s; strata exchanges with CPU or CUDA tensors" % (where, p.device))
        if first is None:
            first = (p.dtype, p.device)
        elif (p.dtype, p.device) != first:
            raise TypeError("OffloadAdam: %s is %s on %s but parameter 0 of the group is %s on %s; a group is one "
                            "strata engine with one precision and device: put them in separate param groups" %
                            (where, p.dtype, p.device, first[0], first[1]))


def _read_files(directory: str) -> Dict[str, bytes]:
    out: Dict[str, bytes] = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise ValueError("OffloadAdam: strata's checkpoint %s holds a directory %s; this version stores flat "
                             "checkpoints only" % (directory, name))
        with open(path, "rb") as f:
            out[name] = f.read()
    return out


def _write_files(directory: str, files: Dict[str, bytes]) -> None:
    os.makedirs(directory)
    for name, data in files.items():
        if os.sep in name or name in ("", ".", ".."):
            raise ValueError("OffloadAdam.load_state_dict: the state_dict names a checkpoint file %r" % name)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def _jsonable(group: Dict[str, Any]) -> Dict[str, Any]:
    """A packed param group with the values JSON holds (a key of another type is left out of the file)."""
    out: Dict[str, Any] = {}
    for key, value in group.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out

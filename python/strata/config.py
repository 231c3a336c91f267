"""strata.Config: a configuration in the DeepSpeed vocabulary (plus a "strata" section), checked by the library.

The engine's keys go to libstrata, which checks every one and names the key, the value, what is allowed and a hint
(the same messages as `strata config check`). The keys that belong to the trainer, which libstrata refuses because
a C trainer owns them, are the Python engine's here: the batch-size triple, steps_per_print, the scheduler and
dataloader_drop_last (the loader initialize builds from training_data).
"""
from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Dict, Optional, Tuple, Union

from . import _lib
from ._typing import StrPath
from .errors import ConfigError, IOFailure, error_for

# What a Config is made from: a dict, the path of a JSON file, another Config, or None (the defaults).
ConfigSource = Union[None, Dict[str, Any], StrPath, "Config"]

# DeepSpeed keys the Python engine implements itself (libstrata leaves them to its trainer).
TRAINER_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "steps_per_print", "scheduler", "dataloader_drop_last")


# "auto" is transformers' placeholder, filled from TrainingArguments before DeepSpeed reads the file.
_AUTO_HINT = ("\"auto\" is filled in by transformers' Trainer from its TrainingArguments "
              "(strata.torch.hf.StrataTrainer and strata.torch.hf.fill_auto fill it the same way): elsewhere write "
              "the value")


def _positive_int(key: str, value: object) -> int:
    if value == "auto":
        raise ConfigError("config: %s = \"auto\" is not allowed here: it must be an integer >= 1; %s" %
                          (key, _AUTO_HINT))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError("config: %s = %r is not allowed: it must be an integer >= 1" % (key, value))
    return value


def read_document(source: ConfigSource) -> Tuple[str, Dict[str, Any]]:
    """(origin, the JSON object) of a config source (a dict comes back as a shallow copy): a dict, the path of a JSON file, a Config, or
    None (empty). Nothing is checked but the file and the JSON: "auto" values and the like may still be filled in.
    IOFailure when the file cannot be read, ConfigError when it is not a JSON object."""
    if isinstance(source, Config):
        origin = source.origin
        doc: object = json.loads(json.dumps(source.document))
    elif isinstance(source, (str, os.PathLike)):
        origin = os.fspath(source)
        try:
            with open(origin, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise IOFailure("config: cannot read %s: %s" % (origin, e.strerror or e)) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError("config: %s is not valid JSON: %s at line %d column %d" %
                              (origin, e.msg, e.lineno, e.colno)) from None
    elif source is None or isinstance(source, dict):
        origin = "<dict>"
        doc = dict(source or {})
    else:
        raise ConfigError("config: expected a dict, a JSON file path or a strata.Config, got %s" %
                          type(source).__name__)
    if not isinstance(doc, dict):
        raise ConfigError("config: %s must hold a JSON object at the top level, not %s" % (origin, type(doc).__name__))
    return origin, doc


class Config:
    """A checked configuration.

    source: a dict, the path of a JSON file, another Config, or None (the defaults).
    Raises ConfigError naming every wrong key (one per line), IOFailure when the file cannot be read.
    """

    def __init__(self, source: ConfigSource = None) -> None:
        self.origin, doc = read_document(source)
        self.document = doc
        self.trainer = {k: doc[k] for k in TRAINER_KEYS if k in doc}
        engine_doc = {k: v for k, v in doc.items() if k not in TRAINER_KEYS}
        self._check_trainer_keys()
        self._buf = self._load(engine_doc)
        self.resolved = self._resolve()

    # ---------------------------------------------------------------- the C side

    def _load(self, engine_doc: Dict[str, Any]) -> ctypes.Array[ctypes.c_char]:
        lib = _lib.load()
        try:
            text = json.dumps(engine_doc, default=_plain)
        except (TypeError, ValueError) as e:
            raise ConfigError("config: %s holds a value JSON cannot hold: %s" % (self.origin, e)) from None
        size: int = lib.strata_config_size()
        buf = ctypes.create_string_buffer(size)
        st = lib.strata_config_init_sized(buf, size)
        if st:
            raise error_for(st, lib.strata_last_error(None).decode())
        err = ctypes.create_string_buffer(16384)
        st = lib.strata_config_load_json_string(buf, text.encode(), self.origin.encode(), err, len(err))
        if st:
            raise error_for(st, err.value.decode(errors="replace").strip() or lib.strata_last_error(None).decode())
        return buf

    def _resolve(self) -> Dict[str, Any]:
        lib = _lib.load()
        needed = ctypes.c_size_t(0)
        lib.strata_config_to_json(self._buf, None, 0, ctypes.byref(needed))
        out = ctypes.create_string_buffer(needed.value)
        st = lib.strata_config_to_json(self._buf, out, len(out), None)
        if st:
            raise error_for(st, lib.strata_last_error(None).decode())
        resolved: Dict[str, Any] = json.loads(out.value.decode())
        return resolved

    @property
    def c_config(self) -> ctypes.Array[ctypes.c_char]:
        """The strata_config the library filled (a ctypes buffer to pass as `const strata_config *`)."""
        return self._buf

    # ---------------------------------------------------------------- the trainer's keys

    def _check_trainer_keys(self) -> None:
        t = self.trainer
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                    "steps_per_print"):
            if key in t:
                _positive_int(key, t[key])
        if "dataloader_drop_last" in t and not isinstance(t["dataloader_drop_last"], bool):
            raise ConfigError("config: dataloader_drop_last = %r must be true or false" % (t["dataloader_drop_last"],))
        if "scheduler" in t:
            s = t["scheduler"]
            if not isinstance(s, dict) or "type" not in s:
                raise ConfigError("config: scheduler must be an object with a \"type\" (and \"params\"), got %r; "
                                  "hint: {\"type\": \"WarmupLR\", \"params\": {...}}" % (s,))
            params = s.get("params")
            auto = sorted(k for k, v in params.items() if v == "auto") if isinstance(params, dict) else []
            if auto:
                raise ConfigError("config: scheduler.params.%s = \"auto\" is not allowed here: the scheduler needs "
                                  "numbers; %s" % (", scheduler.params.".join(auto), _AUTO_HINT))

    def batch_sizes(self, world_size: int) -> Tuple[Optional[int], Optional[int], int]:
        """(train_batch_size, micro_batch_per_rank, gradient_accumulation_steps) as DeepSpeed resolves them: any
        two give the third; each missing one with no way to derive it is None (accumulation defaults to 1).
        ConfigError when the three disagree with world_size."""
        t = self.trainer
        batch, micro, gas = (t.get("train_batch_size"), t.get("train_micro_batch_size_per_gpu"),
                             t.get("gradient_accumulation_steps"))
        if batch is not None and micro is not None and gas is None:
            gas, rem = divmod(batch, micro * world_size)
            if rem or gas == 0:
                raise ConfigError("config: train_batch_size = %d is not a multiple of train_micro_batch_size_per_gpu"
                                  " (%d) x world size (%d); hint: set gradient_accumulation_steps or fix the sizes" %
                                  (batch, micro, world_size))
        elif batch is not None and gas is not None and micro is None:
            micro, rem = divmod(batch, gas * world_size)
            if rem or micro == 0:
                raise ConfigError("config: train_batch_size = %d is not a multiple of gradient_accumulation_steps "
                                  "(%d) x world size (%d)" % (batch, gas, world_size))
        elif batch is not None and micro is None and gas is None:
            micro, rem = divmod(batch, world_size)  # DeepSpeed: no accumulation, the batch split over the ranks
            if rem or micro == 0:
                raise ConfigError("config: train_batch_size = %d is not a multiple of the world size (%d); hint: set "
                                  "train_micro_batch_size_per_gpu and gradient_accumulation_steps, or fix the size"
                                  % (batch, world_size))
        gas = gas or 1
        if batch is not None and micro is not None and batch != micro * gas * world_size:
            raise ConfigError("config: train_batch_size = %d but train_micro_batch_size_per_gpu x "
                              "gradient_accumulation_steps x world size = %d x %d x %d = %d; hint: drop one of the "
                              "three and strata derives it" % (batch, micro, gas, world_size, micro * gas * world_size))
        if batch is None and micro is not None:
            batch = micro * gas * world_size
        return batch, micro, gas

    def get(self, key: str, default: Any = None) -> Any:
        """A resolved value by its full path ("optimizer.params.lr"), or a trainer key's value."""
        if key in self.trainer:
            return self.trainer[key]
        return self.resolved.get(key, default)

    @property
    def param_dtype(self) -> str:
        """"fp32", "bf16" or "fp16": the device dtype of parameters and gradients."""
        r = self.resolved
        return "bf16" if r.get("bf16.enabled") else "fp16" if r.get("fp16.enabled") else "fp32"

    @property
    def lr(self) -> float:
        """The configured learning rate as written (a Python float; the resolved one is rounded to fp32)."""
        params = self.document.get("optimizer", {}).get("params", {})
        if isinstance(params, dict) and isinstance(params.get("lr"), (int, float)):
            return float(params["lr"])
        return float(self.resolved["optimizer.params.lr"])

    def __repr__(self) -> str:
        return "strata.Config(%s)" % self.origin


def _plain(value: Any) -> Any:
    """numpy / torch scalars and paths in a config dict, as JSON values."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError("%r (%s)" % (value, type(value).__name__))

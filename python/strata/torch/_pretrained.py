"""strata.torch.load_pretrained: a model's pretrained weights from safetensors files, in bounded memory.

    with accelerate.init_empty_weights():              # or: with strata.torch.zero_init(config):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained("dir"))
    summary = strata.torch.load_pretrained(model, "dir")   # model.safetensors, or the shards of its index
    engine, optimizer, _, _ = strata.torch.initialize(model=model, config=config)

A parameter on the meta device gets no values here: it gets a source over its bytes in the file, which initialize
reads chunk by chunk into strata's tiers, so that the weights pass through host memory a chunk at a time and never
sit there whole. A parameter with storage (a plain model, or one built under zero_init, whose tensors are on disk)
is overwritten in place, chunk by chunk, each staged chunk's pages given back as it goes. Either way a read holds
at most _safetensors.CHUNK_BYTES (16 MiB) of the file.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch
from torch import nn

from ..errors import CorruptError, InvalidArgument, IOFailure, NotFound, StateError, Unsupported
from . import _safetensors, _zero_init
from ._safetensors import DTYPES, FLOATS, Entry, FileTensor, read_header
from ._sources import attach, detach_source

_WHO = "strata.torch.load_pretrained"
_SINGLE, _INDEX = "model.safetensors", "model.safetensors.index.json"
_FEW = 4  # names a message lists


@dataclass
class _Target:
    """One tensor of the model to load: every name it has (a tied parameter has several), the modules that hold
    it, and the file tensor it matched."""

    names: List[str]
    tensor: torch.Tensor
    kind: str  # "parameter" or "buffer"
    holders: List[Tuple[nn.Module, str]] = field(default_factory=list)
    entry: Optional[Entry] = None


def load_pretrained(model: nn.Module, path: Union[str, "os.PathLike[str]"], *, strict: bool = True) -> Dict[str, Any]:
    """Loads model's parameters and persistent buffers from the safetensors checkpoint at path (module docstring).

    path: a .safetensors file; a directory holding model.safetensors or Hugging Face's sharded
    model.safetensors.index.json (whose weight_map names each tensor's shard); or that index file. Each of the model's
    tensors is looked up by its name, else with the model's base_model_prefix ("transformer.", "model.") added or
    removed, as transformers does (old GPT-2 checkpoints lack "transformer."); a tied parameter is found under any
    of its names. F32, F16, BF16 and F64 are converted to the parameter's dtype (fp32 for a meta parameter: strata's
    tiers). A meta model (accelerate's init_empty_weights, which breaks ties) has its ties restored first
    (model.tie_weights(), as from_pretrained does), and undone again if the load is refused.

    Every tensor is checked before any is written or given a source: a tensor missing from the files (strict=True;
    with strict=False it is left as it is and listed), a shape other than the model's, a dtype that does not convert,
    bytes past the end of a truncated file, a shard the index names that is not there, a malformed header: each
    raises (InvalidArgument, Unsupported, CorruptError, NotFound) naming the tensor and its file, and the model is as
    it was. An I/O error while the values are copied afterwards (the file changed under us) can leave the tensors
    before it loaded. Tensors of the files that match nothing are ignored and listed, as transformers does.

    A meta parameter stays on the meta device, carrying its source, until initialize reads it into strata's tiers:
    run before that, the model computes no numbers (torch refuses a CPU input against a meta weight, or gives meta
    outputs that have no values to print). A meta buffer gets a real tensor (buffers are small and loaded whole).

    Returns a summary: {"tensors", "parameters", "buffers", "sources" (meta parameters given a source), "bytes" (of
    the files), "files", "missing_keys", "unexpected_keys"}."""
    if not isinstance(model, nn.Module):
        raise InvalidArgument("%s: model must be a torch.nn.Module, got %s" % (_WHO, type(model).__name__))
    if getattr(model, "_strata_engine", None) is not None:
        raise StateError("%s: this model is trained by a strata engine, which holds its parameters; hint: load the "
                         "weights before strata.torch.initialize, or restore a run with engine.load_checkpoint"
                         % _WHO)
    where, files, entries = _checkpoint(os.fspath(path))
    held = [(mod, dict(mod._parameters)) for mod in model.modules()]  # what a refusal puts back
    try:
        targets, missing, unexpected = _plan(model, where, entries, strict)
    except BaseException:
        for mod, params in held:
            mod._parameters.clear()
            mod._parameters.update(params)
        raise
    loaded = [t for t in targets if t.entry is not None]
    sources = 0
    for t in loaded:
        assert t.entry is not None
        source = FileTensor(t.entry)
        if t.kind == "buffer":
            _load_buffer(t, source)
        elif t.tensor.is_meta:
            _give_source(t, source)
            sources += 1
        else:
            _copy(t.tensor, source)
    return {"tensors": len(loaded), "parameters": sum(t.kind == "parameter" for t in loaded),
            "buffers": sum(t.kind == "buffer" for t in loaded), "sources": sources,
            "bytes": sum(t.entry.nbytes for t in loaded if t.entry is not None), "files": files,
            "missing_keys": missing, "unexpected_keys": unexpected}


def _plan(model: nn.Module, where: str, entries: Dict[str, Entry],
          strict: bool) -> Tuple[List["_Target"], List[str], List[str]]:
    """The model's tensors, each matched to its file tensor and checked; (targets, missing, unexpected names)."""
    tie = getattr(model, "tie_weights", None)
    if callable(tie) and any(p.is_meta for p in model.parameters()):
        tie()  # accelerate's init_empty_weights re-registers each parameter, which unties shared ones
    targets = _targets(model)
    prefix = getattr(model, "base_model_prefix", "")
    used: Set[str] = set()
    missing = []
    for t in targets:
        found = [c for n in t.names for c in _candidates(n, prefix if isinstance(prefix, str) else "")
                 if c in entries]
        used.update(found)
        if found:
            t.entry = entries[found[0]]
            _check(t, t.entry)
        else:
            missing.append(t.names[0])
    unexpected = sorted(set(entries) - used)
    if missing and strict:
        hint = " (the files hold %s%s that match nothing)" % (", ".join(unexpected[:_FEW]), _more(unexpected)) \
            if unexpected else ""
        raise InvalidArgument("%s: %d tensor(s) of the model are not in %s: %s%s%s; hint: load the checkpoint of "
                              "this model's configuration, or pass strict=False to leave them as they are (the "
                              "summary lists them)" % (_WHO, len(missing), where, ", ".join(missing[:_FEW]),
                                                       _more(missing), hint))
    return targets, missing, unexpected


def _more(names: List[str]) -> str:
    return " and %d more" % (len(names) - _FEW) if len(names) > _FEW else ""


def _checkpoint(path: str) -> Tuple[str, List[str], Dict[str, Entry]]:
    """(what to call the checkpoint in messages, its files, its tensors by name) of path."""
    if os.path.isdir(path):
        single, index = os.path.join(path, _SINGLE), os.path.join(path, _INDEX)
        if os.path.isfile(single):
            return single, [single], read_header(single)
        if os.path.isfile(index):
            return _sharded(index)
        others = sorted(f for f in os.listdir(path) if f.endswith((".safetensors", ".bin", ".pt", ".pth")))
        raise NotFound("%s: directory %s holds neither %s nor %s%s; hint: save the model there with "
                       "save_pretrained (safetensors is its default), or pass the path of a .safetensors file"
                       % (_WHO, path, _SINGLE, _INDEX, " (it has %s)" % ", ".join(others[:_FEW]) if others else ""))
    if not os.path.exists(path):
        raise NotFound("%s: %s does not exist; hint: pass a .safetensors file, a %s, or a directory holding one"
                       % (_WHO, path, _INDEX))
    if path.endswith(".json"):
        return _sharded(path)
    return path, [path], read_header(path)


def _sharded(index: str) -> Tuple[str, List[str], Dict[str, Entry]]:
    """The tensors of the shards index's weight_map names, each checked to be in its shard's header."""
    try:
        with open(index, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise IOFailure("%s: cannot read %s: %s" % (_WHO, index, e.strerror or e)) from None
    except ValueError as e:
        raise CorruptError("%s: %s is not JSON (%s); hint: save the model again with save_pretrained"
                           % (_WHO, index, e)) from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise CorruptError("%s: %s has no \"weight_map\" of tensor name -> shard file name; hint: it is not a "
                           "sharded safetensors index (save_pretrained writes one)" % (_WHO, index))
    shards: Dict[str, List[str]] = {}
    for name, shard in weight_map.items():
        shards.setdefault(shard, []).append(name)
    entries: Dict[str, Entry] = {}
    files = []
    for shard, names in shards.items():
        shard_path = os.path.join(os.path.dirname(os.path.abspath(index)), shard)
        if not os.path.isfile(shard_path):
            raise NotFound("%s: shard %s, which %s names for %s%s, is missing; hint: download or copy every shard "
                           "the index names next to it" % (_WHO, shard_path, index, ", ".join(names[:_FEW]),
                                                           _more(names)))
        header = read_header(shard_path)
        files.append(shard_path)
        for name in names:
            if name not in header:
                raise CorruptError("%s: %s puts %s in %s, whose header does not hold it; hint: the index and its "
                                   "shards are of different saves: save the model again" % (_WHO, index, name,
                                                                                            shard_path))
            entries[name] = header[name]
    return index, files, entries


def _targets(model: nn.Module) -> List[_Target]:
    """The model's parameters and persistent buffers, each once with all its names, in module order."""
    out: Dict[int, _Target] = {}
    for prefix, mod in model.named_modules(remove_duplicate=False):
        dot = prefix + "." if prefix else ""
        items = [(k, t, "parameter") for k, t in mod._parameters.items()] + \
            [(k, t, "buffer") for k, t in mod._buffers.items() if k not in mod._non_persistent_buffers_set]
        for key, t, kind in items:
            if t is None:
                continue
            target = out.setdefault(id(t), _Target([], t, kind))
            if dot + key not in target.names:
                target.names.append(dot + key)
            if not any(m is mod and k == key for m, k in target.holders):
                target.holders.append((mod, key))
    return list(out.values())


def _candidates(name: str, prefix: str) -> List[str]:
    """The names a checkpoint may give the model's tensor name: its own, then with the base model's prefix removed
    or added."""
    if not prefix:
        return [name]
    if name.startswith(prefix + "."):
        return [name, name[len(prefix) + 1:]]
    return [name, prefix + "." + name]


def _check(t: _Target, e: Entry) -> None:
    """Refuses e for t: its shape, its dtype, its bytes."""
    what = "the model's %s %s" % (t.kind, t.names[0])
    if tuple(e.shape) != tuple(t.tensor.shape):
        raise InvalidArgument("%s: %s in %s has shape %s, but %s has shape %s; hint: the checkpoint is of another "
                              "configuration (hidden size, vocabulary, heads): build the model from the checkpoint's "
                              "config.json" % (_WHO, e.name, e.path, list(e.shape), what, list(t.tensor.shape)))
    want = t.tensor.dtype
    allowed: Tuple[str, ...] = FLOATS if want.is_floating_point else tuple(k for k, v in DTYPES.items() if v == want)
    if e.dtype not in allowed:
        kind = "is %s, which strata does not read" % e.dtype if e.dtype not in DTYPES else "is %s" % e.dtype
        raise Unsupported("%s: %s in %s %s, but %s is %s, which is read from %s only; hint: convert the checkpoint "
                          "(load it with transformers and save_pretrained in the model's dtype)"
                          % (_WHO, e.name, e.path, kind, what, str(want).replace("torch.", ""),
                             ", ".join(allowed) or "no safetensors dtype"))
    if e.truncated():
        raise CorruptError("%s: %s in %s lies in bytes [%d, %d), but the file has %d bytes: it is truncated; hint: "
                           "download or save it again" % (_WHO, e.name, e.path, e.start, e.start + e.nbytes,
                                                          e.file_bytes))


def _give_source(t: _Target, source: FileTensor) -> None:
    """t's meta parameter is read from source when initialize registers it (_sources.stand_ins)."""
    attach(t.tensor, source)


def _copy(p: torch.Tensor, source: FileTensor) -> None:
    """source's values into p, in its dtype, a chunk at a time; the pages of a zero_init tensor go back after each."""
    step = max(1, _safetensors.CHUNK_BYTES // max(source.itemsize, p.element_size()))
    with torch.no_grad():
        if not p.is_contiguous():  # no flat view to write chunks into: the one tensor read whole
            whole = torch.empty(p.shape, dtype=p.dtype)
            source.read_into(0, p.numel(), whole.view(-1))
            p.copy_(whole)
        else:
            flat = p.detach().view(-1)
            for offset in range(0, p.numel(), step):
                n = min(step, p.numel() - offset)
                source.read_into(offset, n, flat[offset:offset + n])
                _zero_init.drop_pages(p)
    detach_source(p)  # its values are its own now, not those of an earlier source


def _load_buffer(t: _Target, source: FileTensor) -> None:
    b = t.tensor
    whole = torch.empty(b.shape, dtype=b.dtype, device="cpu" if b.is_meta else b.device)
    source.read_into(0, b.numel(), whole.view(-1))
    if b.is_meta:
        for mod, key in t.holders:
            mod._buffers[key] = whole
        t.tensor = whole
    else:
        with torch.no_grad():
            b.copy_(whole)

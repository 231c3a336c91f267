"""A PyTorch model cut into strata modules ("units"), and the tensors in a module's output.

A unit is each element of an nn.ModuleList / nn.Sequential (a transformer block, say) with everything under it, and
every other module with parameters of its own (an embedding, a final LayerNorm). A module marked _strata_own_unit
(a tile of strata.torch.TiledLinear) is a unit wherever it sits, carved out of the element around it: the point of
a tile is to be fetched alone. Units that share a parameter
(GPT's tied embedding and head) are merged into one: strata keeps each parameter in one module. A unit holds every
parameter under it, trained and frozen alike (a LoRA block's adapters and its base weights): the frozen ones go into
a frozen strata module of the unit (strata_module_freeze), fetched with the rest, without gradients or optimizer
state.
"""
from __future__ import annotations

import hashlib
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch
import torch.nn as nn

# rebuild(tensors): the output again, with these tensors in place of the ones tensors_in found.
Rebuild = Callable[[Sequence[torch.Tensor]], Any]

_NAME_BYTES = 127  # strata's limit on module and parameter names


def short_name(name: str) -> str:
    if len(name.encode()) <= _NAME_BYTES:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return name.encode()[:_NAME_BYTES - 13].decode(errors="ignore") + "~" + digest


class InputToken:
    """Stands for one input of a unit's forward that requires grad, while the graph of that forward lives (see
    Unit.armed)."""

    __slots__ = ("__weakref__",)


class Unit:
    """The torch modules strata fetches together, their parameters and the strata modules that hold them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.modules: List[nn.Module] = []                  # torch modules whose hooks fetch this unit
        self.params: List[Tuple[str, nn.Parameter]] = []    # (qualified name, nn.Parameter)
        self.trained: List[bool] = []  # per parameter: trained (gradient, optimizer state), else frozen
        self.mids: List[int] = []   # its strata modules (see engine._name_groups), the frozen ones last
        self.trained_mids: List[int] = []  # those that take gradients (strata_grads_ready)
        self.pids: List[int] = []
        self.fwd_holds = 0
        self.in_backward = False
        self.pending: Set[int] = set()  # indexes into params of trained ones still waiting for their gradient
        # A unit with frozen parameters needs them in backward after its last trained gradient (a frozen layer
        # passes the gradient on to the unit's input), so it is done only when the gradient of each input it was
        # given in forward has passed out of it too: armed holds a token per such input while its graph lives,
        # waiting those backward has still to pass.
        self.armed: "weakref.WeakSet[InputToken]" = weakref.WeakSet()
        self.waiting: Set[InputToken] = set()
        self.lent: List[Tuple[str, Callable[[], Optional[object]]]] = []  # (name, alive) while fetched

    @property
    def has_frozen(self) -> bool:
        return len(self.trained_mids) != len(self.mids)

    def trained_params(self) -> List[Tuple[str, nn.Parameter]]:
        return [qp for qp, t in zip(self.params, self.trained) if t]

    def frozen_params(self) -> List[Tuple[str, nn.Parameter]]:
        return [qp for qp, t in zip(self.params, self.trained) if not t]


def common_prefix(names: Sequence[str]) -> str:
    """The dotted prefix every name shares, short of the last component ("a.b" for "a.b.w" and "a.b.c.w")."""
    parts = [n.split(".")[:-1] for n in names]
    out: List[str] = []
    for level in zip(*parts):
        if any(x != level[0] for x in level):
            break
        out.append(level[0])
    return ".".join(out)


def find_units(model: nn.Module, trainable: Optional[Set[int]] = None) -> List[Unit]:
    """The units of model, in module order, with tied units merged, holding every parameter. A parameter is trained
    when it requires grad and (trainable given: the ids of DeepSpeed's model_parameters) is in trainable, as
    DeepSpeed's ZeRO optimizers take of their param groups only what requires grad; every other one is frozen."""
    groups: List[Tuple[str, nn.Module, bool]] = []  # (name, module, recurse)

    def has_params(mod: nn.Module, recurse: bool) -> bool:
        return any(True for _ in mod.parameters(recurse=recurse))

    def own_units(mod: nn.Module, prefix: str) -> None:
        """The modules under mod that are units wherever they sit (TiledLinear's tiles), after mod's own group."""
        for name, sub in mod.named_modules(prefix=prefix.rstrip(".")):
            if sub is not mod and getattr(sub, "_strata_own_unit", False) and has_params(sub, True):
                groups.append((name, sub, True))

    def walk(mod: nn.Module, prefix: str) -> None:
        if isinstance(mod, (nn.ModuleList, nn.Sequential)):
            for name, child in mod.named_children():
                if has_params(child, True):
                    groups.append((prefix + name, child, True))
                    own_units(child, prefix + name + ".")
            return
        if has_params(mod, False):
            groups.append((prefix.rstrip(".") or "root", mod, False))
        for name, child in mod.named_children():
            walk(child, prefix + name + ".")

    walk(model, "")
    names = {id(p): n for n, p in model.named_parameters()}  # the first name of a shared parameter
    units: List[Unit] = []
    owner: Dict[int, Unit] = {}
    carved = {id(p) for _, mod, _ in groups if getattr(mod, "_strata_own_unit", False) for p in mod.parameters()}
    for name, mod, recurse in groups:
        own = getattr(mod, "_strata_own_unit", False)
        params = [p for p in mod.parameters(recurse=recurse) if own or id(p) not in carved]
        shared = {owner[id(p)] for p in params if id(p) in owner}
        if shared:  # merge into the first unit it shares with (and with any other it shares with)
            unit = min(shared, key=units.index)
            for other in shared - {unit}:
                unit.name += "+" + other.name
                unit.modules += other.modules
                for (q, p), t in zip(other.params, other.trained):
                    unit.params.append((q, p))
                    unit.trained.append(t)
                    owner[id(p)] = unit
                units.remove(other)
            unit.name += "+" + name
        else:
            unit = Unit(name)
            units.append(unit)
        unit.modules.append(mod)
        for p in params:
            if id(p) not in owner:
                owner[id(p)] = unit
                unit.params.append((names[id(p)], p))
                unit.trained.append(p.requires_grad and (trainable is None or id(p) in trainable))
    return [u for u in units if u.params]


def tensors_in(output: Any) -> Tuple[Rebuild, List[torch.Tensor]]:
    """(rebuild, tensors) for an output: a tensor, or tuples / lists / dicts of them."""
    if isinstance(output, torch.Tensor):
        return (lambda ts: ts[0]), [output]
    if isinstance(output, (tuple, list)) and not hasattr(output, "_fields"):
        parts = [tensors_in(o) for o in output]
        counts = [len(ts) for _, ts in parts]
        flat = [t for _, ts in parts for t in ts]

        def rebuild(ts: Sequence[torch.Tensor]) -> Any:
            out: List[Any] = []
            i = 0
            for (rb, _), n in zip(parts, counts):
                out.append(rb(ts[i:i + n]) if n else output[len(out)])
                i += n
            return type(output)(out)
        return rebuild, flat
    if isinstance(output, dict):
        keys = list(output)
        parts = [tensors_in(output[k]) for k in keys]
        counts = [len(ts) for _, ts in parts]
        flat = [t for _, ts in parts for t in ts]

        def rebuild_dict(ts: Sequence[torch.Tensor]) -> Any:
            out: Dict[Any, Any] = {}
            i = 0
            for k, (rb, _), n in zip(keys, parts, counts):
                out[k] = rb(ts[i:i + n]) if n else output[k]
                i += n
            return type(output)(out) if type(output) is not dict else out
        return rebuild_dict, flat
    return (lambda ts: output), []

"""strata.torch.TiledLinear: a linear layer too large to hold at once, computed tile by tile with nn.Linear's bits.

    head = strata.torch.TiledLinear(4096, 128256, bias=False, in_splits=4, out_splits=8)  # DeepSpeed's arguments

The weight (out x in) is a grid of out_splits x in_splits tiles, linears[o][i].weight as DeepSpeed names them, and
each tile is a strata module of its own (_units.py carves it out of the unit around it): under strata.torch it is
fetched, used and released in turn, so the layer needs one panel of tiles on the device, not the whole weight.

Splitting a product's reduction into tiles and summing the pieces rounds differently from the untiled product
(DeepSpeed's TiledLinear adds its in_splits partial outputs, so it is close to nn.Linear, not equal). Here every
product keeps its reduction whole and only its free axes are split, each pass reading the panel it needs:

    output       y[:, o]   = x @ W[o, :]^T + b[o]     a row panel: tiles (o, 0 .. in_splits - 1)
    input grad   dx[:, i]  = dy @ W[:, i]             a column panel: tiles (0 .. out_splits - 1, i)
    weight grad  dW[o, i]  = dy[:, o]^T @ x[:, i]     one tile, in the same pass
    bias grad    db        = dy.sum(0)                the bias is whole (it is small), the layer's own

These are the very products autograd runs for nn.Linear on an input flattened to rows (addmm, and mm for its
gradients, in the layouts torch picks), with fewer rows or columns; a matrix library computes an output element in
the same order whatever the extent of the other axes, so the bits are nn.Linear's. Not every library does:
OpenBLAS (Debian's torch) adds a block's last columns in another order, and MKL (PyTorch's own wheels) picks its
kernel by the product's shape (torch 2.15's MKL gives a 128-column panel of a 256 x 1024 x 1024 product other bits),
unless it runs in Intel's strict reproducibility mode (MKL_CBWR=AUTO,STRICT set before torch starts, at no cost in
speed here: 312 against 302 GFLOP/s), where it does. exact_products probes the library once per device type, and
a layer on one that fails the probe warns as it is made, naming that setting where the library is MKL, and says so
in its .exact: its tiles match nn.Linear within rounding only (tests/py_tiled_linear.py checks the bits against
nn.Linear where the probe passes and the closeness where it does not). Each tile is read twice a step (forward and
backward), as an untiled weight is; the panel a pass holds is out/out_splits x in forward and out x in/in_splits in
backward, so bounding both needs both splits.

The initial values are nn.Linear's for the same seed (its kaiming-uniform bound, drawn row panel by row panel in
the order nn.Linear draws the whole weight, then the bias): the generator of the CPU, which draws element after
element. copy_params_from(linear) takes another layer's values instead.
"""
from __future__ import annotations

import math
import re
import warnings
from typing import Any, Dict, List, Optional, Tuple, cast

import torch
import torch.nn as nn

from ..errors import InvalidArgument, Unsupported

_WHO = "strata.torch.TiledLinear"


def _bounds(n: int, splits: int) -> List[Tuple[int, int]]:
    """[start, end) of each of splits parts of n, as torch.tensor_split cuts them (the first n % splits one longer)."""
    base, extra = divmod(n, splits)
    out, at = [], 0
    for k in range(splits):
        size = base + (1 if k < extra else 0)
        out.append((at, at + size))
        at += size
    return out


_EXACT: Dict[str, bool] = {}  # device type -> exact_products' verdict

# (rows, inner, columns, first column, end column) of products whose panels OpenBLAS computes differently
_PROBES = ((64, 64, 96, 0, 32), (40, 257, 131, 27, 53), (256, 1024, 1024, 0, 128))


def exact_products(device: torch.device) -> bool:
    """Whether torch's matrix products on device give the columns of a panel the bits of the same columns of the
    whole product, in each layout the tiles use (probed once per device type on fresh values)."""
    if device.type not in _EXACT:
        g = torch.Generator().manual_seed(0x5eed)
        ok = True
        for m, k, n, lo, hi in _PROBES:
            x = torch.randn(m, k, generator=g).to(device)
            w = torch.randn(n, k, generator=g).to(device)
            dy = torch.randn(m, n, generator=g).to(device)
            ok = ok and torch.equal(torch.mm(x, w.t())[:, lo:hi], torch.mm(x, w[lo:hi].t()))
            ok = ok and torch.equal(torch.mm(dy, w[:, :k // 2].contiguous()), torch.mm(dy, w)[:, :k // 2])
            ok = ok and torch.equal(dy[:, lo:hi].t().mm(x), dy.t().mm(x)[lo:hi])
        _EXACT[device.type] = ok
    return _EXACT[device.type]


class _Tile(nn.Module):
    """One tile of the weight. Calling it lends its weight (strata fetches it for the call, a unit of its own)."""

    _strata_own_unit = True  # _units.find_units: a unit wherever it sits in the model

    def __init__(self, rows: int, cols: int, device: Any, dtype: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(rows, cols, device=device, dtype=dtype))

    def forward(self) -> torch.Tensor:
        return self.weight


class _Tiled(torch.autograd.Function):
    """The products of the table above, on x flattened to rows; the tiles' gradients go in through their own graphs
    (a tile called with grad enabled inside backward, as a reentrant checkpoint's recompute)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bias: Optional[torch.Tensor], layer: "TiledLinear") -> torch.Tensor:
        ctx.layer = layer
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x)
        rows = x.reshape(-1, layer.in_features)
        outs = []
        for o, (lo, hi) in enumerate(layer.out_bounds):
            panel = torch.cat([t().detach() for t in layer.linears[o]], dim=1)
            outs.append(torch.addmm(bias[lo:hi], rows, panel.t()) if bias is not None else torch.mm(rows, panel.t()))
        return cast(torch.Tensor, torch.cat(outs, dim=1).view(*x.shape[:-1], layer.out_features))

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], None]:
        layer: TiledLinear = ctx.layer
        (x,) = ctx.saved_tensors
        rows = x.reshape(-1, layer.in_features)
        grads = dy.reshape(-1, layer.out_features)
        dx = torch.empty_like(rows) if ctx.needs_input_grad[0] else None
        for i, (lo, hi) in enumerate(layer.in_bounds):
            panel = []
            for o, (olo, ohi) in enumerate(layer.out_bounds):
                tile = layer.linears[o][i]
                with torch.enable_grad():
                    w = tile()
                panel.append(w.detach())
                if w.requires_grad:
                    torch.autograd.backward(w, grads[:, olo:ohi].t().mm(rows[:, lo:hi]))
            if dx is not None:
                dx[:, lo:hi] = grads.mm(torch.cat(panel, dim=0))
        db = grads.sum(0) if ctx.has_bias and ctx.needs_input_grad[1] else None
        return (dx.view(x.shape) if dx is not None else None), db, None


def _blas_name(device: torch.device) -> str:
    if device.type != "cpu":
        return "its %s matrix library" % device.type
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return "BLAS_INFO=" + found.group(1) if found else "its matrix library"


def _exact_hint(device: torch.device) -> str:
    if device.type == "cpu" and "BLAS_INFO=mkl" in torch.__config__.show():
        return ("MKL_CBWR=AUTO,STRICT set before torch starts (Intel's strict reproducibility mode) gives the tiles "
                "nn.Linear's bits")
    return ("the tiles keep nn.Linear's bits where the matrix library passes strata.torch._tiled_linear."
            "exact_products; the difference here is rounding only")


class TiledLinear(nn.Module):
    """y = x W^T + b as nn.Linear(in_features, out_features, bias) computes it, bit for bit, with W held as
    out_splits x in_splits tiles (see the module's text). DeepSpeed's arguments; what strata's tiles cannot be is
    refused: input_is_already_split (the input is one tensor), combine_out_splits=False (the output is one tensor),
    a linear_cls other than nn.Linear (the products are nn.Linear's)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, in_splits: int = 1,
                 out_splits: int = 1, input_is_already_split: bool = False, combine_out_splits: bool = True,
                 linear_cls: Any = nn.Linear, init_linear: Optional[nn.Module] = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(n, int) or n < 1:
                raise InvalidArgument("%s: %s must be a positive int, got %r" % (_WHO, name, n))
        for name, k, n in (("in_splits", in_splits, in_features), ("out_splits", out_splits, out_features)):
            if not isinstance(k, int) or not 1 <= k <= n:
                raise InvalidArgument("%s: %s must be an int from 1 to %d (the features it splits), got %r; hint: "
                                      "split so each tile fits the device budget" % (_WHO, name, n, k))
        if input_is_already_split or not combine_out_splits:
            raise Unsupported("%s: input_is_already_split=True and combine_out_splits=False are DeepSpeed's ways to "
                              "pass tiles of the input and output between layers; strata's tiles are of the weight "
                              "only, and the input and output are whole tensors; hint: drop them" % _WHO)
        if linear_cls is not nn.Linear:
            raise Unsupported("%s: linear_cls=%s: strata's tiles compute nn.Linear's products (that is how they keep "
                              "its bits); hint: drop linear_cls" % (_WHO, getattr(linear_cls, "__name__", linear_cls)))
        self.in_features, self.out_features = in_features, out_features
        self.in_splits, self.out_splits = in_splits, out_splits
        self.in_bounds, self.out_bounds = _bounds(in_features, in_splits), _bounds(out_features, out_splits)
        self.linears = nn.ModuleList(
            nn.ModuleList(_Tile(ohi - olo, ihi - ilo, device, dtype) for ilo, ihi in self.in_bounds)
            for olo, ohi in self.out_bounds)
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        w = self.linears[0][0].weight
        self.exact: Optional[bool] = None if w.is_meta else exact_products(w.device)  # None: not known on meta
        if self.exact is False and (in_splits > 1 or out_splits > 1):
            warnings.warn("%s: this torch's matrix products on %s (%s) compute a panel's columns in another order "
                          "than the whole product's, so the tiles match nn.Linear within rounding, not bit for bit; "
                          "hint: %s" % (_WHO, w.device.type, _blas_name(w.device), _exact_hint(w.device)), stacklevel=2)
        if init_linear is not None:
            self.copy_params_from(init_linear)
        else:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initial values for the generator's state (kaiming-uniform with a = sqrt(5), then the bias),
        one row panel at a time."""
        w = self.linears[0][0].weight
        if w.is_meta:
            return
        gain = nn.init.calculate_gain("leaky_relu", math.sqrt(5))
        bound = math.sqrt(3.0) * (gain / math.sqrt(self.in_features))
        with torch.no_grad():
            for o, (lo, hi) in enumerate(self.out_bounds):
                panel = torch.empty(hi - lo, self.in_features, device=w.device, dtype=w.dtype).uniform_(-bound, bound)
                for i, (ilo, ihi) in enumerate(self.in_bounds):
                    self.linears[o][i].weight.copy_(panel[:, ilo:ihi])
            if self.bias is not None:
                b = 1 / math.sqrt(self.in_features)
                self.bias.uniform_(-b, b)

    def copy_params_from(self, other: nn.Module) -> None:
        """The weight (and bias) of other, an nn.Linear of the same shape (DeepSpeed's name for it)."""
        weight = getattr(other, "weight", None)
        if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (self.out_features, self.in_features):
            raise InvalidArgument("%s.copy_params_from: want a layer with a weight of shape [%d, %d], got %s" % (
                _WHO, self.out_features, self.in_features,
                list(weight.shape) if isinstance(weight, torch.Tensor) else type(other).__name__))
        bias = getattr(other, "bias", None)
        if (bias is None) != (self.bias is None):
            raise InvalidArgument("%s.copy_params_from: this layer %s a bias and the other %s" % (
                _WHO, "has" if self.bias is not None else "has no", "has none" if bias is None else "has one"))
        with torch.no_grad():
            for o, (olo, ohi) in enumerate(self.out_bounds):
                for i, (ilo, ihi) in enumerate(self.in_bounds):
                    self.linears[o][i].weight.copy_(weight[olo:ohi, ilo:ihi])
            if self.bias is not None and bias is not None:
                self.bias.copy_(bias)

    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        if input_.shape[-1:] != (self.in_features,):
            raise InvalidArgument("%s: the input's last dimension is %s, the layer takes %d features" % (
                _WHO, input_.shape[-1] if input_.dim() else "missing (a scalar)", self.in_features))
        return cast(torch.Tensor, _Tiled.apply(input_, self.bias, self))

    def extra_repr(self) -> str:
        return "in_features=%d, out_features=%d, bias=%s, in_splits=%d, out_splits=%d" % (
            self.in_features, self.out_features, self.bias is not None, self.in_splits, self.out_splits)

"""Linear layers with oneDNN-prepacked weights for fp32 CPU inference, ``F.linear`` everywhere else.

Decode on CPU is memory-bound and torch's default fp32 GEMM (MKL) is slow for a few rows;
oneDNN with the weight reordered once into its blocked layout is much faster for 2-17 rows
(reference/feasibility.md §4). The ops are private (``torch.ops.mkldnn._reorder_linear_weight``
/ ``_linear_pointwise``), so their use is guarded and falls back to ``F.linear``.

``LinearGroup`` runs several projections of the same input (q/k/v, gate/up) as one GEMM over
their concatenated weights: fewer calls and bigger GEMMs, bitwise the same outputs.

Row invariance (``row_invariant``, default on): a token's output must not depend on how many
rows share the GEMM, or a K+1 token verify would not reproduce 1-token decodes and greedy
speculative output could drift from greedy autoregressive output. Every CPU library measured
(oneDNN, MKL) rounds a single row differently from several rows, while oneDNN agrees bit for
bit across all M >= 2 (every SmolLM2 shape). A few rows (1-2, or 1-16 with AVX-512) therefore go
to ``row_gemv``, a kernel in oneDNN's own rounding order (probed bit for bit per shape; within ~3%
of MKL's GEMV for one row, and with AVX-512 a K+1 token verify costs about what a decode does).
Where the probe finds no match, a single row is padded to ``MIN_ROWS`` rows for oneDNN (~1.2x
slower), or with ``row_invariant = False`` takes ``F.linear`` (results then differ from multi-row
ones by fp32 rounding only - fine for drafters, whose outputs are never compared across batch
shapes).

Memory: the oneDNN copy and, once a few-row call happens, the kernel's copy come on top of the
parameters (3x the fp32 weights for a model that decodes on CPU).

Packed copies are rebuilt whenever a weight is replaced or changed in place (``Tensor._version``),
so drafters can train these modules; with autograd active the plain ``F.linear`` path runs.
Copies (``copy.deepcopy``) and pickles drop the packed cache; it is rebuilt on first use.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

#: Rows a oneDNN call is padded to, so that 1-row calls round like multi-row ones.
MIN_ROWS = 2
#: Batch-size hint for the weight reorder (selects the blocked layout; any M is supported).
PACK_BATCH_HINT = 8
#: Calls of 1 to ``row_gemv.MAX_ROWS`` rows take the ``row_gemv`` kernel where its probe matched (benchmarks
#: switch it off to time the alternatives). It is built on the first such call (a copy of the weight), so
#: prefill-only uses never hold it.
USE_ROW_KERNEL = True


def onednn_available() -> bool:
    """Whether the private oneDNN linear ops exist in this torch build."""
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


_ONEDNN = onednn_available()


class Linear(nn.Module):
    """``y = x @ weight.T + bias``: x [..., in_features] -> [..., out_features].

    Parameters are allocated uninitialised (loading fills them); initialise them yourself
    for a freshly trained module.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        self._packed = _PackedWeights([self])
        self.row_invariant = True

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._packed.get(x, self.row_invariant)
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        return packed(x)


class SharedLinear:
    """``x @ weight.T`` for a weight owned elsewhere (a target's LM head used by a drafter), through ``Linear``'s
    row-invariant path: a row's output does not depend on the other rows. Not a module (it owns no weight);
    the packed copy is rebuilt when another weight is passed."""

    def __init__(self) -> None:
        self.weight: torch.Tensor | None = None
        self.bias = None
        self._packed = _PackedWeights([self])

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [..., in], weight [out, in] -> [..., out]."""
        self.weight = weight
        packed = self._packed.get(x, row_invariant=True)
        return F.linear(x, weight) if packed is None else packed(x)


class LinearGroup:
    """Several ``Linear`` modules applied to the same input, as one GEMM when oneDNN applies.

    Not a module: it only references modules registered elsewhere (keeping HF parameter names);
    the first linear's ``row_invariant`` applies to the group.
    """

    def __init__(self, *linears: Linear) -> None:
        if len({lin.in_features for lin in linears}) != 1 or len({lin.bias is None for lin in linears}) != 1:
            raise ValueError("grouped linears need the same input size and all or none with a bias")
        self.sizes = [lin.out_features for lin in linears]
        self._packed = _PackedWeights(list(linears))
        self._linears = linears

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [..., in] -> one output [..., out_i] per linear (views into one buffer on the fast path)."""
        packed = self._packed.get(x, self._linears[0].row_invariant)
        if packed is None:
            return [lin(x) for lin in self._linears]
        return list(packed(x).split(self.sizes, dim=-1))


class _PackedWeights:
    """The packed forms of some linears' concatenated weights (a ``_Packed``), built on first use.

    Rebuilt when any source parameter is replaced or modified in place (``Tensor._version``).
    """

    def __init__(self, linears: Sequence[Linear]) -> None:
        self._linears = list(linears)
        self._sources: list[torch.Tensor] = []  # the parameters the cached value was built from
        self._versions: list[int] = []
        self._value: _Packed | None = None
        self._failed = False

    def __getstate__(self) -> dict[str, object]:
        """Copies and pickles drop the cache: oneDNN's opaque tensors cannot be copied."""
        return {**self.__dict__, "_sources": [], "_versions": [], "_value": None}

    def get(self, x: torch.Tensor, row_invariant: bool) -> _Packed | None:
        """The packed weights if they apply to ``x``, else None (use ``F.linear``)."""
        # the weights, then the biases: read every call (a module's parameter may have been replaced)
        params = [lin.weight for lin in self._linears] + [lin.bias for lin in self._linears if lin.bias is not None]
        if (
            not _ONEDNN
            or self._failed
            or not x.is_cpu
            or x.dtype != torch.float32
            or params[0].dtype != torch.float32
            or x.numel() == 0
            or (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)))
        ):
            return None
        # inference tensors have no version counter (and cannot be updated outside inference mode)
        versions = [-1 if p.is_inference() else p._version for p in params]
        same = len(params) == len(self._sources) and all(p is q for p, q in zip(params, self._sources))
        if not same or versions != self._versions:
            try:
                self._value = _Packed(self._linears)
            except RuntimeError as err:  # private op: a build may lack the kernel
                log.warning("oneDNN weight prepacking failed (%s); using F.linear", err)
                self._failed = True
                return None
            self._sources, self._versions = params, versions
        single_row = x.numel() == x.shape[-1]
        if single_row and not row_invariant and self._value.row_kernel() is None:
            return None  # MKL's GEMV beats a padded oneDNN call
        return self._value


class _Packed:
    """oneDNN's reordered weight, and for a few rows the ``row_gemv`` kernel where it applies (else oneDNN, padded)."""

    def __init__(self, linears: Sequence[Linear]) -> None:
        self._linears = linears
        self.weight = torch.ops.mkldnn._reorder_linear_weight(self._cat_weight(), PACK_BATCH_HINT)
        biases = [lin.bias.detach() for lin in linears if lin.bias is not None]
        self.bias = torch.cat(biases) if biases else None
        self._row: object = _UNBUILT  # RowGemv | None, probed on first use
        self._row_max = 0  # up to this many rows ``_row`` is the answer (0 until probed)

    def _cat_weight(self) -> torch.Tensor:
        weights = [lin.weight.detach() for lin in self._linears]
        return torch.cat(weights) if len(weights) > 1 else weights[0]

    def row_kernel(self, rows: int = 1):
        """The ``RowGemv`` for a call of ``rows`` rows, or None: too many rows, numba missing, or its probe
        found no bitwise match."""
        module = row_gemv_module() if USE_ROW_KERNEL else None
        if module is None or rows > module.MAX_ROWS:
            return None
        if self._row is _UNBUILT:
            self._row = module.RowGemv.probe(self._cat_weight(), self.bias, self._onednn)
            self._row_max = module.MAX_ROWS  # from now on ``__call__`` reads ``_row`` directly
        return self._row

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]."""
        if x.dim() != 2:
            return self(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        rows = x.shape[0]
        kernel = self._row if USE_ROW_KERNEL and rows <= self._row_max else self.row_kernel(rows)  # once probed
        return self._onednn(x) if kernel is None else kernel(x)

    def _onednn(self, x2d: torch.Tensor) -> torch.Tensor:
        """x2d [M, in] @ weight.T + bias -> [M, out]; fewer than ``MIN_ROWS`` rows are padded (row invariance)."""
        rows = x2d.shape[0]
        if rows < MIN_ROWS:
            x2d = torch.cat([x2d, x2d.new_zeros(MIN_ROWS - rows, x2d.shape[1])])
        return torch.ops.mkldnn._linear_pointwise(x2d.contiguous(), self.weight, self.bias, "none", [], "")[:rows]


_UNBUILT = object()


@functools.cache
def row_gemv_module():
    """The ``row_gemv`` module, or None where numba cannot be imported (imported once, on first use)."""
    try:
        import specdec_cli.models.row_gemv as row_gemv
    except ImportError:
        return None
    return row_gemv

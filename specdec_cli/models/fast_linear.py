"""Linear layers with oneDNN-prepacked weights for fp32 CPU inference, ``F.linear`` everywhere else.

Decode on CPU is memory-bound and torch's default fp32 GEMM (MKL) is slow for a few rows;
oneDNN with the weight reordered once into its blocked layout is much faster for 2-17 rows
(reference/feasibility.md §4). The ops are private (``torch.ops.mkldnn._reorder_linear_weight``
/ ``_linear_pointwise``), so their use is guarded and falls back to ``F.linear``.

``LinearGroup`` runs several projections of the same input (q/k/v, gate/up) as one GEMM over
their concatenated weights: fewer calls and bigger GEMMs, bitwise the same outputs.

Row invariance (``row_invariant``, default on): a token's output must not depend on how many
rows share the GEMM, or a K+1 token verify would not reproduce 1-token decodes and greedy
speculative output could drift from greedy autoregressive output. Every CPU backend measured
(oneDNN, MKL) rounds a single row differently from several rows, while oneDNN agrees bit for
bit across all M >= 2 (every SmolLM2 shape), so a single row is padded to ``MIN_ROWS`` rows.
That costs single-row forwards ~20 % against MKL's GEMV on AVX-512 CPUs; with
``row_invariant = False`` a single row takes ``F.linear`` (fastest decode, results then differ
from multi-row ones by fp32 rounding only) - the right choice for drafters, whose outputs are
never compared across batch shapes.

Packed copies are rebuilt whenever a weight is replaced or changed in place (``Tensor._version``),
so drafters can train these modules; with autograd active the plain ``F.linear`` path runs.
Copies (``copy.deepcopy``) and pickles drop the packed cache; it is rebuilt on first use.
"""
from __future__ import annotations

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
        return _packed_linear(x, *packed)


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
        return F.linear(x, weight) if packed is None else _packed_linear(x, *packed)


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
        return list(_packed_linear(x, *packed).split(self.sizes, dim=-1))


class _PackedWeights:
    """The oneDNN-reordered concatenation of some linears' weights (and their concatenated bias).

    Rebuilt when any source parameter is replaced or modified in place (``Tensor._version``).
    """

    def __init__(self, linears: Sequence[Linear]) -> None:
        self._linears = list(linears)
        self._sources: list[torch.Tensor] = []  # the parameters the cached value was built from
        self._versions: list[int] = []
        self._value: tuple[torch.Tensor, torch.Tensor | None] | None = None
        self._failed = False

    def __getstate__(self) -> dict[str, object]:
        """Copies and pickles drop the cache: oneDNN's opaque tensors cannot be copied."""
        return {**self.__dict__, "_sources": [], "_versions": [], "_value": None}

    def get(self, x: torch.Tensor, row_invariant: bool) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(packed weight, bias) if the oneDNN path applies to ``x``, else None (use ``F.linear``)."""
        weights = [lin.weight for lin in self._linears]
        if (
            not _ONEDNN
            or self._failed
            or x.device.type != "cpu"
            or x.dtype != torch.float32
            or weights[0].dtype != torch.float32
            or x.numel() == 0
            or (not row_invariant and x.numel() == x.shape[-1])  # a single row: MKL's GEMV is fastest
            or (torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)))
        ):
            return None
        params = weights + [lin.bias for lin in self._linears if lin.bias is not None]
        # inference tensors have no version counter (and cannot be updated outside inference mode)
        versions = [-1 if p.is_inference() else p._version for p in params]
        same = len(params) == len(self._sources) and all(p is q for p, q in zip(params, self._sources))
        if not same or versions != self._versions:
            try:
                weight = torch.cat(weights) if len(weights) > 1 else weights[0]
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
            except RuntimeError as err:  # private op: a build may lack the kernel
                log.warning("oneDNN weight prepacking failed (%s); using F.linear", err)
                self._failed = True
                return None
            biases = [lin.bias.detach() for lin in self._linears if lin.bias is not None]
            self._value = (packed, torch.cat(biases) if biases else None)
            self._sources, self._versions = params, versions
        return self._value


def _packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] @ packed.T + bias, with single rows padded to ``MIN_ROWS`` (row invariance)."""
    x2d = x.reshape(-1, x.shape[-1])
    rows = x2d.shape[0]
    if rows < MIN_ROWS:
        x2d = torch.cat([x2d, x2d.new_zeros(MIN_ROWS - rows, x2d.shape[1])])
    y = torch.ops.mkldnn._linear_pointwise(x2d.contiguous(), packed, bias, "none", [], "")
    return y[:rows].reshape(*x.shape[:-1], y.shape[-1])

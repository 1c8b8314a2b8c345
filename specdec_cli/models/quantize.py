"""Weight-only int8 for CPU models (``model.dtype=int8``, ``method.head_dtype=int8``): per-output-channel scales,
quantised once at load.

Decode on CPU is memory-bound, so reading a weight as 1 byte instead of 4 is what makes it faster. The matmul
is ``row_gemv``'s kernel fed int8 weights: each int8 weight is converted to float32 (exactly) inside the
kernel and multiplied into float32 activations in one in-order FMA chain per output, then the output is scaled
per channel. Calls of more than ``row_gemv.MAX_ROWS`` rows (a prefill) go through it in chunks of that many rows
(the last one zero-padded: numba compiles the kernel once per row count, and a prefill then adds no new one).
The residual stream, norms, attention and softmax stay float32. Against ATen's ``_weight_int8pack_mm`` (which
needs bf16 activations to be fast) it takes 0.55-0.7x the time at every row count measured (1 to 32 rows of
SmolLM2-135M's linears: 7.0 vs 10.4 ms for 1 row, 11.9 vs 20.0 ms for 5; benchmarks/results_int8_gemm.md).

Exactness: the int8 model is a different model from the fp32 one, but it is deterministic and row-invariant
by construction (every row is computed alone, by the same kernel, in the same order, whatever the row count),
so greedy speculative output with an int8 target equals greedy autoregressive output with the same int8 target.
The embedding stays float32 (a lookup reads one row per token); the LM head is quantised like every other linear.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from specdec_cli.models.errors import ModelLoadError
from specdec_cli.models.fast_linear import Linear, row_gemv_module
from specdec_cli.models.layers import MLP, Attention
from specdec_cli.models.transformer import Transformer


def int8_unsupported_reason(device: torch.device | str) -> Optional[str]:
    """Why weight-only int8 cannot run on ``device`` (None when it can)."""
    if torch.device(device).type != "cpu":
        return f"weight-only int8 runs on CPU only, not on {torch.device(device).type}"
    if row_gemv_module() is None:
        return "the int8 kernel needs numba, which cannot be imported here"
    return None


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (int8 [N, K], scale [N] float32) with weight ~= int8 * scale per row."""
    amax = weight.detach().float().abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny)
    scale = amax / 127
    values = torch.round(weight.detach().float() / scale[:, None]).clamp_(-127, 127)
    return values.to(torch.int8).contiguous(), scale


class Int8Linear(nn.Module):
    """``y = (x @ qweight.T) * scale + bias``: x [..., K] float32 -> [..., N] float32."""

    row_invariant = True  # always: nothing to switch (read by ``Transformer.row_invariant``)

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        self._packed = None  # the kernel's layout of qweight, built on first use (row views never build one)

    @classmethod
    def from_linears(cls, *linears: Linear) -> Int8Linear:
        """One int8 linear over the concatenated outputs of ``linears`` (same input, all or no biases)."""
        weight = torch.cat([lin.weight.detach() for lin in linears])
        biases = [lin.bias.detach() for lin in linears if lin.bias is not None]
        qweight, scale = quantize_weight(weight)
        return cls(qweight, scale, torch.cat(biases).float() if biases else None)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = row_gemv_module()
        if self._packed is None:
            self._packed = kernel.pack_blocks(self.qweight)
        x2d = x if x.dim() == 2 and x.dtype == torch.float32 else x.reshape(-1, self.in_features).float()
        rows, step = x2d.shape[0], kernel.MAX_ROWS
        if rows <= step:  # a decode / verify / draft row: one call, no chunk bookkeeping
            y = kernel.gemm_rows(x2d, self._packed, self.in_features)
            if y.shape[1] != self.out_features:
                y = y[:, : self.out_features]
            y = y * self.scale if self.bias is None else y * self.scale + self.bias
            return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)
        if rows % step:  # a prefill: zero rows fill its last chunk, so every chunk takes the
            x2d = torch.cat([x2d, x2d.new_zeros(step - rows % step, self.in_features)])  # one compiled size
        chunks = [
            kernel.gemm_rows(x2d[start : start + step], self._packed, self.in_features)
            for start in range(0, x2d.shape[0], step)
        ]
        y = (chunks[0] if len(chunks) == 1 else torch.cat(chunks))[:rows, : self.out_features] * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class Int8Group:
    """Several projections of one input (q/k/v, gate/up) as one int8 GEMM; same interface as ``LinearGroup``."""

    def __init__(self, fused: Int8Linear, sizes: list[int]) -> None:
        self.fused, self.sizes = fused, sizes

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [..., in] -> one output [..., out_i] per projection (views into one buffer)."""
        return list(self.fused(x).split(self.sizes, dim=-1))


def quantize_model(model: Transformer) -> Transformer:
    """Replace every linear of ``model`` (decoder layers and LM head) by weight-only int8, in place
    (``ModelLoadError`` naming the reason where the device cannot run it)."""
    return quantize_linears(model, model.device, "model.dtype=int8")


def quantize_linears(module: nn.Module, device: torch.device | str, setting: str) -> nn.Module:
    """Replace every ``Linear`` inside ``module`` (a target or a draft head) by weight-only int8, in place;
    ``ModelLoadError`` naming ``setting`` and the reason where ``device`` cannot run it.

    Grouped projections (q/k/v, gate/up) are concatenated once into one int8 weight; the separate
    ``q_proj`` ... modules become views of its rows, so every HF-named module still exists. Embeddings and
    plain weight tensors stay as they are.
    """
    reason = int8_unsupported_reason(device)
    if reason is not None:
        raise ModelLoadError(f"{setting}: {reason}")
    with torch.no_grad():
        for sub in list(module.modules()):
            if isinstance(sub, Attention):
                sub.qkv = _group(sub, ("q_proj", "k_proj", "v_proj"))
            elif isinstance(sub, MLP):
                sub.gate_up = _group(sub, ("gate_proj", "up_proj"))
        for owner in list(module.modules()):
            for name, child in list(owner.named_children()):
                if isinstance(child, Linear):
                    setattr(owner, name, Int8Linear.from_linears(child))
    return module


def _group(owner: nn.Module, names: tuple[str, ...]) -> Int8Group:
    """Fuse ``owner``'s linears ``names`` into one ``Int8Linear``; each name becomes a row slice of it."""
    linears = [getattr(owner, name) for name in names]
    fused = Int8Linear.from_linears(*linears)
    start = 0
    for name, lin in zip(names, linears):
        rows = slice(start, start + lin.out_features)
        bias = None if fused.bias is None else fused.bias[rows]
        setattr(owner, name, Int8Linear(fused.qweight[rows], fused.scale[rows], bias))
        start += lin.out_features
    return Int8Group(fused, [lin.out_features for lin in linears])

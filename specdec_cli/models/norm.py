"""RMSNorm, with ``row_ops``' compiled kernel on CPU, and the lazy import of that kernel module."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * x / sqrt(mean(x^2) + eps) over the last dim, computed in float32 (as HF).

    CPU float32 without autograd takes ``row_ops``' compiled kernel (one call instead of five ATen ops; it can
    round an ulp apart from ``F.rms_norm``, the same way for every row count), everything else torch."""

    def __init__(self, size: int, eps: float, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = row_kernel(x, self.weight)
        if kernel is not None:
            return kernel.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:  # one fused op, bitwise equal to the HF form below for float32
            return F.rms_norm(x, x.shape[-1:], self.weight, eps=self.eps)
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)

    def residual(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A residual step: (h = x + delta, this norm of h), fused in one pass where the kernel applies."""
        kernel = row_kernel(x, delta, self.weight)
        if kernel is not None:
            return kernel.add_rms_norm(x, delta, self.weight, self.eps)
        h = x + delta
        return h, self(h)


@functools.cache
def row_ops_module():
    """The ``row_ops`` module, or None where numba cannot be imported (imported once, on first use)."""
    try:
        import specdec_cli.models.row_ops as row_ops
    except ImportError:
        return None
    return row_ops


def row_kernel(*tensors: torch.Tensor):
    """The ``row_ops`` module where it applies to ``tensors`` (CPU float32, none needing gradients), else None."""
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None
    return row_ops_module()

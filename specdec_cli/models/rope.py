"""Rotary position embeddings: inverse frequencies for the scaling variants and precomputed tables.

Variants (HF ``rope_type``): default, linear, dynamic (NTK; identical to default up to
``max_position_embeddings``, which is therefore the longest context it accepts), llama3, yarn.
The formulas follow HF's ``modeling_rope_utils`` so logits match HF checkpoints.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from specdec_cli.models.arch import ModelArch
from specdec_cli.models.errors import CacheOverflowError


def inverse_frequencies(arch: ModelArch) -> tuple[torch.Tensor, float]:
    """Return (inv_freq [head_dim/2] float32, attention scaling applied to cos/sin)."""
    dim, base = arch.head_dim, arch.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    params = dict(arch.rope_scaling or {})
    rope_type = params.get("rope_type", "default")
    if rope_type in ("default", "dynamic"):
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / params["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, params), 1.0
    return _yarn(arch, params)


def _llama3(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(arch: ModelArch, params: dict) -> tuple[torch.Tensor, float]:
    dim, base = arch.head_dim, arch.rope_theta
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or arch.max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class RotaryTables(nn.Module):
    """cos/sin tables ``[positions, head_dim/2]`` (already scaled), grown on demand, shared by all layers.

    HF builds ``cat(freqs, freqs)``; both halves are equal, so half tables suffice. The tables
    are non-persistent buffers: they follow ``.to()`` and stay out of the state dict.
    """

    def __init__(self, arch: ModelArch, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.arch = arch
        self.inv_freq, self.scaling = inverse_frequencies(arch)
        empty = torch.empty(0, arch.head_dim // 2, dtype=dtype, device=device)
        self.register_buffer("cos", empty, persistent=False)
        self.register_buffer("sin", empty.clone(), persistent=False)

    def ensure(self, num_positions: int) -> None:
        """Make the tables cover positions ``0 .. num_positions-1``."""
        if num_positions <= self.cos.shape[0]:
            return
        rope_type = (self.arch.rope_scaling or {}).get("rope_type", "default")
        if rope_type == "dynamic" and num_positions > self.arch.max_position_embeddings:
            raise CacheOverflowError(
                f"dynamic NTK RoPE is supported up to max_position_embeddings="
                f"{self.arch.max_position_embeddings} positions; asked for {num_positions}"
            )
        # built on the host (float32, as HF) with explicit devices, then moved once to the tables' device
        positions = torch.arange(num_positions, dtype=torch.int64, device=self.inv_freq.device).float()
        freqs = positions[:, None] * self.inv_freq[None, :]
        self.cos = (freqs.cos() * self.scaling).to(dtype=self.cos.dtype, device=self.cos.device)
        self.sin = (freqs.sin() * self.scaling).to(dtype=self.sin.dtype, device=self.sin.device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather tables for ``positions`` [T] -> (cos, sin) each [T, 1, head_dim/2]."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, heads, D] by per-token cos/sin [T, 1, D/2] (rotate-half layout, as HF Llama).

    Computes ``[x1*cos - x2*sin, x2*cos + x1*sin]``: HF's ``x*cos + rotate_half(x)*sin``,
    rounded identically, on half-width tables.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

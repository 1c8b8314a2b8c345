"""Attention of one request's queries over explicit keys/values, on CPU and CUDA.

``attend(q, k, v, scale=..., causal=..., mask=...)``: q [n, Hq, D], k/v [KV, L, D] -> [n, Hq, D].
``causal=True`` means the n queries are the *last* n of the L key positions (a cached prefix
of L - n keys, then the new tokens): query i sees keys 0 .. L-n+i. ``mask`` [n, L] bool
(True = may attend) restricts further; ``causal=False`` with no mask is full (block)
attention, as DFlash-style drafters need over their context plus a draft block.
GQA: query head h uses KV head h // (Hq / KV), as HF's ``repeat_kv``.

CPU: batched GEMMs with the G query heads of a KV head stacked as rows (no K/V copies), made
*row-invariant*: a query's output is bitwise the same whether it is decoded alone or verified
among K+1 tokens, which keeps greedy speculative output equal to greedy autoregressive output.
GEMM kernels round a block of a few rows differently from larger blocks (1-2 rows on a Xeon,
1-3 on an AMD EPYC), so blocks are padded to ``min_attn_rows()`` rows, probed once per process;
P @ V reduces over keys in fixed ``KEY_CHUNK`` pieces, because the GEMM splits long
reductions depending on their length; and fewer than ``MIN_KEYS`` keys are padded to that many.
CUDA: flashinfer's single-request kernel when importable (fp16/bf16, no custom mask), else
torch SDPA with an explicit mask (never ``is_causal`` when the query and key lengths differ).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

import torch
import torch.nn.functional as F

#: Most rows ``min_attn_rows`` pads to (beyond, the probe gives up and pads to this).
MAX_ATTN_PAD_ROWS = 16
#: Keys per P @ V piece; longer reductions are blocked by the GEMM depending on their length.
KEY_CHUNK = 256
#: Keys a short context is padded to (zeros, score -inf): over fewer keys the score GEMM and softmax take other
#: code paths, so a short context's decode would not round like its verify (measured: the scores up to 11 keys,
#: softmax up to 15).
MIN_KEYS = 32
#: Queries per score block on CPU (bounds the [KV, G*rows, L] score buffer for long prefills).
QUERY_CHUNK = 256


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention q [n, Hq, D] over k, v [KV, L, D] -> [n, Hq, D] (see the module docstring)."""
    if q.device.type == "cuda":
        return _attend_cuda(q, k, v, scale=scale, causal=causal, mask=mask)
    n, seq = q.shape[0], k.shape[1]
    if n <= QUERY_CHUNK:
        return _attend_cpu(q, k, v, scale=scale, causal=causal, mask=mask)
    out = torch.empty_like(q)
    for start in range(0, n, QUERY_CHUNK):
        end = min(start + QUERY_CHUNK, n)
        visible = seq - n + end if causal else seq  # causal: later keys are masked for this block anyway
        out[start:end] = _attend_cpu(
            q[start:end],
            k[:, :visible],
            v[:, :visible],
            scale=scale,
            causal=causal,
            mask=None if mask is None else mask[start:end, :visible],
        )
    return out


def attend_requests(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: Sequence[int],
                    starts: Sequence[int], counts: Sequence[int], masks: Sequence[torch.Tensor | None], *,
                    scale: float, kernel: ModuleType | None) -> torch.Tensor:
    """Each request's new rows of q [T, Hq, D] (request r: ``counts[r]`` rows at positions ``starts[r]``.. of slot
    ``slots[r]``, tree rows with their ``masks[r]``) over its slot of k_cache/v_cache [slots, KV, max_len, D]
    -> [T, Hq, D]. With ``kernel`` (``norm.row_kernel``: CPU float32) a request of up to
    ``row_ops.ATTEND_MAX_ROWS`` rows (every decode and verify) takes the compiled row kernel, longer prefill
    chunks (and everything without it) the GEMM path of ``attend``."""
    if kernel is not None and len(slots) == 1 and counts[0] <= kernel.ATTEND_MAX_ROWS:  # batch 1: no copy
        return kernel.attend_rows(q, k_cache[slots[0]], v_cache[slots[0]], starts[0], scale, masks[0])
    out = q.new_empty(q.shape)
    offset = 0
    for slot, start, n, mask in zip(slots, starts, counts, masks):
        rows, end = q[offset : offset + n], start + n
        if kernel is not None and n <= kernel.ATTEND_MAX_ROWS:
            out[offset : offset + n] = kernel.attend_rows(rows, k_cache[slot], v_cache[slot], start, scale, mask)
        else:
            out[offset : offset + n] = attend(rows, k_cache[slot, :, :end], v_cache[slot, :, :end], scale=scale,
                                              causal=True, mask=mask)
        offset += n
    return out


@functools.lru_cache(maxsize=64)
def causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive bias [n, n] over the last n keys: 0 on/below the diagonal, -inf above. Read-only."""
    with torch.inference_mode(False):  # cached: must stay usable outside inference mode (training)
        return torch.full((n, n), float("-inf"), dtype=dtype, device=device).triu_(1)


def attend_batch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, bias: torch.Tensor
) -> torch.Tensor:
    """B requests with n queries each: q [B, n, Hq, D] over k, v [B, KV, L, D] -> [B, n, Hq, D].

    ``bias`` [B, n, L] is additive (-inf = blocked), e.g. each request's causal limit when the
    requests' cached lengths differ. Row-invariant like ``attend`` (keys past a request's limit
    get probability exactly 0), so a request's output equals ``attend`` on it alone.
    """
    return _attend_rows(q, k, v, scale=scale, bias=bias, mask=None)


@functools.cache
def min_attn_rows() -> int:
    """The fewest rows from which a batched fp32 GEMM rounds each row as in any larger block (probed on random
    scores and P @ V shapes of one KV head group: rows, head dim 64, 256 keys)."""
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(3, 256, 64, generator=generator)
    queries = torch.randn(3, 4 * MAX_ATTN_PAD_ROWS, 64, generator=generator)
    probs = torch.rand(3, 4 * MAX_ATTN_PAD_ROWS, 256, generator=generator)
    scores, mixed = torch.bmm(queries, keys.transpose(1, 2)), torch.bmm(probs, keys)

    def rounds_as_many(rows: int) -> bool:
        return torch.equal(torch.bmm(queries[:, :rows], keys.transpose(1, 2)), scores[:, :rows]) and torch.equal(
            torch.bmm(probs[:, :rows], keys), mixed[:, :rows])

    rows = MAX_ATTN_PAD_ROWS
    while rows > 1 and rounds_as_many(rows - 1):
        rows -= 1
    return rows


def _attend_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, causal: bool, mask: torch.Tensor | None
) -> torch.Tensor:
    n = q.shape[0]
    bias = causal_bias(n, q.dtype, q.device)[None] if causal and n > 1 else None
    return _attend_rows(q[None], k[None], v[None], scale=scale, bias=bias, mask=mask)[0]


def _attend_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    bias: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """q [B, n, Hq, D], k/v [B, KV, L, D]; bias [B|1, n, Lb] added to the last Lb keys; mask [n, L]."""
    b, n, num_heads, head_dim = q.shape
    num_kv, seq = k.shape[1], k.shape[2]
    groups = num_heads // num_kv
    n_pad = max(n, -(-min_attn_rows() // groups))  # padded query rows are zeros; their output is dropped
    shape = (b, num_kv, n_pad, groups, head_dim)
    qg = q.new_zeros(shape) if n_pad > n else q.new_empty(shape)
    qg[:, :, :n] = q.view(b, n, num_kv, groups, head_dim).transpose(1, 2)
    keys_pad = max(seq, MIN_KEYS)  # padded keys are zeros, their scores -inf
    if keys_pad > seq:
        k, v = F.pad(k, (0, 0, 0, keys_pad - seq)), F.pad(v, (0, 0, 0, keys_pad - seq))
    keys = k.reshape(b * num_kv, keys_pad, head_dim)  # a view for one slot or adjacent slots
    values = v.reshape(b * num_kv, keys_pad, head_dim)
    scores = torch.bmm(qg.view(b * num_kv, n_pad * groups, head_dim), keys.transpose(1, 2)).mul_(scale)
    rows = scores.view(b, num_kv, n_pad, groups, keys_pad)[:, :, :n, :, :seq]
    if bias is not None:
        rows[..., seq - bias.shape[-1] :].add_(bias[:, None, :, None, :])
    if mask is not None:
        rows.masked_fill_(~mask[:, None, :], float("-inf"))
    if keys_pad > seq:
        scores.view(b, num_kv, n_pad, groups, keys_pad)[..., seq:] = float("-inf")
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.bmm(probs[:, :, :KEY_CHUNK], values[:, :KEY_CHUNK])
    for start in range(KEY_CHUNK, keys_pad, KEY_CHUNK):
        out.baddbmm_(probs[:, :, start : start + KEY_CHUNK], values[:, start : start + KEY_CHUNK])
    return out.view(shape)[:, :, :n].transpose(1, 2).reshape(b, n, num_heads, head_dim)


def _attend_cuda(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, causal: bool, mask: torch.Tensor | None
) -> torch.Tensor:
    flashinfer = _flashinfer()
    if flashinfer is not None and mask is None and q.dtype in (torch.float16, torch.bfloat16):
        # q is [n, Hq, D] ("NHD"); the cache slices are [KV, L, D] ("HND"); causal is bottom-right aligned
        return flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout="HND", sm_scale=scale)
    n, seq = q.shape[0], k.shape[1]
    allowed = mask
    if causal and n > 1:
        allowed = torch.ones(n, seq, dtype=torch.bool, device=q.device).tril_(seq - n)
        allowed = allowed if mask is None else allowed & mask
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k[None], v[None], attn_mask=allowed, scale=scale, enable_gqa=True
    )
    return out[0].transpose(0, 1)


@functools.cache
def _flashinfer() -> ModuleType | None:
    """flashinfer if importable (optional GPU extra), imported on first CUDA use only."""
    try:
        import flashinfer
    except ImportError:
        return None
    return flashinfer

"""Shard a loaded ``Transformer`` in place for one tensor-parallel rank (Megatron layout).

Per decoder layer: q/k/v and gate/up keep this rank's output rows (column parallel; the
fused q/k/v and gate/up GEMM groups are rebuilt over the slices), o_proj and down_proj keep the
matching input columns and sum their partial outputs over the ranks (row parallel): two sums
per layer. The embedding and the LM head are split over the vocabulary (tied weights stay tied).

Afterwards ``model.arch`` describes the *rank-local* shapes (head counts, intermediate size) so
that ``model.new_cache`` builds a rank-local KV cache with only this rank's KV heads, and
``model.truncated`` (self-speculative drafts) shares the sharded layers; ``vocab_size`` stays the
whole vocabulary, because the model's forward returns whole-vocabulary logits (the head gathers).
Each rank loads the full checkpoint and keeps its shard: a loader that reads only a rank's
slices would need a hook in ``models/loading.py``.
"""
from __future__ import annotations

import dataclasses

from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer
from specdec_cli.models.fast_linear import LinearGroup
from specdec_cli.models.layers import MLP, Attention
from specdec_cli.parallel.comm import Comm
from specdec_cli.parallel.gather import GatherPolicy
from specdec_cli.parallel.layers import RowParallelLinear, ShardedLMHead, VocabParallelEmbedding, column_slice
from specdec_cli.parallel.partition import HeadShards, Shard, head_shards, tp_problems

#: A separate draft model with fewer parameters than this is replicated on every rank instead of
#: sharded: sharding adds two collectives per layer per draft step, which costs more than the
#: replicated compute of a small model saves, and its weights are cheap to hold on every rank.
SHARD_DRAFT_MIN_PARAMS = 2_000_000_000


def shard_transformer(model: Transformer, comm: Comm, *, policy: GatherPolicy, label: str) -> ShardedLMHead:
    """Keep this rank's shard of ``model`` (in place) and return its LM head, gathering by ``policy``."""
    arch = model.arch
    problems = tp_problems(arch, comm.size)
    if problems:
        raise ConfigError(problems)
    heads = head_shards(arch, comm.size, comm.rank)
    ffn = Shard.even(arch.intermediate_size, comm.size, comm.rank)
    for layer in model.layers:
        _shard_attention(layer.self_attn, heads, comm)
        _shard_mlp(layer.mlp, ffn, comm)
    vocab = Shard.even(arch.vocab_size, comm.size, comm.rank)
    embedding = VocabParallelEmbedding(model.embed_tokens, vocab, comm)
    head = column_slice(model.lm_head, vocab)
    if arch.tie_word_embeddings:
        head.weight = embedding.weight
    model.embed_tokens = embedding
    model.lm_head = ShardedLMHead(head, vocab, comm, policy=policy, label=label)
    model.arch = dataclasses.replace(
        arch, num_heads=heads.q.size, num_kv_heads=heads.kv.size, intermediate_size=ffn.size
    )
    return model.lm_head


def should_shard_draft(model: Transformer, tp: int, *, min_params: int | None = None) -> bool:
    """The documented rule for a separate draft model: shard it when it can be split ``tp`` ways
    and has at least ``min_params`` (default ``SHARD_DRAFT_MIN_PARAMS``, read at call time)
    parameters; otherwise replicate it on every rank."""
    threshold = SHARD_DRAFT_MIN_PARAMS if min_params is None else min_params
    num_params = sum(p.numel() for p in model.parameters())
    return num_params >= threshold and not tp_problems(model.arch, tp)


def _shard_attention(attn: Attention, heads: HeadShards, comm: Comm) -> None:
    q_rows, kv_rows = heads.q.scaled(attn.head_dim), heads.kv.scaled(attn.head_dim)
    attn.q_proj = column_slice(attn.q_proj, q_rows)
    attn.k_proj = column_slice(attn.k_proj, kv_rows)
    attn.v_proj = column_slice(attn.v_proj, kv_rows)
    attn.o_proj = RowParallelLinear(attn.o_proj, q_rows, comm)
    attn.num_heads, attn.num_kv_heads = heads.q.size, heads.kv.size
    attn.qkv = LinearGroup(attn.q_proj, attn.k_proj, attn.v_proj)


def _shard_mlp(mlp: MLP, ffn: Shard, comm: Comm) -> None:
    mlp.gate_proj = column_slice(mlp.gate_proj, ffn)
    mlp.up_proj = column_slice(mlp.up_proj, ffn)
    mlp.down_proj = RowParallelLinear(mlp.down_proj, ffn, comm)
    mlp.gate_up = LinearGroup(mlp.gate_proj, mlp.up_proj)

"""What a job runs, built in one place for a single process and for every rank of a parallel run.

``build_pipeline`` seeds the process, then:
  1. loads the target model and tokenizer              (models/)
  2. builds the drafter from the registry               (drafters/); on a tensor-parallel rank
     ``parallel/drafters.py`` shards the target first, in the order the method needs
  3. tokenises the workload (read and validated before the model loads) (engine/workload.py)
  4. builds the engine that will run them               (engine/engine.py)
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import MethodConfig, RunConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import Drafter, DrafterDeps
from specdec_cli.engine.adaptive import skip_rule
from specdec_cli.engine.drive import warm_up
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request
from specdec_cli.engine.tree import TreeSpecEngine
from specdec_cli.engine.workload import build_requests, check_requests, read_workload
from specdec_cli.models import Transformer, load_model
from specdec_cli.models.loading import COMPUTE_DTYPES
from specdec_cli.models.quantize import quantize_model

if TYPE_CHECKING:
    from specdec_cli.parallel.context import RankContext


DrafterBuilder = Callable[[MethodConfig, DrafterDeps], Optional[Drafter]]


#: The throw-away prompt the engine warm-up (``engine/drive.py warm_up``) runs before anything is timed (it repeats, so retrieval drafts too).
WARM_UP_TEXT = "Warm-up: one two three four, one two three four, one two three four."


@dataclass
class Pipeline:
    """A loaded job: the engine serves ``requests`` (the whole workload, in input order)."""

    target: Transformer
    tokenizer: Any  # a Hugging Face tokenizer
    drafter: Optional[Drafter]  # None: method=none
    engine: SpecEngine
    requests: list[Request]


def build_pipeline(cfg: RunConfig, effective: EffectiveConfig, *,
                   rank_ctx: Optional[RankContext] = None, with_workload: bool = True) -> Pipeline:
    """Load and build everything ``cfg`` asks for; ``rank_ctx``: this process is one rank of a
    parallel run (its device, its share of the CPU cores; a tensor-parallel rank shards the target).
    ``with_workload=False``: no requests (the Python API and the server bring their own)."""
    cfg = with_resolved_method(cfg, effective)
    local_ranks = rank_ctx.local_world_size if rank_ctx is not None else 1
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_ranks))
    torch.manual_seed(cfg.sampler.seed)
    device = rank_ctx.device if rank_ctx is not None else torch.device(effective.device)
    dtype = COMPUTE_DTYPES[cfg.model.dtype]
    rows = read_workload(cfg.workload) if with_workload else []  # every row validated before the model loads
    target, tokenizer = load_model(cfg.model.path, dtype=dtype, device=device)
    if cfg.model.dtype == "int8":
        quantize_model(target)
    target.warm_up()
    deps = DrafterDeps(target=target, num_slots=cfg.engine.max_batch_size, max_seq_len=cfg.engine.max_seq_len,
                       vocab_size=target.arch.vocab_size, device=device, dtype=dtype, tokenizer=tokenizer,
                       model_dtype=cfg.model.dtype, head_dtype=effective.head_dtype)
    drafter = _drafter_builder(cfg, rank_ctx)(cfg.method, deps)
    requests = build_requests(cfg.workload, cfg.sampler, tokenizer, chat=cfg.model.chat_template, rows=rows)
    check_requests(requests, max_seq_len=cfg.engine.max_seq_len, max_position_embeddings=target.arch.position_limit)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    engine = build_engine(target, drafter, cfg, effective, decode)
    warm_up(engine, tokenizer.encode(WARM_UP_TEXT))
    if rank_ctx is not None:
        rank_ctx.comm.counts.clear()  # results.json reports the run's collectives, not the warm-up's
    return Pipeline(target, tokenizer, drafter, engine, requests)


def build_engine(target: Transformer, drafter: Optional[Drafter], cfg: RunConfig, effective: EffectiveConfig,
                 decode: Optional[Callable[[list[int]], str]] = None) -> SpecEngine:
    """The engine ``cfg`` asks for around ``drafter``: the tree engine for a draft tree, else the chain engine."""
    if effective.tree_topk > 1:
        return TreeSpecEngine(target, drafter, engine_options(cfg, effective), decode=decode,
                              max_nodes=effective.tree_nodes, sampled_max_nodes=effective.sampled_tree_nodes)
    return SpecEngine(target, drafter, engine_options(cfg, effective), decode=decode)


def engine_options(cfg: RunConfig, effective: EffectiveConfig) -> EngineOptions:
    """The engine settings of ``cfg`` (a drafter-less engine ignores the drafting ones)."""
    return EngineOptions(
        max_batch_size=cfg.engine.max_batch_size, max_seq_len=cfg.engine.max_seq_len,
        prefill_chunk=cfg.engine.prefill_chunk, max_draft_len=cfg.method.num_draft_tokens,
        draft_len_schedule=effective.draft_len_schedule, rejection=effective.rejection,
        backend=effective.backend, verification=effective.verification,
        relaxed=(cfg.method.relaxed_topk, cfg.method.relaxed_delta) if effective.relaxed_acceptance else None,
        thinking=thinking_ids(cfg.method),
        skip=skip_rule(cfg.method), cuda_graphs=effective.cuda_graphs,
    )


def thinking_ids(method: MethodConfig) -> Optional[tuple[int, int]]:
    """(begin, end) thinking token ids gating relaxed acceptance; None: relaxed everywhere (validated opt-in)."""
    begin, end = getattr(method, "begin_thinking_token_id", None), getattr(method, "end_thinking_token_id", None)
    return None if begin is None or end is None else (begin, end)


def with_resolved_method(cfg: RunConfig, effective: EffectiveConfig) -> RunConfig:
    """``cfg`` with the auto choices that shape the drafter filled in from ``effective`` (``method.tree_topk``)."""
    if cfg.method.tree_topk == effective.tree_topk:
        return cfg
    return dataclasses.replace(cfg, method=dataclasses.replace(cfg.method, tree_topk=effective.tree_topk))


def _drafter_builder(cfg: RunConfig, rank_ctx: Optional[RankContext]) -> DrafterBuilder:
    """The registry's factory; on a tensor-parallel rank, the one that shards the target around it."""
    if rank_ctx is None or cfg.parallelism.tp == 1:
        return build_drafter
    from specdec_cli.parallel.drafters import shard_target_and_build_drafter  # torch.distributed: TP runs only

    return functools.partial(shard_target_and_build_drafter, comm=rank_ctx.comm)

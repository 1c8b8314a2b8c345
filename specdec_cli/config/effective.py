"""What a run will actually do, after validation resolved every ``auto`` and default.

Produced by ``config.validate.resolve``; the engine reads it instead of re-deciding,
and ``results.json`` records it next to the config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class EffectiveConfig:
    """Resolved decisions; ``reasons`` explains each one that differs from a plain reading."""

    rejection: bool  # rejection sampling (else strict or relaxed acceptance)
    relaxed_acceptance: bool  # MTP thinking-phase acceptance (lossy)
    backend: str  # "torch" | "flashinfer": the rejection-sampling kernels
    device: str  # "cpu" | "cuda"
    draft_len_schedule: dict[int, int]  # max batch size -> K, sorted; {} = always num_draft_tokens
    all_greedy: bool  # every request has temperature 0: the argmax fast path, never rejection
    reasons: list[str]  # human-readable, one per silent decision
    all_sampled: bool = False  # every request has temperature > 0 (a tree verifies sampled_tree_nodes nodes)
    cuda_graphs: bool = False  # engine.cuda_graphs resolved: capture decode batches <= 16 (CUDA only)
    suffix_enhancer: bool = False  # method.suffix_enhancer resolved (auto: on for chain model drafters)
    head_dtype: Optional[str] = None  # method.head_dtype resolved (auto: int8 for EAGLE-3 on CPU); None: model.dtype
    tree_topk: int = 1  # method.tree_topk resolved (auto, EAGLE-3: a tree at batch 1 on one process)
    tree_nodes: int = 0  # nodes per tree verify of a greedy request (method.max_total_draft_tokens resolved); 0: chain
    sampled_tree_nodes: int = 0  # the same for a sampled request (auto tree: K + 1)
    verification: str = "token"  # rejection.verification resolved: token | block (a tree: traversal verification)

    def verification_label(self) -> str:
        """", block verification" / ", traversal verification" (a tree) where drafts are judged path by path."""
        if not self.rejection or self.verification != "block":
            return ""
        return ", traversal verification" if self.tree_topk > 1 else ", block verification"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``json.dumps`` turns the schedule's int keys into strings)."""
        return dataclasses.asdict(self)

"""Synthetic run and sweep directories, shaped like what ``specdec run`` writes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

SAMPLERS = {
    "greedy": {"name": "greedy", "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0},
    "topk": {"name": "topk", "temperature": 1.0, "top_k": 20, "top_p": 1.0, "seed": 0},
}


def results_record(method: str, sampler: str, *, k: int = 4, tokens_per_s: float = 100.0,
                   acceptance_length: float = 2.0, per_position: Optional[list[float]] = None,
                   self_layers: Optional[int] = None, workload: str = "quick") -> dict[str, Any]:
    """A results.json body with the fields the report reads."""
    method_cfg = {"name": method, "num_draft_tokens": 0 if method == "none" else k, "draft_policy": "sample",
                  "draft_len_schedule": {}}
    if method == "draft_target":
        method_cfg.update(self_speculative_layers=self_layers, draft_path=None)
    rejection = method == "draft_target"
    return {
        "config": {
            "method": method_cfg, "sampler": SAMPLERS[sampler],
            "workload": {"name": workload, "source": "builtin", "num_prompts": 4, "max_new_tokens": 64},
            "model": {"name": "smollm2_135m", "path": None, "dtype": "float32"},
            "engine": {"max_batch_size": 1, "max_seq_len": 1024, "prefill_chunk": 512},
        },
        "effective": {"rejection": rejection, "relaxed_acceptance": False, "device": "cpu",
                      "all_greedy": sampler == "greedy", "reasons": []},
        "metrics": {  # every key run_job writes
            "acceptance_length": 1.0 if method == "none" else acceptance_length,
            "acceptance_rate": 0.0 if method == "none" else (acceptance_length - 1) / k,
            "per_position_acceptance": [] if method == "none" else (per_position or [0.6, 0.4, 0.3, 0.2][:k]),
            "proposed_drafts": 0, "accepted_drafts": 0, "verify_steps": 0, "generated_tokens": 256,
            "target_forwards": 100, "guard_fallbacks": 0, "wall_s": 256 / tokens_per_s,
            "tokens_per_s": tokens_per_s, "load_s": 1.0, "num_requests": 4,
        },
    }


def write_job(job_dir: Path, overrides: list[str], results: Optional[dict[str, Any]]) -> Path:
    """A Hydra job directory: .hydra/overrides.yaml, and results.json unless ``results`` is None."""
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if results is not None:
        (job_dir / "results.json").write_text(json.dumps(results))
    return job_dir


def make_sweep(root: Path) -> Path:
    """Six jobs (none, ngram, draft_target x greedy, topk); job 4 (draft_target topk) failed."""
    jobs: list[tuple[str, str, Optional[dict]]] = [
        ("none", "greedy", results_record("none", "greedy", tokens_per_s=100.0)),
        ("none", "topk", results_record("none", "topk", tokens_per_s=80.0)),
        ("ngram", "greedy", results_record("ngram", "greedy", tokens_per_s=150.0, acceptance_length=2.5)),
        ("ngram", "topk", results_record("ngram", "topk", tokens_per_s=120.0, acceptance_length=1.8)),
        ("draft_target", "topk", None),
        ("draft_target", "greedy", results_record("draft_target", "greedy", tokens_per_s=210.0,
                                                  acceptance_length=3.1, self_layers=4)),
    ]
    for number, (method, sampler, results) in enumerate(jobs):
        overrides = [f"method={method}", f"sampler={sampler}"]
        if method == "draft_target":
            overrides.append("method.self_speculative_layers=4")
        write_job(root / str(number), overrides, results)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    return root

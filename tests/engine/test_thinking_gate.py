"""Relaxed (MTP) acceptance applies only inside the thinking phase (TensorRT-LLM's gating): between the
begin and end thinking token ids, strict elsewhere; a run without ids applies it everywhere (validated opt-in)."""
from __future__ import annotations

import torch

from specdec_cli.config.schema import DraftTargetMethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.engine.rules import in_thinking
from specdec_cli.run.drive import run_requests
from specdec_cli.sampling import relaxed_accept, thinking_mask
from specdec_cli.testing import toy_model

VOCAB, BEGIN, END = 16, 14, 15


def test_thinking_mask_follows_the_markers_in_the_drafts() -> None:
    drafts = torch.tensor([[1, BEGIN, 2, END, 3], [END, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    mask = thinking_mask(torch.tensor([False, True, True]), drafts, BEGIN, END)
    assert mask.tolist() == [[False, False, True, True, False],  # position i sees d_1..d_i
                             [True, False, False, False, False],
                             [True, True, True, True, True]]


def test_in_thinking_reads_the_last_marker() -> None:
    assert in_thinking([1, BEGIN, 2, 3], BEGIN, END) and not in_thinking([BEGIN, 2, END, 4], BEGIN, END)
    assert not in_thinking([1, 2, 3], BEGIN, END)


def test_relaxed_accept_is_strict_outside_the_mask() -> None:
    probs = torch.tensor([[[0.5, 0.4, 0.1], [0.5, 0.4, 0.1], [0.5, 0.4, 0.1]]])
    drafts, target_tokens = torch.tensor([[1, 1]]), torch.tensor([[0, 0, 0]])
    assert relaxed_accept(drafts, probs, target_tokens, 2, 0.2)[1].tolist() == [3]
    masked = relaxed_accept(drafts, probs, target_tokens, 2, 0.2, relaxed_mask=torch.tensor([[True, False]]))
    assert masked[1].tolist() == [2] and masked[0].tolist() == [[1, 0, -1]]


def accepted(target, prompt: list[int], thinking) -> tuple[int, int]:
    method = DraftTargetMethodConfig(self_speculative_layers=1, num_draft_tokens=3, draft_policy="argmax")
    deps = DrafterDeps(target=target, num_slots=1, max_seq_len=96, vocab_size=VOCAB, device=torch.device("cpu"),
                       dtype=torch.float32)
    options = EngineOptions(max_batch_size=1, max_seq_len=96, prefill_chunk=8, max_draft_len=3, rejection=False,
                            relaxed=(VOCAB, 1.0), thinking=thinking)
    engine = SpecEngine(target, build_drafter(method, deps), options)
    run_requests(engine, [Request(id="0", prompt_token_ids=prompt, params=SamplingParams(), max_new_tokens=24)])
    return engine.stats.accepted_drafts, engine.stats.proposed_drafts


def test_relaxed_acceptance_is_gated_by_the_thinking_phase() -> None:
    target = toy_model(0, vocab_size=VOCAB, num_layers=2)
    prompt = [1, 2, 3, 4, 5, 6]
    everywhere = accepted(target, [*prompt, BEGIN], None)
    thinking = accepted(target, [*prompt, BEGIN], (BEGIN, END))
    outside = accepted(target, [*prompt, BEGIN, 7, END], (BEGIN, END))
    assert everywhere[0] == everywhere[1]  # top-k = V, delta = 1: every draft accepted
    assert thinking == everywhere  # inside the thinking phase (no END emitted here): the same
    assert outside[0] < outside[1]  # after the end token: strict, some drafts rejected

"""Train/engine parity: the engine accepts exactly what the trainer's held-out evaluation predicts.

At greedy the engine's run is a deterministic walk over the target's own greedy response: a verify
step anchored at the last committed token accepts the leading drafts that equal the target's argmax,
emits one more token, and the next step is anchored there. The trainer's evaluation
(``Trainer.evaluate``: ``Task.matches`` on teacher-forced features, ``chain_stats``) scores a chain
at *every* response position of the same (prompt, response) pair. Replaying the engine's walk over
the trainer's per-anchor matches gives the counts the engine must measure: drafts proposed and
accepted at each position, verify steps and emitted tokens.

The prompts are the first prompts of the shipped corpus's held-out split; the responses are the
target's greedy answers (method=none), generated here so both sides see the same pairs.

Tolerance: exact, every count. The trainer computes features in one forward over the whole sequence,
the engine in incremental verify forwards; the target runtime is row-invariant (decode and verify
are bitwise equal), so the two only differ by float rounding of attention over different chunkings.
At most ``MAX_FLIPS`` draft decision per drafter may flip on such a near-tie; any feature offset,
d2t or position mismatch moves dozens of decisions (the first-position acceptance alone drops
from ~0.5 to ~0.1).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdec_cli.config.schema import DflashMethodConfig, Eagle3MethodConfig, MethodConfig, MtpMethodConfig, \
    NoneMethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.drafters.dflash import load_dflash
from specdec_cli.drafters.eagle3 import load_eagle3
from specdec_cli.drafters.learned import shipped_checkpoint
from specdec_cli.drafters.mtp import load_mtp
from specdec_cli.engine.engine import EngineOptions, SpecEngine
from specdec_cli.engine.request import Request, SamplingParams
from specdec_cli.models import load_model
from specdec_cli.run.drive import run_requests
from specdec_cli.train.block_tasks import DflashTask
from specdec_cli.train.corpus.shards import load_corpus
from specdec_cli.train.features import FeatureExtractor, OnlineFeatures, Sequences
from specdec_cli.train.tasks import HeadTask, Task, chain_stats, teacher_argmax
from specdec_cli.train.trainer import Trainer, TrainOptions

pytestmark = pytest.mark.realmodel

CORPUS = Path(__file__).resolve().parents[2] / "data" / "distill" / "smollm2_135m"
NUM_PROMPTS, MAX_NEW, K = 4, 32, 4
MAX_FLIPS = 1


@pytest.fixture(scope="module")
def embedded():
    return load_model(None)


def _engine_run(target, method: MethodConfig, prompts: list[list[int]], eos: int) -> tuple[list[Request], SpecEngine]:
    """Greedy requests of ``MAX_NEW`` tokens through the engine, all in one batch."""
    deps = DrafterDeps(target, len(prompts), 512, target.arch.vocab_size, torch.device("cpu"), torch.float32)
    drafter = None if method.name == "none" else build_drafter(method, deps)
    engine = SpecEngine(target, drafter, EngineOptions(max_batch_size=len(prompts), max_seq_len=512,
                                                       max_draft_len=method.num_draft_tokens))
    requests = [Request(id=str(i), prompt_token_ids=prompt, params=SamplingParams(0.0), max_new_tokens=MAX_NEW,
                        eos_token_ids=(eos,)) for i, prompt in enumerate(prompts)]
    run_requests(engine, requests)
    return requests, engine


@pytest.fixture(scope="module")
def held_out_pairs(embedded) -> list[tuple[list[int], list[int]]]:
    """(prompt, greedy response) pairs: held-out prompts whose greedy answer runs the full ``MAX_NEW``
    tokens (an answer ending in EOS would let the engine accept drafts past the end of the pair)."""
    target, tokenizer = embedded
    prompts = [prompt for prompt, _ in load_corpus(CORPUS, held_out=True)][: 2 * NUM_PROMPTS]
    requests, _ = _engine_run(target, NoneMethodConfig(), prompts, tokenizer.eos_token_id)
    pairs = [(r.prompt_token_ids, r.output_token_ids) for r in requests if r.finish_reason == "length"]
    assert len(pairs) >= NUM_PROMPTS, "too few held-out prompts with full-length greedy answers"
    return pairs[:NUM_PROMPTS]


def _trainer(task: Task, target, pairs, tmp_path: Path) -> Trainer:
    """The trainer with ``pairs`` as its held-out split (one evaluation batch, features online)."""
    sequences = Sequences.from_pairs(pairs)
    extractor = FeatureExtractor(target, task.feature_layers, max(t.numel() for t in sequences.tokens))
    options = TrainOptions(steps=0, batch_size=len(pairs), lr=0.0, warmup_steps=1, min_lr_ratio=1.0,
                           weight_decay=0.0, grad_clip=1.0, eval_every=1, checkpoint_every=1, eval_k=K,
                           resume=False)
    return Trainer(task, OnlineFeatures(extractor, sequences), sequences, train_indices=[],
                   eval_indices=list(range(len(pairs))), options=options, out_dir=tmp_path, artifact="parity",
                   hidden_size=target.arch.hidden_size, device=torch.device("cpu"))


def replay_engine_walk(match: torch.Tensor, prompt_len: int, num_new: int, k: int, row_shift: int
                       ) -> list[tuple[int, int]]:
    """The (drafts proposed, drafts accepted) of each verify step the engine takes at greedy over one
    pair, from the trainer's matches [L, k] (row r: the chain drafted from row r). After prefill the
    response holds one token; a step anchored at the last committed position t reads row t + row_shift,
    proposes min(k, tokens left - 1) drafts and accepts their leading matches, then emits one more."""
    steps, emitted = [], 1
    while emitted < num_new:
        proposed = max(0, min(k, num_new - emitted - 1))
        row = match[prompt_len + emitted - 1 + row_shift, :proposed]
        accepted = int(row.int().cumprod(0).sum())
        steps.append((proposed, accepted))
        emitted += accepted + 1
    return steps


def _walk_counts(steps: list[tuple[int, int]], k: int) -> tuple[list[int], list[int], int, int]:
    proposed_at, accepted_at = [0] * k, [0] * k
    for proposed, accepted in steps:
        for position in range(proposed):
            proposed_at[position] += 1
            accepted_at[position] += position < accepted
    return proposed_at, accepted_at, len(steps), sum(a + 1 for _, a in steps)


def _task(name: str, target) -> tuple[Task, MethodConfig, int]:
    """The shipped drafter as a trainer task, its engine method, and its row shift (see the walk)."""
    if name == "eagle3":
        head = load_eagle3(shipped_checkpoint("eagle3", "checkpoint"), target)
        return HeadTask(head, target, steps=K, step_weight=1.0), Eagle3MethodConfig(num_draft_tokens=K, suffix_enhancer=False), -1
    if name == "mtp":
        head = load_mtp(shipped_checkpoint("mtp", "checkpoint"), target)
        return HeadTask(head, target, steps=K, step_weight=1.0), MtpMethodConfig(num_draft_tokens=K, suffix_enhancer=False), -1
    draft = load_dflash(shipped_checkpoint("dflash", "checkpoint"), target)
    draft.block_size = max(draft.block_size, K + 1)
    return DflashTask(draft, target), DflashMethodConfig(num_draft_tokens=K, suffix_enhancer=False), 0


@pytest.mark.parametrize("name", ["eagle3", "mtp", "dflash"])
def test_engine_acceptance_equals_the_trainers_held_out_evaluation(embedded, held_out_pairs, name: str,
                                                                   tmp_path: Path) -> None:
    target, tokenizer = embedded
    task, method, row_shift = _task(name, target)
    trainer = _trainer(task, target, held_out_pairs, tmp_path)
    # the trainer's own held-out evaluation, and the per-anchor matches it is computed from
    evaluation = trainer.evaluate()
    batch = trainer.batch(trainer.eval_indices)
    batch.teacher_argmax = teacher_argmax(batch.final(0), task.teacher_full_weight)
    match, valid = task.matches(batch, K)
    greedy = {key: value for key, value in evaluation.items() if key != "sampled_acceptance_length"}
    assert chain_stats(match.reshape(-1, K), valid.reshape(-1, K)) == greedy
    steps = [replay_engine_walk(match[i], len(prompt), MAX_NEW, K, row_shift)
             for i, (prompt, _) in enumerate(held_out_pairs)]
    proposed_at, accepted_at, verify_steps, emitted = _walk_counts([s for walk in steps for s in walk], K)

    requests, engine = _engine_run(target, method, [p for p, _ in held_out_pairs], tokenizer.eos_token_id)
    assert [r.output_token_ids for r in requests] == [response for _, response in held_out_pairs]  # lossless
    stats = engine.stats
    flips = sum(abs(a - b) for a, b in zip(stats.accepted_at, accepted_at))
    report = (f"{name}: engine accepted {stats.accepted_at} of {stats.proposed_at} in {stats.verify_steps} steps; "
              f"trainer's matches replayed: {accepted_at} of {proposed_at} in {verify_steps} steps "
              f"(trainer's all-anchor conditional {[round(c, 3) for c in evaluation['conditional']]})")
    assert flips <= MAX_FLIPS, report
    assert abs(stats.verify_steps - verify_steps) <= MAX_FLIPS and abs(stats.emitted_tokens - emitted) <= MAX_FLIPS, report
    print(report)

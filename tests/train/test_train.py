"""Self-distillation on the toy target: loss goes down, checkpoints round-trip, runs resume; the draft
vocabulary, feature cache and config round trips the trainer relies on."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from specdec_cli.config.schema import Eagle3MethodConfig, ModelConfig, MtpMethodConfig
from specdec_cli.drafters.eagle3 import load_eagle3
from specdec_cli.drafters.learned import arch_config
from specdec_cli.drafters.mtp import load_mtp
from specdec_cli.errors import ConfigError
from specdec_cli.models import ModelArch
from specdec_cli.models.loading import load_hf_dir
from specdec_cli.testing import toy_arch
from specdec_cli.train.features import CachedFeatures, FeatureExtractor, OnlineFeatures, Sequences
from specdec_cli.train.methods import TRAINERS, TaskInputs
from specdec_cli.train.pipeline import check_train_config
from specdec_cli.train.methods.heads import HeadTrainConfig
from specdec_cli.train.heads import draft_vocabulary, new_draft_model, new_eagle3, new_mtp, vocab_maps
from specdec_cli.train.tasks import (
    DraftModelTask, HeadTask, Task, chain_stats, overlap, sampled_chain_length, soft_cross_entropy,
)
from specdec_cli.train.trainer import Trainer, TrainOptions, learning_rate

VOCAB = 16
USED = torch.tensor([0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15])


@pytest.fixture(scope="module")
def sequences() -> Sequences:
    generator = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(0, VOCAB, (4,), generator=generator).tolist(),
              torch.randint(0, VOCAB, (18,), generator=generator).tolist()) for _ in range(24)]
    return Sequences.from_pairs(pairs)


def make_task(method: str, target) -> Task:
    if method == "eagle3":
        return HeadTask(new_eagle3(target, USED, hidden_layers=(0, 1, 1)), target, steps=2, step_weight=0.8)
    if method == "mtp":
        return HeadTask(new_mtp(target, USED), target, steps=2, step_weight=0.8)
    return DraftModelTask(new_draft_model(target, 1), target)


def make_trainer(task: Task, target, sequences: Sequences, out_dir: Path, steps: int) -> Trainer:
    options = TrainOptions(steps=steps, batch_size=6, lr=5e-3, warmup_steps=2, min_lr_ratio=0.1, weight_decay=0.0,
                           grad_clip=1.0, eval_every=0, checkpoint_every=4, eval_k=2, resume=True)
    # as in the pipeline, methods that read no layers get features with layers anyway (a shared cache)
    features = OnlineFeatures(FeatureExtractor(target, task.feature_layers or (0, 1), 22), sequences)
    return Trainer(task, features, sequences, train_indices=list(range(20)), eval_indices=[20, 21, 22, 23],
                   options=options, out_dir=out_dir, artifact="draft", hidden_size=32, device=torch.device("cpu"),
                   console=Console(quiet=True))


def losses(out_dir: Path) -> list[float]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


@pytest.mark.parametrize("method", ["eagle3", "mtp", "draft_target"])  # pard, dflash: test_block_tasks.py
def test_training_lowers_the_loss_and_checkpoints_round_trip(target, sequences, tmp_path: Path, method: str) -> None:
    task = make_task(method, target)
    summary = make_trainer(task, target, sequences, tmp_path, steps=20).run()
    first, last = losses(tmp_path)[0], losses(tmp_path)[-1]
    assert last < first, (first, last)
    assert summary["steps"] == 20 and summary["eval"]["anchors"] > 0
    sampled = summary["eval"].get("sampled_acceptance_length")  # heads estimate their T=1 chains too
    assert (sampled is None) == (method == "draft_target") and (sampled is None or 1 < sampled < 3)
    artifact = tmp_path / "draft"
    if method == "draft_target":
        loaded = load_hf_dir(artifact, dtype=torch.float32, device="cpu")
    else:
        loaded = (load_eagle3 if method == "eagle3" else load_mtp)(artifact, target)
    saved = task.module.state_dict()
    assert all(torch.equal(tensor, saved[name]) for name, tensor in loaded.state_dict().items())


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_a_head_warm_starts_from_a_checkpoint_with_its_weights_and_vocabulary(target, sequences, tmp_path: Path,
                                                                             method: str) -> None:
    """``init_from``: the head starts as the checkpoint (weights and d2t, not the corpus's vocabulary), trainable."""
    start = make_task(method, target)
    with torch.no_grad():
        next(start.module.parameters()).add_(0.5)  # not the seeded init
    make_trainer(start, target, sequences, tmp_path / "start", steps=1).run()
    method_config = Eagle3MethodConfig(target_layers=[0, 1, 1]) if method == "eagle3" else MtpMethodConfig()
    cfg = HeadTrainConfig(method=method_config, model=ModelConfig(), init_from=str(tmp_path / "start" / "draft"),
                          draft_vocab_size=4)
    task = TRAINERS.get(method).build_task(cfg, TaskInputs(target, None, sequences, 20, None))
    saved = load_eagle3 if method == "eagle3" else load_mtp
    expected = saved(tmp_path / "start" / "draft", target).state_dict()
    got = task.module.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[name], expected[name]) for name in expected)
    assert task.module.training and all(p.requires_grad for p in task.module.parameters())


def test_revocab_warm_start_keeps_trained_rows_and_starts_new_ids_at_the_targets_rows(target, sequences,
                                                                                      tmp_path: Path) -> None:
    """``revocab=true``: the warm-started EAGLE-3 head gets the corpus's vocabulary at ``draft_vocab_size``; every
    other weight, and the lm_head row of each id it already had, are the checkpoint's; new ids start at the
    target's LM-head rows; a resumed run keeps the vocabulary it trained (``TaskInputs.vocab_ids``)."""
    start = make_task("eagle3", target)
    with torch.no_grad():
        for param in start.module.parameters():
            param.add_(0.5)  # neither the seeded init nor the target's rows
    make_trainer(start, target, sequences, tmp_path / "start", steps=1).run()
    old = load_eagle3(tmp_path / "start" / "draft", target)
    old_ids = (torch.arange(old.draft_vocab_size) + old.d2t).tolist()
    cfg = HeadTrainConfig(method=Eagle3MethodConfig(target_layers=[0, 1, 1]), model=ModelConfig(),
                          init_from=str(tmp_path / "start" / "draft"), draft_vocab_size=14, revocab=True)
    head = TRAINERS.get("eagle3").build_task(cfg, TaskInputs(target, None, sequences, 20, None)).module
    new_ids = (torch.arange(head.draft_vocab_size) + head.d2t).tolist()
    assert len(new_ids) == 14 and new_ids == sorted(new_ids) and head.t2d.nonzero().flatten().tolist() == new_ids
    for row, token in enumerate(new_ids):
        expected = old.lm_head.weight[old_ids.index(token)] if token in old_ids else target.lm_head.weight[token]
        assert torch.equal(head.lm_head.weight[row], expected.float()), token
    kept = {name: tensor for name, tensor in old.state_dict().items() if not name.startswith(("lm_head", "d2t", "t2d"))}
    assert all(torch.equal(head.state_dict()[name], tensor) for name, tensor in kept.items())
    resumed_ids = torch.tensor([0, 2, 4, 6, 7, 11])
    resumed = TRAINERS.get("eagle3").build_task(cfg, TaskInputs(target, None, sequences, 20, resumed_ids)).module
    assert (torch.arange(6) + resumed.d2t).tolist() == resumed_ids.tolist()
    assert check_train_config(HeadTrainConfig(method=MtpMethodConfig(), model=ModelConfig(), revocab=True)) == [
        "revocab=true rebuilds a warm-started EAGLE-3 head's vocabulary: it needs method=eagle3 and init_from"]


def test_head_layers_deepens_a_warm_start_and_sizes_a_fresh_head(target, sequences, tmp_path: Path) -> None:
    """``head_layers``: a warm-started EAGLE-3 head gets identity-initialised plain layers appended (its own
    weights kept), a fresh head is built that deep; a shallower depth than the checkpoint's is refused."""
    start = make_task("eagle3", target)
    make_trainer(start, target, sequences, tmp_path / "start", steps=1).run()
    old = load_eagle3(tmp_path / "start" / "draft", target)
    method = Eagle3MethodConfig(target_layers=[0, 1, 1])
    cfg = HeadTrainConfig(method=method, model=ModelConfig(), init_from=str(tmp_path / "start" / "draft"),
                          head_layers=2)
    task = TRAINERS.get("eagle3").build_task(cfg, TaskInputs(target, None, sequences, 20, None))
    head = task.module
    assert head.num_layers == 2 and all(torch.equal(head.state_dict()[n], t) for n, t in old.state_dict().items())
    assert not head.extra_layers[0].mlp.down_proj.weight.any() and head.extra_layers[0].mlp.up_proj.weight.any()
    make_trainer(task, target, sequences, tmp_path / "deep", steps=2).run()
    trained = load_eagle3(tmp_path / "deep" / "draft", target)
    assert trained.num_layers == 2 and trained.extra_layers[0].mlp.down_proj.weight.any()  # it trains
    fresh = TRAINERS.get("eagle3").build_task(HeadTrainConfig(method=method, model=ModelConfig(), head_layers=3),
                                              TaskInputs(target, None, sequences, 20, None)).module
    assert fresh.num_layers == 3
    with pytest.raises(ConfigError, match=r"head_layers=1: .* holds a 2-layer head \(a head can be deepened, not cut\)"):
        TRAINERS.get("eagle3").build_task(HeadTrainConfig(method=method, model=ModelConfig(), head_layers=1,
                                                          init_from=str(tmp_path / "deep" / "draft")),
                                          TaskInputs(target, None, sequences, 20, None))
    assert check_train_config(HeadTrainConfig(method=MtpMethodConfig(), model=ModelConfig(), head_layers=2)) == [
        "head_layers=2 sets an EAGLE-3 head's depth: it needs method=eagle3 and 1..8"]


def test_resume_continues_from_the_saved_step(target, sequences, check_resume) -> None:
    check_resume(lambda out: make_trainer(make_task("eagle3", target), target, sequences, out, steps=12),
                 crash_at=10, saved=8)


def test_learning_rate_warms_up_then_decays() -> None:
    options = TrainOptions(steps=100, batch_size=1, lr=1.0, warmup_steps=10, min_lr_ratio=0.1, weight_decay=0.0,
                           grad_clip=1.0, eval_every=0, checkpoint_every=1, eval_k=1, resume=False)
    rates = [learning_rate(step, options) for step in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:])) and rates[-1] == pytest.approx(0.1, abs=1e-3)


def test_draft_vocabulary_prefers_response_then_prompt_frequency() -> None:
    responses = torch.tensor([0, 5, 0, 2, 0, 0, 9, 0])
    prompts = torch.tensor([0, 0, 3, 0, 1, 7, 0, 0])
    used = draft_vocabulary(responses, prompts, 5)
    assert used.tolist() == [1, 2, 3, 5, 6]  # by responses 6, 1, 3; then by prompts 5, 2; ascending
    d2t, t2d = vocab_maps(used, 8)
    assert (torch.arange(5) + d2t).tolist() == used.tolist() and t2d.nonzero().flatten().tolist() == used.tolist()


def test_chain_stats_counts_leading_matches() -> None:
    match = torch.tensor([[True, True, False], [True, False, True], [False, True, True]])
    valid = torch.ones(3, 3, dtype=torch.bool)
    stats = chain_stats(match, valid)
    assert stats["top1"] == pytest.approx(2 / 3)
    assert stats["acceptance_length"] == pytest.approx(1 + (2 + 1 + 0) / 3)
    assert stats["conditional"] == pytest.approx([2 / 3, 1 / 2, 0.0])


def test_sampled_chain_length_multiplies_step_acceptance_along_each_chain() -> None:
    probs = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.9, 0.9]])
    valid = torch.tensor([[True, True], [True, True], [False, False]])  # the third row is no anchor
    assert sampled_chain_length(probs, valid) == pytest.approx(1 + ((0.5 + 0.25) + (1.0 + 0.0)) / 2)


def test_overlap_is_the_chance_that_a_sampled_draft_is_accepted() -> None:
    generator = torch.Generator().manual_seed(0)
    weight, rows = torch.randn(12, 8, generator=generator), torch.randn(3, 8, generator=generator)
    target_logits = rows @ weight.T
    assert torch.allclose(overlap(target_logits, rows, weight, None), torch.ones(3))
    ids = torch.tensor([0, 2, 3, 7, 11])  # a draft vocabulary: q renormalises p over it, so min(p, q) = p there
    p = torch.softmax(target_logits, -1)
    assert torch.allclose(overlap(target_logits[:, ids], rows, weight, ids), p[:, ids].sum(-1))
    # against rejection sampling itself: draw x ~ q, accept with min(1, p(x) / q(x))
    student = torch.randn(1, ids.numel(), generator=generator)
    q = torch.softmax(student, -1)[0]
    drafts = torch.multinomial(q, 200_000, replacement=True, generator=generator)
    accept = (p[0, ids] / q).clamp(max=1)[drafts]
    expected = float(overlap(student, rows[:1], weight, ids))
    assert float(accept.mean()) == pytest.approx(expected, abs=4e-3)


def test_the_tv_term_adds_total_variation_to_the_soft_cross_entropy() -> None:
    generator = torch.Generator().manual_seed(1)
    student_head, teacher_head = torch.randn(10, 6, generator=generator), torch.randn(10, 6, generator=generator)
    rows = torch.randn(4, 6, generator=generator, requires_grad=True)
    teacher_rows = torch.randn(4, 6, generator=generator)
    head = lambda x: x @ student_head.T  # noqa: E731
    p, q = torch.softmax(teacher_rows @ teacher_head.T, -1), torch.softmax(head(rows), -1)
    tv = 0.5 * (p - q).abs().sum(-1)
    plain = soft_cross_entropy(rows, head, teacher_rows, teacher_head)
    mixed = soft_cross_entropy(rows, head, teacher_rows, teacher_head, tv_weight=2.0)
    assert torch.allclose(mixed, plain + 2.0 * tv)
    (grad_plain,) = torch.autograd.grad(plain.sum(), rows)
    (grad_mixed,) = torch.autograd.grad(mixed.sum(), rows)
    (grad_tv,) = torch.autograd.grad(tv.sum(), rows)
    assert torch.allclose(grad_mixed, grad_plain + 2.0 * grad_tv, atol=1e-6)


def test_feature_cache_resumes_and_matches_online_features(target, sequences, tmp_path: Path) -> None:
    extractor = FeatureExtractor(target, (0, 1), 22)
    first = CachedFeatures(extractor, sequences, tmp_path)
    first.rows[first.offsets[16] :] = 0  # as if interrupted after the first group of 16 sequences
    first.rows.flush()
    (tmp_path / "done.json").write_text('{"sequences": 16}')
    seen: list[int] = []
    cached = CachedFeatures(extractor, sequences, tmp_path, progress=seen.append)
    assert seen[0] == first.offsets[16] and sum(seen) == sum(t.numel() for t in sequences.tokens)
    online = OnlineFeatures(extractor, sequences)
    for index in (0, 15, 16, 23):
        assert torch.allclose(cached.get([index])[0], online.get([index])[0], rtol=1e-3, atol=1e-3)  # float16


@pytest.mark.parametrize("arch", [
    toy_arch(vocab_size=VOCAB),
    ModelArch(vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
              intermediate_size=48, rope_theta=5e5, tie_word_embeddings=True, qk_norm=True, model_type="qwen3",
              rope_scaling={"rope_type": "linear", "factor": 2.0}, eos_token_ids=(1, 2)),
])
def test_arch_config_round_trips(arch: ModelArch) -> None:
    assert ModelArch.from_hf_config(arch_config(arch)) == arch

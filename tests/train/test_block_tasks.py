"""PARD and DFlash as trainer tasks: training lowers the loss, artifacts load with the same logits, runs
resume, and the evaluation matches equal the inference drafters' greedy drafts anchor by anchor."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from specdec_cli.config.schema import (
    DflashMethodConfig, DraftTargetMethodConfig, ModelConfig, PardMethodConfig,
)
from specdec_cli.config.train_root import narrow, train_root_schema
from specdec_cli.drafters.base import DraftRequest
from specdec_cli.sampling.params import BatchParams
from specdec_cli.drafters.dflash import load_dflash, save_dflash
from specdec_cli.drafters.dflash_drafter import DFlashDrafter
from specdec_cli.drafters.pard import PardDrafter, load_pard
from specdec_cli.train.block_tasks import DflashTask, PardTask, default_mask_token_id
from specdec_cli.train.dflash_objective import build_dflash_batch, init_dflash
from specdec_cli.train.features import FeatureExtractor, OnlineFeatures, Sequences
from specdec_cli.train.pard_objective import build_pard_batch, init_pard_from_target, pard_hidden
from specdec_cli.train import ship as ship_module
from specdec_cli.train.heads import new_draft_model, save_draft_model
from specdec_cli.train.methods import TRAINERS, TaskInputs, train_schemas
from specdec_cli.train.methods.dflash import DflashTrainConfig
from specdec_cli.train.methods.draft_target import DraftTargetTrainConfig
from specdec_cli.train.methods.pard import PardTrainConfig
from specdec_cli.train.pipeline import check_train_config
from specdec_cli.train.tasks import Batch, Task, teacher_argmax
from specdec_cli.train.trainer import Trainer, TrainOptions

VOCAB = 16
MASK = 15
HIDDEN = 32


@pytest.fixture(scope="module")
def sequences() -> Sequences:
    """A tiny repeated corpus: 4 distinct (prompt, response) pairs, 6 times each (ids below the mask)."""
    generator = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(0, MASK, (4,), generator=generator).tolist(),
              torch.randint(0, MASK, (int(n),), generator=generator).tolist()) for n in (18, 14, 16, 11)]
    return Sequences.from_pairs(pairs * 6)


def make_task(method: str, target, seed: int = 0) -> Task:
    if method == "pard":
        return PardTask(init_pard_from_target(target, 2, hidden_size=16, seed=seed), target, mask_token_id=MASK,
                        depth=3)
    return DflashTask(init_dflash(target, (0, 1), mask_token_id=MASK, num_layers=1, block_size=3, seed=seed),
                      target, num_anchors=6)


def features_of(task: Task, target, sequences: Sequences) -> OnlineFeatures:
    # as in the pipeline, methods that read no layers get features with layers anyway (a shared cache)
    return OnlineFeatures(FeatureExtractor(target, task.feature_layers or (0, 1), 22), sequences)


def make_trainer(task: Task, target, sequences: Sequences, out_dir: Path, steps: int, eval_every: int = 0) -> Trainer:
    options = TrainOptions(steps=steps, batch_size=6, lr=1e-2, warmup_steps=2, min_lr_ratio=0.1, weight_decay=0.0,
                           grad_clip=1.0, eval_every=eval_every, checkpoint_every=4, eval_k=2, resume=True)
    return Trainer(task, features_of(task, target, sequences), sequences, train_indices=list(range(20)),
                   eval_indices=[20, 21, 22, 23], options=options, out_dir=out_dir, artifact="draft",
                   hidden_size=HIDDEN, device=torch.device("cpu"), console=Console(quiet=True))


def losses(out_dir: Path) -> list[float]:
    lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if "loss" in record]


def eval_batch(task: Task, target, sequences: Sequences, indices: list[int]) -> Batch:
    batch = Batch.collate([sequences.tokens[i] for i in indices], features_of(task, target, sequences).get(indices),
                          [sequences.prompt_lens[i] for i in indices], hidden_size=HIDDEN, pad=task.pad,
                          device=torch.device("cpu"))
    batch.teacher_argmax = teacher_argmax(batch.final(0), task.teacher_full_weight)
    return batch


def rounded(module: torch.nn.Module) -> torch.nn.Module:
    """A copy with its weights rounded to float16 (what the artifact stores)."""
    out = copy.deepcopy(module)
    with torch.no_grad():
        for param in out.parameters():
            param.copy_(param.half().float())
    return out


@pytest.mark.parametrize("method", ["pard", "dflash"])
def test_training_lowers_the_loss_and_the_artifact_loads(target, sequences, tmp_path: Path, method: str) -> None:
    task = make_task(method, target)
    summary = make_trainer(task, target, sequences, tmp_path, steps=30, eval_every=30).run()
    history = losses(tmp_path)
    assert history[-1] < 0.8 * history[0], history
    assert summary["steps"] == 30 and summary["eval"]["anchors"] > 0
    assert summary["eval"]["acceptance_length"] > 1.0
    tokens = sequences.tokens[0][None]
    lengths, prompts = torch.tensor([tokens.shape[1]]), torch.tensor([sequences.prompt_lens[0]])
    with torch.no_grad():
        if method == "pard":
            loaded, mask = load_pard(tmp_path / "draft")
            assert mask == MASK
            batch = build_pard_batch(tokens, lengths, prompts, depth=3, mask_token_id=MASK, keep_ratio=1.0)
            got = loaded.lm_head(pard_hidden(loaded, batch))
            reference = rounded(task.module)
            expected = reference.lm_head(pard_hidden(reference, batch))
        else:
            loaded = load_dflash(tmp_path / "draft", target)
            assert (loaded.target_layers, loaded.block_size, loaded.mask_token_id) == ((0, 1), 3, MASK)
            batch = build_dflash_batch(tokens, lengths, prompts, block_size=3, num_anchors=4, mask_token_id=MASK,
                                       generator=torch.Generator().manual_seed(0))
            features = features_of(task, target, sequences).get([0])[0][None, :, : 2 * HIDDEN]
            got = loaded.logits(loaded(features, batch.block_ids, batch.positions, batch.attention))
            reference = rounded(task.module)
            expected = reference.logits(reference(features, batch.block_ids, batch.positions, batch.attention))
    assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("method", ["pard", "dflash"])
def test_resume_continues_from_the_saved_step(target, sequences, check_resume, method: str) -> None:
    """The random drop / anchors of a batch depend on its tokens only, so a resumed run sees the same batches."""
    check_resume(lambda out: make_trainer(make_task(method, target), target, sequences, out, steps=8),
                 crash_at=6, saved=4)


@pytest.mark.parametrize("method,k", [("pard", 3), ("dflash", 2), ("dflash", 4)])
def test_matches_equal_the_inference_drafters_anchor_by_anchor(target, sequences, method: str, k: int) -> None:
    """match[b, c, j] == (the drafter's greedy draft j+1 given x_0..x_c == the target's argmax at c + j)."""
    task = make_task(method, target, seed=4)
    batch = eval_batch(task, target, sequences, [0, 1, 3])
    match, valid = task.matches(batch, k)
    rows, length = batch.features.shape[:2]
    assert match.shape == valid.shape == (rows, length, k)
    if method == "pard":
        drafter = PardDrafter(copy.deepcopy(task.module), MASK, vocab_size=VOCAB, num_slots=1, max_seq_len=64,
                              policy="argmax")
    else:
        drafter = DFlashDrafter(copy.deepcopy(task.module), target, num_slots=1, max_seq_len=64, policy="argmax")
    drafts_per_block = k if method == "pard" else min(k, 2)
    checked = hits = 0
    for row in range(rows):
        for anchor in range(int(batch.lengths[row]) - 1):
            drafter.add_request(0, [])
            request = DraftRequest(slot=0, token_ids=batch.tokens[row, : anchor + 1].tolist())
            drafts = drafter.propose([request], k, BatchParams.from_values([0.0], [0], [1.0], [None])).tokens[0]
            drafter.remove_request(0, [])
            for step in range(k):
                if not valid[row, anchor, step]:
                    continue
                teacher = int(batch.teacher_argmax[row, anchor + step])
                expected = step < drafts_per_block and int(drafts[step]) == teacher
                assert bool(match[row, anchor, step]) == expected, (row, anchor, step)
                checked, hits = checked + 1, hits + expected
    assert checked > 30 and 0 < hits < checked
    # valid: x_{c+1+j} is a response token inside the sequence
    for row in range(rows):
        prompt, end = int(batch.prompt_lens[row]), int(batch.lengths[row])
        expected = [[prompt <= c + 1 + j < end for j in range(k)] for c in range(length)]
        assert valid[row].tolist() == expected


def test_a_draft_that_copies_the_target_matches_everywhere(target, sequences) -> None:
    """A one-step PARD "draft" that is the target itself (depth 1: no mask tokens) matches every valid step."""
    task = PardTask(copy.deepcopy(target), target, mask_token_id=MASK, depth=1)
    batch = eval_batch(task, target, sequences, [0, 1, 2, 3])
    match, valid = task.matches(batch, 1)
    assert bool(valid.any()) and bool(match[valid].all())


def test_block_methods_check_their_own_fields() -> None:
    assert check_train_config(PardTrainConfig(method=PardMethodConfig(), model=ModelConfig())) == []
    assert check_train_config(DflashTrainConfig(method=DflashMethodConfig(), model=ModelConfig())) == []
    bad = PardTrainConfig(method=PardMethodConfig(), model=ModelConfig(), pard_keep_ratio=0.0, mask_token_id=-1)
    assert check_train_config(bad) == ["pard_keep_ratio=0.0 must be in (0, 1]", "mask_token_id=-1 must be >= 0"]
    bad = DflashTrainConfig(method=DflashMethodConfig(), model=ModelConfig(), dflash_anchors=0)
    assert check_train_config(bad) == ["dflash_anchors=0 must be >= 1"]


def test_default_mask_token_id() -> None:
    named = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "unk_token_id": None, "mask_token_id": None}

    def tokenizer(size: int, **fields):
        added = {i: SimpleNamespace(special=True) for i in range(17)}
        return type("Tok", (), {"__len__": lambda self: size, "all_special_ids": [1, 2, 0],
                                "added_tokens_decoder": added, **named, **fields})()

    assert default_mask_token_id(tokenizer(49152), 49152) == 16  # SmolLM2: <empty_output>
    assert default_mask_token_id(tokenizer(151665), 151936) == 151665  # Qwen: the first padding row
    assert default_mask_token_id(tokenizer(49152, mask_token_id=7), 49152) == 7
    assert default_mask_token_id(None, 16) == 15


def test_pard_init_from_a_draft_model_keeps_its_weights_freezes_the_shared_embedding_and_ships_by_reference(
        target, sequences, tmp_path: Path) -> None:
    """PARD adapts an existing causal LM: ``init_from`` starts from its weights; tensors equal to the target's
    stay frozen through training and are shipped by reference (filled from the target at load time)."""
    start = new_draft_model(target, 1)
    with torch.no_grad():
        start.layers[0].mlp.up_proj.weight.mul_(1.25)
    save_draft_model(start, tmp_path / "start")
    cfg = PardTrainConfig(method=PardMethodConfig(num_draft_tokens=3), model=ModelConfig(),
                          init_from=str(tmp_path / "start"))
    task = TRAINERS.get("pard").build_task(cfg, TaskInputs(target, None, sequences, 20, None))
    assert isinstance(task, PardTask) and (task.mask_token_id, task.depth) == (MASK, 3)
    assert torch.equal(task.model.layers[0].mlp.up_proj.weight, start.layers[0].mlp.up_proj.weight)
    assert not task.model.embed_tokens.weight.requires_grad and task.model.layers[0].mlp.up_proj.weight.requires_grad

    make_trainer(task, target, sequences, tmp_path / "run", steps=6).run()
    assert torch.equal(task.model.embed_tokens.weight, target.embed_tokens.weight)
    assert not torch.equal(task.model.layers[0].mlp.up_proj.weight, start.layers[0].mlp.up_proj.weight)
    (tmp_path / "run" / "pard").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "run" / "pard" / name).write_bytes((tmp_path / "run" / "draft" / name).read_bytes())
    (tmp_path / "run" / "train.json").write_text(json.dumps({"steps": 6, "wall_s": 1.0, "trained_tokens": 9,
                                                             "eval": {"acceptance_length": 1.2}}))
    dest = ship_module.ship("pard", tmp_path / "run", "cmd", dest=tmp_path / "ship", target=target)
    from safetensors.torch import load_file

    assert "model.embed_tokens.weight" not in load_file(str(dest / "model.safetensors"))
    with pytest.raises(Exception, match="shares"):
        load_pard(dest)
    loaded, mask = load_pard(dest, target=target)
    assert mask == MASK and torch.equal(loaded.embed_tokens.weight, target.embed_tokens.weight)
    torch.testing.assert_close(loaded.layers[0].mlp.up_proj.weight, task.model.layers[0].mlp.up_proj.weight.half().float())


def test_dflash_init_from_a_checkpoint_keeps_its_weights_with_the_trained_block_size(target, sequences,
                                                                                    tmp_path: Path) -> None:
    start = init_dflash(target, (0, 1), mask_token_id=MASK, num_layers=1, block_size=9, seed=3)
    save_dflash(start, tmp_path / "start")
    cfg = DflashTrainConfig(method=DflashMethodConfig(num_draft_tokens=2), model=ModelConfig(),
                            init_from=str(tmp_path / "start"))
    task = TRAINERS.get("dflash").build_task(cfg, TaskInputs(target, None, sequences, 20, None))
    assert isinstance(task, DflashTask)
    draft = task.draft
    assert (draft.block_size, draft.mask_token_id, draft.target_layers) == (3, MASK, (0, 1))
    assert draft.fc.weight.requires_grad and torch.equal(draft.fc.weight, start.fc.weight)


def test_init_from_is_refused_where_it_is_not_read_and_other_methods_fields_are_ignored(tmp_path: Path) -> None:
    schemas = train_schemas()
    flat = train_root_schema(schemas)(method=DraftTargetMethodConfig(), model=ModelConfig(), init_from=str(tmp_path),
                                      threads=-1, pard_layers=3)
    cfg, problems = narrow(flat, schemas)
    assert type(cfg) is DraftTargetTrainConfig and not hasattr(cfg, "pard_layers")
    assert problems + check_train_config(cfg) == [
        "init_from is read by mtp, eagle3, pard, dflash only, not method=draft_target",
        "threads=-1 must be >= 0 (0: every core)"]
    missing = PardTrainConfig(method=PardMethodConfig(), model=ModelConfig(), init_from=str(tmp_path))
    assert check_train_config(missing) == [f"init_from={tmp_path}: no config.json there (a checkpoint directory is expected)"]

"""``specdec train``: a Hydra app whose typos and bad values are errors; the whole pipeline on the toy."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec_cli.config.methods import TABLE, trainable_methods
from specdec_cli.config.schema import ModelConfig, TrainConfig
from specdec_cli.config.train_root import narrow, train_root_schema
from specdec_cli.drafters.dflash import load_dflash
from specdec_cli.drafters.eagle3 import load_eagle3
from specdec_cli.drafters.pard import load_pard
from specdec_cli.testing import toy_model
from specdec_cli.train import pipeline
from specdec_cli.train.data import _save_shard
from specdec_cli.train.methods import TRAINERS, train_schemas
from specdec_cli.train.pipeline import check_train_config

from cli_runner import run_cli_main as specdec

QUIET = ("hydra/job_logging=disabled", "hydra/hydra_logging=disabled")


@pytest.mark.parametrize("args,expected", [
    (["method=ngram"], [f"error: method=ngram: specdec train supports {', '.join(trainable_methods())}"]),
    (["method=pard", "pard_keep_ratio=0"], ["error: pard_keep_ratio=0.0 must be in (0, 1]"]),
    (["method=medusa"], ["error: method=medusa: no such option (choose one of: "]),
    (["stepz=5"], ["error: Could not override 'stepz'"]),
    (["+learning_rate=1"], ["error: learning_rate is not a field of TrainConfig"]),
    (["steps=0", "lr=-1"], ["error: steps=0 must be >= 1", "error: lr=-1.0 must be > 0"]),
    (["method=eagle3", "tv_weight=-1"], ["error: tv_weight=-1.0 must be >= 0"]),
    (["corpus.extra_dirs=[/nonexistent/corpus]"],
     ["error: corpus.extra_dirs: /nonexistent/corpus holds no corpus shards (shard_*.npz)"]),
])
def test_bad_train_configs_exit_2_with_one_line_each(monkeypatch, capsys, tmp_path: Path, args, expected) -> None:
    code, _, err = specdec(monkeypatch, capsys, "train", *args, f"hydra.run.dir={tmp_path}", *QUIET)
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == len(expected) and all(line.startswith(e) for line, e in zip(lines, expected)), err


@pytest.mark.parametrize("method", trainable_methods())
def test_every_trainable_method_has_a_trainer_and_its_own_schema(method: str) -> None:
    schemas = train_schemas()
    assert set(TRAINERS.names()) == set(schemas) and issubclass(schemas[method], TrainConfig)
    flat = train_root_schema(schemas)(method=TABLE[method].schema(), model=ModelConfig())
    cfg, problems = narrow(flat, schemas)
    assert type(cfg) is schemas[method] and problems == [] and check_train_config(cfg) == []


def test_cfg_job_prints_the_composed_train_config(monkeypatch, capsys) -> None:
    code, out, _ = specdec(monkeypatch, capsys, "train", "method=mtp", "ttt_steps=4", "--cfg", "job")
    assert code == 0 and "name: mtp" in out and "ttt_steps: 4" in out and "draft_vocab_size: 8192" in out


@pytest.fixture
def toy_corpus(tmp_path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 16, (4,), generator=generator).tolist() for _ in range(20)]
    responses = [torch.randint(0, 16, (14,), generator=generator).tolist() for _ in range(20)]
    (tmp_path / "corpus").mkdir()
    _save_shard(tmp_path / "corpus" / "shard_00000.npz", prompts, responses, [i >= 16 for i in range(20)])
    return tmp_path / "corpus"


def test_train_pipeline_end_to_end_and_resume(monkeypatch, capsys, tmp_path: Path, toy_corpus: Path) -> None:
    target = toy_model(0, vocab_size=16, num_layers=2)
    monkeypatch.setattr(pipeline, "load_model", lambda *args, **kwargs: (target, None))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    common = ["train", "method=eagle3", "method.target_layers=[0,1,1]", f"corpus.dir={toy_corpus}",
              "corpus.generate=never", "draft_vocab_size=12", "batch_size=4", "eval_every=3", "checkpoint_every=3",
              f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path}", *QUIET]
    code, out, err = specdec(monkeypatch, capsys, *common, "steps=3")
    assert code == 0, err
    assert "16 training sequences" in out and "4 held-out" in out and "greedy acceptance length" in out
    sampled = json.loads((tmp_path / "run" / "train.json").read_text())["eval"]["sampled_acceptance_length"]
    assert f"T=1 {sampled:.3f}" in out  # the expected T=1 chain length, in the summary table too
    assert len(list((tmp_path / "cache" / "features").glob("*/features.npy"))) == 1
    head = load_eagle3(tmp_path / "run" / "eagle3", target)
    assert head.draft_vocab_size == 12 and head.hidden_layers == (0, 1, 1)
    code, out, err = specdec(monkeypatch, capsys, *common, "steps=6")
    assert code == 0, err
    assert "resumed from" in out and "at step 3" in out
    summary = json.loads((tmp_path / "run" / "train.json").read_text())
    assert summary["steps"] == 6
    # the draft vocabulary's coverage of the response tokens, by hand from the corpus
    inside = torch.zeros(16, dtype=torch.bool)
    inside[torch.arange(12) + head.d2t] = True
    shard = np.load(toy_corpus / "shard_00000.npz")
    responses = torch.from_numpy(shard["response_ids"].astype(np.int64)).split(shard["response_lens"].tolist())
    held = shard["held_out"].tolist()
    for key, split in (("train", False), ("held_out", True)):
        picked = torch.cat([r for r, h in zip(responses, held) if h == split])
        assert summary["draft_vocab"][key] == pytest.approx(float(inside[picked].float().mean()))
        assert f"{100 * summary['draft_vocab'][key]:.1f}%" in out
    assert summary["draft_vocab"]["size"] == 12 and "draft vocabulary: 12 ids" in out


def test_extra_corpus_dirs_train_first_and_evaluate_after(monkeypatch, capsys, tmp_path: Path,
                                                          toy_corpus: Path) -> None:
    """``corpus.extra_dirs``: their training sequences join (and come first, so max_sequences cuts corpus.dir's),
    their held-out ones follow corpus.dir's; the draft vocabulary is counted over the union."""
    target = toy_model(0, vocab_size=16, num_layers=2)
    monkeypatch.setattr(pipeline, "load_model", lambda *args, **kwargs: (target, None))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    extra = tmp_path / "extra"
    extra.mkdir()
    _save_shard(extra / "shard_00000.npz", [[1, 2, 3]] * 6, [[15] * 12] * 6, [False] * 5 + [True])
    common = ["train", "method=eagle3", "method.target_layers=[0,1,1]", f"corpus.dir={toy_corpus}",
              f"corpus.extra_dirs=[{extra}]", "corpus.generate=never", "draft_vocab_size=4", "batch_size=4",
              "steps=1", f"hydra.run.dir={tmp_path}", *QUIET]
    code, out, err = specdec(monkeypatch, capsys, *common, f"out_dir={tmp_path / 'all'}")
    assert code == 0, err
    assert "21 training sequences" in out and "5 held-out" in out
    summary = json.loads((tmp_path / "all" / "train.json").read_text())
    assert summary["corpus"]["extra_dirs"] == [str(extra)]
    head = load_eagle3(tmp_path / "all" / "eagle3", target)
    assert 15 in (torch.arange(4) + head.d2t).tolist()  # the extra corpus's only response token is drafted
    code, out, err = specdec(monkeypatch, capsys, *common, "corpus.max_sequences=5", f"out_dir={tmp_path / 'cut'}")
    assert code == 0, err
    assert "5 training sequences (60 response tokens)" in out  # the five extra ones, none of corpus.dir's


@pytest.mark.parametrize("method", ["pard", "dflash"])
def test_train_pipeline_block_methods(monkeypatch, capsys, tmp_path: Path, toy_corpus: Path, method: str) -> None:
    """pard / dflash through the whole pipeline: a loadable artifact (toy target: no tokenizer, so the mask
    token is the last vocabulary row), then a resumed run."""
    target = toy_model(0, vocab_size=16, num_layers=2)
    monkeypatch.setattr(pipeline, "load_model", lambda *args, **kwargs: (target, None))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    common = ["train", f"method={method}", "method.num_draft_tokens=2", f"corpus.dir={toy_corpus}",
              "corpus.generate=never", "batch_size=4", "eval_every=3", "checkpoint_every=3", "pard_hidden_size=16",
              "dflash_layers=1", "dflash_anchors=4", f"out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path}",
              *QUIET]
    code, out, err = specdec(monkeypatch, capsys, *common, "steps=3")
    assert code == 0, err
    assert "greedy acceptance length" in out
    if method == "pard":
        model, mask = load_pard(tmp_path / "run" / "pard")
        assert mask == 15 and model.arch.num_layers == 4 and model.arch.hidden_size == 16
    else:
        draft = load_dflash(tmp_path / "run" / "dflash", target)
        assert draft.target_layers == (0, 1) and draft.block_size == 3 and draft.mask_token_id == 15
    code, out, err = specdec(monkeypatch, capsys, *common, "steps=4")
    assert code == 0, err
    assert "resumed from" in out and "at step 3" in out

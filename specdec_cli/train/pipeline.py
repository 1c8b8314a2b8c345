"""``specdec train``'s job: a typed ``TrainConfig`` -> corpus -> features -> training -> artifact.

  1. corpus    the target's answers to generated prompts (``train.data``, ``data/distill/<model>`` by
               default): reused when present, generated when empty (``corpus.generate``); training
               uses the training split only, evaluation the held-out split
  2. features  the target's hidden states for every corpus token (``train.features``)
  3. training  the method's objective (``TRAINERS``: ``train/methods/<method>.py`` builds its ``Task``)
               under ``train.trainer`` (resumable), artifact in out_dir/<method>
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec_cli.config.compose import conf_dir
from specdec_cli.config.methods import trainable_methods
from specdec_cli.config.schema import TrainConfig
from specdec_cli.errors import ConfigError
from specdec_cli.files import atomic_write_json
from specdec_cli.models import load_model
from specdec_cli.models.loading import COMPUTE_DTYPES, EMBEDDED_NAME
from specdec_cli.sampling import draft_ids_of
from specdec_cli.train.data import CorpusSpec, generate_corpus, load_corpus
from specdec_cli.train.features import (
    CachedFeatures,
    FeatureExtractor,
    OnlineFeatures,
    Sequences,
    feature_cache_dir,
    target_fingerprint,
)
from specdec_cli.train.methods import TRAINERS, TaskInputs
from specdec_cli.train.methods.base import shared_layers
from specdec_cli.train.trainer import Trainer, TrainOptions

TRAINABLE_DTYPES = ("float32", "bfloat16")  # a target the heads learn from computes in full precision
GENERATE = ("if_empty", "complete", "never")
POSITIVE = ("steps", "batch_size", "checkpoint_every", "eval_sequences")


def check_train_config(cfg: TrainConfig) -> list[str]:
    """Every violated rule of a train config (the common fields', then its method's), one line each."""
    out = []
    trainable = trainable_methods()
    if cfg.method.name not in trainable:
        out.append(f"method={cfg.method.name}: specdec train supports {', '.join(trainable)}")
    for name in POSITIVE:
        if getattr(cfg, name) < 1:
            out.append(f"{name}={getattr(cfg, name)} must be >= 1")
    for extra in cfg.corpus.extra_dirs:
        if not any(Path(extra).expanduser().glob("shard_*.npz")):
            out.append(f"corpus.extra_dirs: {extra} holds no corpus shards (shard_*.npz)")
    if cfg.corpus.generate not in GENERATE:
        out.append(f"corpus.generate={cfg.corpus.generate} is not one of: {', '.join(GENERATE)}")
    if cfg.method.num_draft_tokens < 1:
        out.append(f"method.num_draft_tokens={cfg.method.num_draft_tokens} (the evaluated chain length) must be >= 1")
    if not cfg.lr > 0:
        out.append(f"lr={cfg.lr} must be > 0")
    if not 0 <= cfg.min_lr_ratio <= 1:
        out.append(f"min_lr_ratio={cfg.min_lr_ratio} must be in [0, 1]")
    if cfg.warmup_steps < 0 or cfg.weight_decay < 0 or not cfg.grad_clip > 0:
        out.append("warmup_steps and weight_decay must be >= 0, grad_clip > 0")
    if cfg.model.dtype not in TRAINABLE_DTYPES:
        out.append(f"model.dtype={cfg.model.dtype} is not one of: {', '.join(TRAINABLE_DTYPES)}")
    if cfg.model.device not in ("auto", "cpu", "cuda"):
        out.append(f"model.device={cfg.model.device} is not one of: auto, cpu, cuda")
    elif cfg.model.device == "cuda" and not torch.cuda.is_available():
        out.append("model.device=cuda but no CUDA device is available")
    if cfg.model.name == "hf" and not cfg.model.path:
        out.append("model=hf needs model.path=<HF directory or .gguf file>")
    if cfg.model.path and not Path(cfg.model.path).expanduser().exists():
        out.append(f"model.path={cfg.model.path} does not exist")
    if cfg.threads < 0:
        out.append(f"threads={cfg.threads} must be >= 0 (0: every core)")
    if cfg.method.name in trainable and isinstance(cfg, TRAINERS.get(cfg.method.name).schema):
        out += TRAINERS.get(cfg.method.name).check(cfg)
    return out


def corpus_dir(cfg: TrainConfig) -> Path:
    """``corpus.dir``, else ``data/distill/<model name>`` in the checkout."""
    if cfg.corpus.dir:
        return Path(cfg.corpus.dir).expanduser()
    name = Path(cfg.model.path).stem if cfg.model.path else cfg.model.name
    return conf_dir().parent / "data" / "distill" / name


def resumed_vocabulary(out_dir: Path, resume: bool) -> Optional[torch.Tensor]:
    """The draft vocabulary of the checkpoint a run resumes from (so that it never changes mid-training)."""
    path = out_dir / "state.pt"
    if not (resume and path.is_file()):
        return None
    d2t = torch.load(path, map_location="cpu", weights_only=True)["module"].get("d2t")
    return None if d2t is None else torch.arange(d2t.numel()) + d2t


def run_training(cfg: TrainConfig, out_dir: Path, *, console: Optional[Console] = None) -> dict[str, Any]:
    """Run the three stages; returns the trainer's summary (also in out_dir/train.json)."""
    console = console or Console()

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    torch.set_num_threads(cfg.threads or max(1, os.cpu_count() or 1))
    torch.manual_seed(cfg.seed)
    device = torch.device("cuda" if cfg.model.device == "cuda" or (
        cfg.model.device == "auto" and torch.cuda.is_available()) else "cpu")
    target, tokenizer = load_model(cfg.model.path, dtype=COMPUTE_DTYPES[cfg.model.dtype], device=device)
    directory = corpus_dir(cfg)
    empty = not any(directory.glob("shard_*.npz"))
    if cfg.corpus.generate == "complete" or (cfg.corpus.generate == "if_empty" and empty):
        spec = CorpusSpec(num_prompts=cfg.corpus.num_prompts, batch_size=cfg.corpus.batch_size,
                          max_new_tokens=cfg.corpus.max_new_tokens)
        generate_corpus(target, tokenizer, directory, spec, time_budget_s=cfg.corpus.time_budget_s, log=say)
    train_pairs, eval_pairs = load_corpus(directory, held_out=False), load_corpus(directory, held_out=True)
    if not train_pairs:
        raise ConfigError([f"corpus.dir={directory}: no training sequences (generate them: corpus.generate=complete)"])
    extras = [Path(extra).expanduser() for extra in cfg.corpus.extra_dirs]
    train_pairs = [pair for extra in extras for pair in load_corpus(extra, held_out=False)] + train_pairs
    eval_pairs += [pair for extra in extras for pair in load_corpus(extra, held_out=True)]
    if cfg.corpus.max_sequences > 0:
        train_pairs = train_pairs[: cfg.corpus.max_sequences]
    eval_pairs = eval_pairs[: cfg.eval_sequences]
    sequences = Sequences.from_pairs(train_pairs + eval_pairs)
    say(f"corpus {', '.join(map(str, [directory, *extras]))}: {len(train_pairs)} training sequences "
        f"({sum(len(r) for _, r in train_pairs)} response tokens), {len(eval_pairs)} held-out")
    inputs = TaskInputs(target, tokenizer, sequences, len(train_pairs), resumed_vocabulary(out_dir, cfg.resume))
    task = TRAINERS.get(cfg.method.name).build_task(cfg, inputs)
    vocab = draft_vocab_coverage(getattr(task.module, "d2t", None), sequences, len(train_pairs), target.arch.vocab_size)
    if vocab is not None:
        say(f"draft vocabulary: {vocab['size']} ids, covering {100 * vocab['train']:.1f}% of the training and "
            f"{100 * vocab['held_out']:.1f}% of the held-out response tokens (others can never be drafted)")
    # one feature cache serves every method: EAGLE-3's default layers are stored even when not read
    layers = task.feature_layers or shared_layers(target)
    extractor = FeatureExtractor(target, layers, max(t.numel() for t in sequences.tokens))
    if cfg.feature_cache:
        name = cfg.model.path or EMBEDDED_NAME
        cache = feature_cache_dir(target_fingerprint(target, str(name)), layers, sequences)
        features: Any = _cached_features(extractor, sequences, cache, console)
    else:
        features = OnlineFeatures(extractor, sequences)
    options = TrainOptions(
        steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup_steps=cfg.warmup_steps,
        min_lr_ratio=cfg.min_lr_ratio, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip,
        eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, eval_k=cfg.method.num_draft_tokens,
        resume=cfg.resume, time_budget_s=cfg.time_budget_s, seed=cfg.seed,
    )
    trainer = Trainer(task, features, sequences, train_indices=list(range(len(train_pairs))),
                      eval_indices=list(range(len(train_pairs), len(sequences))), options=options, out_dir=out_dir,
                      artifact=cfg.method.name, hidden_size=target.arch.hidden_size, device=device, console=console)
    summary = trainer.run()
    if vocab is not None:
        summary["draft_vocab"] = vocab
    summary["corpus"] = {"dir": str(directory), "extra_dirs": [str(extra) for extra in extras],
                         "train_sequences": len(train_pairs), "held_out_sequences": len(eval_pairs),
                         "train_response_tokens": sum(len(r) for _, r in train_pairs)}
    atomic_write_json(out_dir / "train.json", summary)
    return summary


def draft_vocab_coverage(d2t: Optional[torch.Tensor], sequences: Sequences, num_train: int,
                         vocab_size: int) -> Optional[dict[str, Any]]:
    """{size, train, held_out}: the share of the training / held-out response tokens inside a reduced draft
    vocabulary (``d2t`` [Vd]); None for a drafter over the whole vocabulary."""
    if d2t is None or d2t.numel() >= vocab_size:
        return None
    inside = draft_ids_of(d2t, d2t.numel(), vocab_size) >= 0

    def share(indices: range) -> float:
        responses = [sequences.tokens[i][sequences.prompt_lens[i]:] for i in indices]
        total = sum(r.numel() for r in responses)
        return sum(int(inside[r].sum()) for r in responses) / total if total else 0.0

    return {"size": d2t.numel(), "train": share(range(num_train)), "held_out": share(range(num_train, len(sequences)))}


def _cached_features(extractor: FeatureExtractor, sequences: Sequences, directory: Path,
                     console: Console) -> CachedFeatures:
    """Fill (or reuse) the feature cache with a progress bar."""
    total = sum(t.numel() for t in sequences.tokens)
    with Progress(TextColumn("[bold]target features"), BarColumn(), TextColumn("{task.completed}/{task.total} tokens"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
        bar = progress.add_task("features", total=total)
        return CachedFeatures(extractor, sequences, directory, progress=lambda n: progress.advance(bar, n))

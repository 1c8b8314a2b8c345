"""Where a feature head loses: the trainer's evaluation on training rows, held-out rows and held-out families.

Usage: .venv/bin/python benchmarks/bench_head_rows.py [--checkpoint DIR] [--wide-vocab N] [--corpus DIR]

Scores one EAGLE-3 head (default: the shipped one) with ``Trainer.evaluate`` (teacher-forced chains of K at every
response position: top-1, greedy acceptance length, expected T=1 acceptance length) on four row sets of the v2
corpus: rows it was trained on, held-out rows of the trained families, and each family held out whole; with the
share of each set's response tokens inside the head's draft vocabulary. A training/held-out gap says the head
overfits; a held-out family far below the trained families says the data does not cover it; everything level
but low says the head lacks capacity. ``--wide-vocab N`` first widens the draft vocabulary to N ids (the head's
own plus the lowest-id BPE merges, rows for new ids the target's, as ``revocab`` starts them).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec_cli.drafters.eagle3 import Eagle3Head, load_eagle3
from specdec_cli.drafters.learned import shipped_checkpoint
from specdec_cli.models import load_model
from specdec_cli.sampling.vocab import draft_to_target_ids
from specdec_cli.train.corpus.shards import load_corpus
from specdec_cli.train.features import FeatureExtractor, OnlineFeatures, Sequences
from specdec_cli.train.heads import revocab_eagle3
from specdec_cli.train.tasks import HeadTask
from specdec_cli.train.trainer import Trainer, TrainOptions

CORPUS = Path(__file__).resolve().parents[1] / "data" / "distill" / "smollm2_135m_v2"


def row_sets(corpus: Path, rows: int) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Name -> (prompt, response) pairs, spread evenly over each split."""
    spec = json.loads((corpus / "spec.json").read_text())
    held_out = spec["held_out_families"]
    trained = [family for family in spec["families"] if family not in held_out]

    def spread(pairs: list) -> list:
        return pairs[:: max(1, len(pairs) // rows)][:rows]

    sets = {"training rows": spread(load_corpus(corpus, held_out=False)),
            "held-out rows of the trained families": spread(load_corpus(corpus, held_out=True, family=trained))}
    for family in held_out:
        sets[f"held-out family `{family}`"] = spread(load_corpus(corpus, held_out=True, family=family))
    return sets


def in_vocabulary(head: Eagle3Head, vocab_size: int) -> torch.Tensor:
    """[V] bool: the target ids the head can draft."""
    member = torch.zeros(vocab_size, dtype=torch.bool)
    member[draft_to_target_ids(torch.arange(head.draft_vocab_size), head.d2t.cpu())] = True
    return member


def widen(head: Eagle3Head, target, size: int) -> Eagle3Head:
    """``head`` over ``size`` draft ids: its own plus the lowest-id tokens it lacks (untrained rows)."""
    member = in_vocabulary(head, target.arch.vocab_size)
    member[(~member).nonzero().flatten()[: max(0, size - int(member.sum()))]] = True
    return revocab_eagle3(head, target, member.nonzero().flatten())


def evaluate(head: Eagle3Head, target, pairs: list, k: int) -> dict:
    sequences = Sequences.from_pairs(pairs)
    extractor = FeatureExtractor(target, head.hidden_layers, max(t.numel() for t in sequences.tokens))
    options = TrainOptions(steps=0, batch_size=16, lr=0.0, warmup_steps=0, min_lr_ratio=0.0, weight_decay=0.0,
                           grad_clip=1.0, eval_every=0, checkpoint_every=0, eval_k=k, resume=False)
    trainer = Trainer(HeadTask(head, target, steps=3, step_weight=0.8), OnlineFeatures(extractor, sequences),
                      sequences, train_indices=[], eval_indices=list(range(len(sequences))), options=options,
                      out_dir=Path("/nonexistent"), artifact="eagle3", hidden_size=target.arch.hidden_size,
                      device=torch.device("cpu"))
    return trainer.evaluate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default=None, help="an EAGLE-3 head directory (default: the shipped one)")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--rows", type=int, default=96, help="sequences per row set")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--wide-vocab", type=int, default=0, help="widen the draft vocabulary to this many ids")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, _ = load_model(None)
    head = load_eagle3(args.checkpoint or shipped_checkpoint("eagle3", "checkpoint"), target)
    if args.wide_vocab:
        head = widen(head, target, args.wide_vocab)
    in_vocab = in_vocabulary(head, target.arch.vocab_size)
    print(f"head {args.checkpoint or 'shipped'}, {head.draft_vocab_size} draft ids, K={args.k}, corpus {args.corpus}\n")
    print("| rows | sequences | anchors | top-1 | greedy acceptance | expected T=1 acceptance | draft-vocabulary "
          "coverage |\n|---|---|---|---|---|---|---|")
    for name, pairs in row_sets(args.corpus, args.rows).items():
        start = time.perf_counter()
        stats = evaluate(head, target, pairs, args.k)
        coverage = in_vocab[torch.tensor([t for _, response in pairs for t in response])].float().mean()
        print(f"| {name} | {len(pairs)} | {stats['anchors']:,} | {stats['top1']:.3f} | "
              f"{stats['acceptance_length']:.3f} | {stats['sampled_acceptance_length']:.3f} | "
              f"{100 * coverage:.1f}% |  <!-- {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()

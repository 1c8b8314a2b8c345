"""The training loop: AdamW with warmup + cosine decay, periodic held-out evaluation, checkpoints.

``out_dir`` holds ``state.pt`` (module, optimiser, step: what resuming needs), ``metrics.jsonl``
(one line per logged step and per evaluation), ``train.json`` (the summary) and the loadable
artifact in ``out_dir/<artifact>``, rewritten at every checkpoint so an interrupted run still leaves
a usable drafter. The batch of step s depends only on (seed, s), so a resumed run sees the same data.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from specdec_cli.files import atomic_write_json
from specdec_cli.train.features import Sequences
from specdec_cli.train.tasks import Batch, Task, chain_stats, sampled_chain_length, teacher_argmax

LOG_EVERY = 10


class FeatureSource(Protocol):
    def get(self, indices: Sequence[int]) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class TrainOptions:
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float
    weight_decay: float
    grad_clip: float
    eval_every: int
    checkpoint_every: int
    eval_k: int
    resume: bool
    time_budget_s: Optional[float] = None
    seed: int = 0


def learning_rate(step: int, options: TrainOptions) -> float:
    """Linear warmup to ``lr``, then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    if step < options.warmup_steps:
        return options.lr * (step + 1) / options.warmup_steps
    span = max(1, options.steps - options.warmup_steps)
    progress = min(1.0, (step - options.warmup_steps) / span)
    floor = options.lr * options.min_lr_ratio
    return floor + (options.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class Trainer:
    """Trains ``task.module`` on the sequences at ``train_indices`` and evaluates it on those at
    ``eval_indices`` (held out); ``features.get(indices)`` gives their target features."""

    def __init__(self, task: Task, features: FeatureSource, sequences: Sequences, *, train_indices: list[int],
                 eval_indices: list[int], options: TrainOptions, out_dir: Path, artifact: str,
                 hidden_size: int, device: torch.device, console: Optional[Console] = None) -> None:
        self.task, self.features, self.sequences = task, features, sequences
        self.train_indices, self.eval_indices = train_indices, eval_indices
        self.options, self.out_dir, self.artifact = options, out_dir, artifact
        self.hidden_size, self.device = hidden_size, device
        self.console = console or Console()
        self.params = [p for p in task.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=options.lr, betas=(0.9, 0.95),
                                           weight_decay=options.weight_decay)
        self.step = 0
        self._eval_batches: Optional[list[Batch]] = None
        self._perms: dict[int, torch.Tensor] = {}

    # ------------------------------------------------------------------ data
    def batch(self, indices: Sequence[int]) -> Batch:
        return Batch.collate([self.sequences.tokens[i] for i in indices], self.features.get(indices),
                             [self.sequences.prompt_lens[i] for i in indices], hidden_size=self.hidden_size,
                             pad=self.task.pad, device=self.device)

    def indices_for(self, step: int) -> list[int]:
        """The training sequences of ``step``: consecutive slices of seeded per-epoch permutations."""
        count, out = len(self.train_indices), []
        for sample in range(step * self.options.batch_size, (step + 1) * self.options.batch_size):
            epoch = sample // count
            if epoch not in self._perms:  # only the current epoch's permutation is kept
                self._perms = {epoch: torch.randperm(count, generator=torch.Generator().manual_seed(
                    self.options.seed * 100_003 + epoch))}
            out.append(self.train_indices[int(self._perms[epoch][sample % count])])
        return out

    # ------------------------------------------------------------------ state
    def resume(self) -> bool:
        """Load ``state.pt`` if resuming is on and it exists; True when resumed."""
        path = self.out_dir / "state.pt"
        if not (self.options.resume and path.is_file()):
            return False
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.task.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        return True

    def checkpoint(self) -> None:
        self.task.save(self.out_dir / self.artifact)
        tmp = self.out_dir / ".state.pt.tmp"
        torch.save({"step": self.step, "module": self.task.module.state_dict(),
                    "optimizer": self.optimizer.state_dict()}, tmp)
        os.replace(tmp, self.out_dir / "state.pt")

    def log(self, record: dict[str, Any]) -> None:
        with open(self.out_dir / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Greedy chain statistics (``chain_stats``) over the held-out sequences, and the expected T=1 chain
        length (``sampled_acceptance_length``) where the task estimates it."""
        if self._eval_batches is None:
            size = self.options.batch_size
            self._eval_batches = [self.batch(self.eval_indices[i : i + size])
                                  for i in range(0, len(self.eval_indices), size)]
            for batch in self._eval_batches:
                batch.teacher_argmax = teacher_argmax(batch.final(0), self.task.teacher_full_weight)
        k = self.options.eval_k
        self.task.module.eval()
        results = [self.task.evaluation(batch, k) for batch in self._eval_batches]
        self.task.module.train()
        match = torch.cat([m.reshape(-1, k) for m, _, _ in results])
        valid = torch.cat([v.reshape(-1, k) for _, v, _ in results])
        probs = [p for _, _, p in results]
        stats = chain_stats(match, valid)
        if all(p is not None for p in probs):
            stats["sampled_acceptance_length"] = sampled_chain_length(torch.cat([p.reshape(-1, k) for p in probs]),
                                                                      valid)
        return stats

    def _report(self, stats: dict[str, Any], progress: Progress) -> None:
        self.log({"step": self.step, "eval": stats})
        conditional = "/".join(f"{a:.2f}" for a in stats["conditional"])
        sampled = (f"; T=1 acceptance length {stats['sampled_acceptance_length']:.3f}"
                   if "sampled_acceptance_length" in stats else "")
        progress.console.print(f"step {self.step}: held-out top-1 {stats['top1']:.3f}, greedy acceptance length "
                               f"{stats['acceptance_length']:.3f} (K={self.options.eval_k}; per step {conditional}; "
                               f"{stats['anchors']} anchors)" + sampled, markup=False, highlight=False, soft_wrap=True)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        options = self.options
        self.out_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.resume()
        start, anchors, stats, evaluated_at = time.perf_counter(), 0, None, -1
        columns = (TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                   TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[speed]:.0f} tok/s"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=False) as progress:
            if resumed:
                progress.console.print(f"resumed from {self.out_dir / 'state.pt'} at step {self.step}", markup=False,
                                       soft_wrap=True)
            bar = progress.add_task("train", total=options.steps, completed=self.step, loss=float("nan"), speed=0.0)
            if self.eval_indices and self.step == 0 and options.eval_every > 0:
                stats, evaluated_at = self.evaluate(), 0
                self._report(stats, progress)
            self.task.module.train()
            while self.step < options.steps:
                if options.time_budget_s is not None and time.perf_counter() - start > options.time_budget_s:
                    progress.console.print(f"time budget of {options.time_budget_s:.0f} s reached", markup=False,
                                           soft_wrap=True)
                    break
                batch = self.batch(self.indices_for(self.step))
                for group in self.optimizer.param_groups:
                    group["lr"] = learning_rate(self.step, options)
                loss, per_step = self.task.loss(batch)
                self.optimizer.zero_grad(set_to_none=True)
                if loss.requires_grad:  # false only for a batch without response tokens
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.params, options.grad_clip)
                    self.optimizer.step()
                self.step += 1
                anchors += int(batch.predicts_response(1).sum())
                speed = anchors / (time.perf_counter() - start)
                progress.update(bar, advance=1, loss=float(loss.detach()), speed=speed)
                if self.step % LOG_EVERY == 0 or self.step == options.steps:
                    self.log({"step": self.step, "loss": float(loss.detach()), "per_step": per_step,
                              "lr": learning_rate(self.step - 1, options), "tokens_per_s": speed})
                if self.eval_indices and options.eval_every > 0 and self.step % options.eval_every == 0:
                    stats, evaluated_at = self.evaluate(), self.step
                    self._report(stats, progress)
                if self.step % options.checkpoint_every == 0:
                    self.checkpoint()
            if self.eval_indices and evaluated_at != self.step:
                stats = self.evaluate()
                self._report(stats, progress)
        self.checkpoint()
        wall = time.perf_counter() - start
        summary = {"steps": self.step, "wall_s": wall, "trained_tokens": anchors,
                   "tokens_per_s": anchors / wall if wall > 0 else 0.0, "eval": stats,
                   "artifact": str(self.out_dir / self.artifact)}
        atomic_write_json(self.out_dir / "train.json", summary)
        return summary

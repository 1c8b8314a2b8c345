"""CUDA graphs for the decode-phase forwards (verify and the draft loop) at batch sizes <= 16.

A graph is captured per (batch bucket, tokens per row): the bucket is the smallest of ``BUCKETS`` that holds
the batch; unused rows of a replay point at the scratch slot (the KV cache's and the proposal buffer's extra
row), so padding never touches a live request. Inputs live in static buffers that a replay reads in place;
the KV slot buffers are captured in place (the graph writes the real cache tensors). Warm-up and capture run
on the scratch slot only (TensorRT-LLM's rule): capturing never changes a request's state. A shape that was not
captured (prefill chunks, ragged verifies, batches over 16) runs eagerly.

The captured callable must be static-shape and host-sync free: ``fn(static: StaticInputs) -> tuple[Tensor, ...]``
(each output [B * n, ...]) reading token ids [B, n], slot ids [B] and positions [B] (the first new token's
position) from device tensors. ``GraphedVerify`` is the engine's verify forward in that form
(``Transformer.forward_dense``); the draft loop still runs eagerly. Only ``GraphRunner.capture`` touches CUDA;
on CPU the same dense forward runs eagerly, which is how the tests check it against the ragged forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from specdec_cli.drafters.base import Drafter
from specdec_cli.models import ForwardOutput, KVCache, Transformer

BUCKETS = (1, 2, 4, 8, 16)


def resolve_cuda_graphs(setting: str, device: torch.device | str) -> bool:
    """``engine.cuda_graphs`` on a device: auto -> on with CUDA, off elsewhere (validation refused on + CPU)."""
    return setting == "on" or (setting == "auto" and torch.device(device).type == "cuda")


def bucket_for(batch_size: int, buckets: tuple[int, ...] = BUCKETS) -> Optional[int]:
    """The smallest captured batch size that holds ``batch_size``; None: run eagerly (0 or beyond the last)."""
    return next((b for b in buckets if b >= batch_size), None) if batch_size > 0 else None


@dataclass
class StaticInputs:
    """A replay's inputs, in place: token_ids [B, n] int64, slots [B] int64, positions [B] int64 (device)."""

    token_ids: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def allocate(cls, bucket: int, tokens_per_row: int, scratch_slot: int, device: torch.device | str) -> "StaticInputs":
        """Every row at the scratch slot, position 0 (what warm-up and capture run on)."""
        return cls(token_ids=torch.zeros(bucket, tokens_per_row, dtype=torch.int64, device=device),
                   slots=torch.full((bucket,), scratch_slot, dtype=torch.int64, device=device),
                   positions=torch.zeros(bucket, dtype=torch.int64, device=device))

    def fill(self, token_ids: torch.Tensor, slots: list[int], positions: list[int], scratch_slot: int) -> None:
        """Copy a batch of R <= B rows in (token_ids [R, n] on the device); rows R.. go to the scratch slot."""
        rows = token_ids.shape[0]
        bucket = self.token_ids.shape[0]
        if rows > bucket or token_ids.shape[1] != self.token_ids.shape[1]:
            raise ValueError(f"batch [{rows}, {token_ids.shape[1]}] does not fit the static [{bucket}, "
                             f"{self.token_ids.shape[1]}] inputs")
        pad = bucket - rows
        device = self.slots.device
        self.token_ids[:rows].copy_(token_ids)
        self.token_ids[rows:].zero_()
        # one host->device copy each for slots and positions (non-blocking from pinned memory on CUDA)
        self.slots.copy_(torch.tensor(slots + [scratch_slot] * pad, dtype=torch.int64, device=device))
        self.positions.copy_(torch.tensor(positions + [0] * pad, dtype=torch.int64, device=device))


class GraphRunner:
    """Captured graphs of one static-shape function, keyed by (bucket, tokens per row); eager for the rest."""

    def __init__(self, fn: Callable[[StaticInputs], tuple[torch.Tensor, ...]], *, scratch_slot: int, device: torch.device,
                 enabled: bool, buckets: tuple[int, ...] = BUCKETS, warmup_iters: int = 2) -> None:
        self.fn, self.scratch_slot, self.device = fn, scratch_slot, torch.device(device)
        self.enabled = enabled and self.device.type == "cuda"
        self.buckets, self.warmup_iters = buckets, warmup_iters
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, StaticInputs, tuple[torch.Tensor, ...]]] = {}
        self.pool = None  # one memory pool shared by every captured graph
        self.replays = 0
        self.eager_runs = 0

    def capture(self, bucket: int, tokens_per_row: int) -> None:
        """Warm up on a side stream, then capture, both on the scratch slot only."""
        static = StaticInputs.allocate(bucket, tokens_per_row, self.scratch_slot, self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(self.warmup_iters):
                self.fn(static)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.fn(static)
        self.pool = graph.pool()
        self.graphs[(bucket, tokens_per_row)] = (graph, static, output)

    def __call__(self, token_ids: torch.Tensor, slots: list[int], positions: list[int]) -> tuple[torch.Tensor, ...]:
        """Rows of the batch -> fn's outputs for those rows (a graph replay where captured, else eager); a
        replay's outputs are copied out of the graph's static memory (the next replay overwrites it)."""
        rows, tokens_per_row = token_ids.shape
        bucket = bucket_for(rows, self.buckets) if self.enabled else None
        if bucket is None:
            self.eager_runs += 1
            return self.fn(StaticInputs(token_ids, torch.tensor(slots, dtype=torch.int64, device=token_ids.device),
                                        torch.tensor(positions, dtype=torch.int64, device=token_ids.device)))
        if (bucket, tokens_per_row) not in self.graphs:
            self.capture(bucket, tokens_per_row)
        graph, static, outputs = self.graphs[(bucket, tokens_per_row)]
        static.fill(token_ids, slots, positions, self.scratch_slot)
        graph.replay()
        self.replays += 1
        return tuple(out[: rows * tokens_per_row].clone() for out in outputs)


class GraphedVerify:
    """The engine's verify forward for decode batches of <= 16 rows with n tokens each, through a ``GraphRunner``.

    The cache must have one slot more than the engine hands out: the last is the scratch slot."""

    def __init__(self, target: Transformer, cache: KVCache, drafter: Optional[Drafter] = None) -> None:
        """``drafter``: the target features it reads come out of the verify too."""
        self.target, self.cache = target, cache
        self.hidden_layers = tuple(drafter.hidden_layers) if drafter is not None else ()
        self.final_hidden = bool(drafter is not None and drafter.needs_final_hidden)
        self.runner = GraphRunner(self._outputs, scratch_slot=cache.num_slots - 1, device=target.device, enabled=True)

    @staticmethod
    def fits(tokens: Sequence[Sequence[int]], num_logits: Sequence[int]) -> bool:
        """A batch the graphs serve: at most the last bucket of rows, all with the same count of tokens, all
        needing logits (a decode or verify step; prefill chunks run the ragged forward)."""
        return (bucket_for(len(tokens)) is not None and len({len(t) for t in tokens}) == 1
                and all(len(t) == n for t, n in zip(tokens, num_logits)))

    def __call__(self, slots: list[int], tokens: list[list[int]]) -> ForwardOutput:
        """``Transformer.forward`` for these rows (logits of every token), slot lengths advanced."""
        n = len(tokens[0])
        for slot in slots:
            self.cache.check_fits(slot, n)
        token_ids = torch.tensor(tokens, dtype=torch.int64, device=self.target.device)
        outputs = self.runner(token_ids, slots, [self.cache.length(slot) for slot in slots])
        for slot in slots:
            self.cache.advance(slot, n)
        hidden = dict(zip(self.hidden_layers, outputs[1:]))
        return ForwardOutput(logits=outputs[0], hidden=hidden, final_hidden=outputs[-1] if self.final_hidden else None)

    def _outputs(self, static: StaticInputs) -> tuple[torch.Tensor, ...]:
        out = self.target.forward_dense(self.cache, static.slots, static.positions, static.token_ids,
                                        hidden_layers=self.hidden_layers, final_hidden=self.final_hidden)
        return (out.logits, *(out.hidden[i] for i in self.hidden_layers),
                *((out.final_hidden,) if self.final_hidden else ()))

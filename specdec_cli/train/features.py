"""Stage 2 of self-distillation: the target's features of every corpus token.

A row of features for position p is ``cat(hidden[l] for l in layers) ++ final`` (the target's
layer outputs the drafter reads, then its post-norm final hidden, from which the training targets
p(x_{p+1} | x_{<=p}) are recomputed through the LM head). Features are computed in ragged batches
by the target's own runtime, either once into a float16 memmap under the specdec cache (resumable,
keyed by target, layers and corpus) or per training batch (``OnlineFeatures``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from specdec_cli.models import KVCache, Transformer
from specdec_cli.models.loading import cache_root
from specdec_cli.files import atomic_write_json

#: tokens per feature batch and most sequences per batch (bounds the scratch KV cache)
BATCH_TOKENS = 4096
BATCH_SEQUENCES = 16


@dataclass
class Sequences:
    """Corpus pairs as token streams: tokens[i] = prompt + response [L_i] int64, prompt_lens[i]."""

    tokens: list[torch.Tensor]
    prompt_lens: list[int]

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[list[int], list[int]]]) -> Sequences:
        return cls([torch.tensor(p + r, dtype=torch.int64) for p, r in pairs], [len(p) for p, _ in pairs])

    def __len__(self) -> int:
        return len(self.tokens)

    def digest(self) -> str:
        """A content hash of the streams (identifies a feature cache)."""
        sha = hashlib.sha1()
        for tokens, prompt_len in zip(self.tokens, self.prompt_lens):
            sha.update(np.int64(prompt_len).tobytes() + tokens.numpy().astype(np.int32).tobytes())
        return sha.hexdigest()


class FeatureExtractor:
    """The target forward that yields feature rows [L_i, F] for a group of sequences."""

    def __init__(self, target: Transformer, layers: Sequence[int], max_len: int) -> None:
        self.target, self.layers = target, tuple(layers)
        self.width = (len(self.layers) + 1) * target.arch.hidden_size
        self.cache: KVCache = target.new_cache(BATCH_SEQUENCES, max_len)

    @torch.inference_mode()
    def __call__(self, sequences: list[torch.Tensor]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for group in _groups([s.numel() for s in sequences]):
            slots = list(range(len(group)))
            for slot in slots:
                self.cache.rewind(slot, 0)
            output = self.target(self.cache, slots, [sequences[i] for i in group], logits_for=[0] * len(group),
                                 hidden_layers=self.layers, final_hidden=True)
            rows = torch.cat([output.hidden[layer] for layer in self.layers] + [output.final_hidden], dim=-1)
            out.extend(rows.split([sequences[i].numel() for i in group]))
        return out


def _groups(lengths: list[int]) -> list[list[int]]:
    """Consecutive index groups of at most BATCH_TOKENS tokens (one long sequence may exceed it)."""
    groups: list[list[int]] = [[]]
    total = 0
    for index, length in enumerate(lengths):
        if groups[-1] and (total + length > BATCH_TOKENS or len(groups[-1]) == BATCH_SEQUENCES):
            groups.append([])
            total = 0
        groups[-1].append(index)
        total += length
    return groups if groups[0] else []


class OnlineFeatures:
    """Features recomputed for every batch (no disk; for GPUs or one-pass runs)."""

    def __init__(self, extractor: FeatureExtractor, sequences: Sequences) -> None:
        self.extractor, self.sequences = extractor, sequences

    def get(self, indices: Sequence[int]) -> list[torch.Tensor]:
        return [rows.float() for rows in self.extractor([self.sequences.tokens[i] for i in indices])]


class CachedFeatures:
    """Features of every sequence in one float16 memmap ``[total tokens, F]``, filled once (resumable:
    ``done.json`` counts the sequences written so far)."""

    def __init__(self, extractor: FeatureExtractor, sequences: Sequences, directory: Path,
                 progress: Optional[Callable[[int], None]] = None) -> None:
        lengths = [t.numel() for t in sequences.tokens]
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        directory.mkdir(parents=True, exist_ok=True)
        path, done_file = directory / "features.npy", directory / "done.json"
        done = json.loads(done_file.read_text())["sequences"] if done_file.is_file() and path.is_file() else 0
        shape = (int(self.offsets[-1]), extractor.width)
        self.rows = np.lib.format.open_memmap(path, mode="r+") if done else None
        if self.rows is None or self.rows.shape != shape:  # fresh, or not this corpus: start over
            done = 0
            self.rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=shape)
        if progress is not None:
            progress(int(self.offsets[done]))
        first = done
        for group in _groups(lengths[first:]):
            indices = [first + i for i in group]
            for index, rows in zip(indices, extractor([sequences.tokens[i] for i in indices])):
                self.rows[self.offsets[index] : self.offsets[index + 1]] = rows.to(torch.float16).cpu().numpy()
            self.rows.flush()
            done = indices[-1] + 1
            atomic_write_json(done_file, {"sequences": done})
            if progress is not None:
                progress(int(self.offsets[indices[-1] + 1] - self.offsets[indices[0]]))

    def get(self, indices: Sequence[int]) -> list[torch.Tensor]:
        return [torch.from_numpy(np.asarray(self.rows[self.offsets[i] : self.offsets[i + 1]], dtype=np.float32))
                for i in indices]


def feature_cache_dir(fingerprint: str, layers: Sequence[int], sequences: Sequences) -> Path:
    """``<specdec cache>/features/<hash of target fingerprint, layers, corpus>``."""
    key = hashlib.sha1(json.dumps([fingerprint, list(layers), sequences.digest()]).encode()).hexdigest()[:16]
    return cache_root() / "features" / key


def target_fingerprint(target: Transformer, name: str) -> str:
    """Identifies a target for caches: its name, shapes and a checksum of a few weights."""
    with torch.no_grad():
        checksum = float(target.embed_tokens.weight[:8].double().sum() + target.norm.weight.double().sum())
    return f"{name}|{target.arch.vocab_size}x{target.arch.hidden_size}x{target.arch.num_layers}|{checksum:.6e}"

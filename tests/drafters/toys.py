"""Shared fixtures of the drafter tests: the toy target, a toy checkpoint for every learned method (random
heads written as real checkpoints), drafters built through the registry, and sampling parameters."""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file, save_file

from specdec_cli.config.schema import MethodConfig
from specdec_cli.drafters import build_drafter
from specdec_cli.drafters.base import DrafterDeps
from specdec_cli.drafters.dflash import save_dflash
from specdec_cli.drafters.eagle3 import save_eagle3
from specdec_cli.drafters.mtp import save_mtp
from specdec_cli.drafters.pard import save_pard
from specdec_cli.models import Transformer
from specdec_cli.sampling.params import BatchParams
from specdec_cli.testing import toy_model
from specdec_cli.train.dflash_objective import init_dflash
from specdec_cli.train.heads import new_eagle3, new_mtp

VOCAB = 16
#: the mask token of the toy PARD and DFlash drafts
MASK = 15
#: a draft vocabulary of 12 of the 16 toy ids (exercises d2t: draft id != target id)
DRAFT_IDS = torch.tensor([0, 1, 2, 3, 5, 6, 8, 9, 10, 12, 13, 15])
#: EAGLE-3 low/mid/high features on the 2-layer toy target (output-of-layer ids)
TOY_LAYERS = (0, 1, 1)
CONTEXT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]


def toy_target() -> Transformer:
    return toy_model(0, vocab_size=VOCAB, num_layers=2)


def _directory(directory: Optional[Path], method: str) -> Path:
    """``directory``, or a temporary one removed at exit."""
    if directory is not None:
        return Path(directory)
    path = Path(tempfile.mkdtemp(prefix=f"specdec-toy-{method}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def toy_checkpoint(method: str, target: Optional[Transformer] = None, directory: Optional[Path] = None, *,
                   reduced: bool = True, seed: int = 1) -> str:
    """A random EAGLE-3 or MTP head for ``target`` (default: the toy target) saved in ``directory``;
    ``reduced``: the 12-token draft vocabulary."""
    target = target if target is not None else toy_target()
    directory = _directory(directory, method)
    used = DRAFT_IDS if reduced else torch.arange(VOCAB)
    if method == "eagle3":
        save_eagle3(new_eagle3(target, used, hidden_layers=TOY_LAYERS, seed=seed), directory)
    else:
        save_mtp(new_mtp(target, used if reduced else None, seed=seed), directory,
                 target_num_layers=target.arch.num_layers)
    return str(directory)


def toy_pard_checkpoint(directory: Optional[Path] = None) -> str:
    """The toy target's first layer (with its head) as a PARD draft with mask token ``MASK``."""
    directory = _directory(directory, "pard")
    save_pard(toy_target().truncated(1), directory, mask_token_id=MASK)
    return str(directory)


def toy_dflash_checkpoint(directory: Optional[Path] = None, *, block_size: int = 4, seed: int = 1) -> str:
    """A random one-layer DFlash draft on the toy target's layers 0 and 1 (its final norm scaled down:
    flatter q, so that sampled and argmax drafts differ often)."""
    directory = _directory(directory, "dflash")
    draft = init_dflash(toy_target(), (0, 1), mask_token_id=MASK, num_layers=1, block_size=block_size, seed=seed)
    with torch.no_grad():
        draft.norm.weight.fill_(0.3)
    save_dflash(draft, directory)
    return str(directory)


def build(target: Transformer, method: MethodConfig, num_slots: int, max_seq_len: int = 64):
    """``method``'s drafter for ``target`` through the registry."""
    deps = DrafterDeps(target=target, num_slots=num_slots, max_seq_len=max_seq_len, vocab_size=VOCAB,
                       device=torch.device("cpu"), dtype=torch.float32)
    return build_drafter(method, deps)


def batch_params(num: int, temperature: float = 1.0, *, seeds: Optional[list[int]] = None, top_k: int = 0,
                 top_p: float = 1.0) -> BatchParams:
    """``num`` rows with the same filters, each with its own seeded generator (seeds 0..num-1 by default)."""
    seeds = list(range(num)) if seeds is None else seeds
    return BatchParams.from_values([temperature] * num, [top_k] * num, [top_p] * num,
                                   [torch.Generator().manual_seed(s) for s in seeds])


def broken_copy(checkpoint: str, directory: Path, *, config: Optional[dict] = None, drop: Optional[str] = None,
                reshape: Optional[str] = None) -> str:
    """A copy of ``checkpoint`` in ``directory`` with config keys replaced (None: removed; also from a nested
    ``dflash_config``), a tensor dropped or a tensor misshapen (its last column cut)."""
    stored = json.loads((Path(checkpoint) / "config.json").read_text())
    for key, value in (config or {}).items():
        stored.get("dflash_config", {}).pop(key, None)
        stored[key] = value
    (directory / "config.json").write_text(json.dumps({k: v for k, v in stored.items() if v is not None}))
    tensors = load_file(str(Path(checkpoint) / "model.safetensors"))
    tensors.pop(drop, None)
    if reshape:
        tensors[reshape] = tensors[reshape][:, :-1].contiguous()
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)

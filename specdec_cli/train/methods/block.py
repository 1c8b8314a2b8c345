"""What PARD and DFlash share: a block of mask tokens drafted in one forward, optionally from a checkpoint."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from specdec_cli.config.schema import TrainConfig
from specdec_cli.errors import ConfigError
from specdec_cli.models import Transformer
from specdec_cli.train.block_tasks import default_mask_token_id
from specdec_cli.train.methods.base import check_init_from, init_from_field


@dataclass
class BlockTrainConfig(TrainConfig):
    """The fields of every block drafter's train schema."""

    # the mask token id; None: pard's method.mask_token_id, else the first vocabulary row past the
    # tokenizer, its mask token, or its highest unused special token (SmolLM2: 16, <empty_output>)
    mask_token_id: Optional[int] = None
    init_from: Optional[str] = init_from_field()


def check_block(cfg: BlockTrainConfig) -> list[str]:
    """The rules of the shared fields."""
    out = []
    if cfg.mask_token_id is not None and cfg.mask_token_id < 0:
        out.append(f"mask_token_id={cfg.mask_token_id} must be >= 0")
    return out + check_init_from(cfg)


def mask_token(cfg: BlockTrainConfig, target: Transformer, tokenizer: Any) -> int:
    """``mask_token_id``, else (pard) ``method.mask_token_id``, else ``default_mask_token_id``."""
    mask = cfg.mask_token_id if cfg.mask_token_id is not None else getattr(cfg.method, "mask_token_id", None)
    vocab = target.arch.vocab_size
    if mask is None:
        return default_mask_token_id(tokenizer, vocab)
    if not 0 <= mask < vocab:
        raise ConfigError([f"mask_token_id={mask} must be a token id in [0, {vocab})"])
    return mask

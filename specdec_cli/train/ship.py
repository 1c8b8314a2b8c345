"""Ship a trained drafter as the embedded target's default: ``specdec_cli/drafters/assets/<target>/<method>/``.

    python -m specdec_cli.train.ship METHOD RUN_DIR --command "specdec train method=METHOD ..."

copies ``RUN_DIR/METHOD`` (what ``specdec train`` wrote) with its floating tensors in float16 (an EAGLE-3
lm_head in int8 with a scale per row), drops
the tensors a draft model (draft_target, pard) shares with its target (a frozen copy of its embedding,
listed in config.json under ``SHARED_WITH_TARGET`` and filled from the target at load time), refuses anything over
``MAX_BYTES``, and writes ``manifest.json``: the command, the corpus, the steps and the held-out
acceptance from ``RUN_DIR/train.json``. Benchmark numbers are added with ``--measured FILE.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from specdec_cli.config.methods import TABLE, trainable_methods
from specdec_cli.drafters.learned import (
    ASSETS, INT8_SUFFIX, SCALE_SUFFIX, SHIPPED_TARGET, WEIGHTS_FILE, save_checkpoint,
)
from specdec_cli.models import Transformer, load_model
from specdec_cli.models.loading import SHARED_WITH_TARGET
from specdec_cli.models.quantize import quantize_weight

MAX_BYTES = 20 * 1024 * 1024
#: tensors of a draft model that may be copies of the target's (frozen in training), shipped by reference
TARGET_COPIES = ("model.embed_tokens.weight", "lm_head.weight")
#: weights shipped as int8 rows + a float32 scale per row (what the CPU default, head_dtype=int8, runs anyway):
#: an EAGLE-3 head's lm_head over a 16k draft vocabulary then takes the bytes of 8k float16 rows
INT8_TENSORS = {"eagle3": ("lm_head.weight",)}
#: methods whose draft is a whole causal LM (the others read the target's embedding at load time anyway)
DRAFT_MODELS = tuple(name for name, spec in TABLE.items() if spec.draft_model)


def shippable(config: dict[str, Any], tensors: dict[str, torch.Tensor], target: Optional[Transformer],
              int8: tuple[str, ...] = ()) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config, tensors) to ship: float16 (``int8``'s names: int8 rows + a scale per row, ``INT8_SUFFIX`` /
    ``SCALE_SUFFIX``), without the ``TARGET_COPIES`` tensors equal to ``target``'s (a draft model's frozen
    embedding / LM head), which config.json lists under ``SHARED_WITH_TARGET``."""
    config = {**config, "torch_dtype": "float16"}
    if target is not None:
        theirs = target.state_dict()
        shared = [name for name in TARGET_COPIES if name in tensors and torch.equal(  # in the stored precision
            tensors[name], theirs[name.removeprefix("model.")].to(tensors[name].dtype))]
        tensors = {name: t for name, t in tensors.items() if name not in shared}
        if shared:
            config[SHARED_WITH_TARGET] = shared
    out = {}
    for name, tensor in tensors.items():
        if name in int8:
            out[name + INT8_SUFFIX], out[name + SCALE_SUFFIX] = quantize_weight(tensor)
        else:
            out[name] = tensor.half() if tensor.is_floating_point() else tensor
    return config, out


def ship(method: str, run_dir: Path, command: str, measured: dict[str, Any] | None = None,
         dest: Path | None = None, force: bool = False, target: Optional[Transformer] = None) -> Path:
    """Write the shipped draft of ``run_dir`` (see the module doc); returns its directory. An existing
    shipped draft is only replaced by one with a longer held-out acceptance length (or with ``force``).
    ``target`` (default: the embedded model) is what a draft model (draft_target, pard) may share tensors with."""
    from safetensors.torch import load_file

    dest = dest or ASSETS / SHIPPED_TARGET / method
    summary = json.loads((run_dir / "train.json").read_text())
    if (dest / "manifest.json").is_file() and not force:
        old = json.loads((dest / "manifest.json").read_text())["held_out_eval"]["acceptance_length"]
        new = summary["eval"]["acceptance_length"]
        if new <= old:
            raise SystemExit(f"{method}: held-out acceptance length {new:.3f} does not improve on the shipped "
                             f"{old:.3f}; not replaced (--force to replace anyway)")
    source = run_dir / method
    config = json.loads((source / "config.json").read_text())
    if target is None and method in DRAFT_MODELS:
        target = load_model(None, dtype=torch.float32, device="cpu")[0]
    int8 = INT8_TENSORS.get(method, ())
    config, tensors = shippable(config, load_file(str(source / WEIGHTS_FILE)),
                                target if method in DRAFT_MODELS else None, int8)
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    if size > MAX_BYTES:
        raise SystemExit(f"{method}: {size / 2**20:.1f} MiB of weights, over the {MAX_BYTES / 2**20:.0f} MiB limit")
    save_checkpoint(dest, config, tensors)
    checkout = Path(__file__).resolve().parents[2]
    corpus = checkout / summary.get("corpus", {}).get("dir", f"data/distill/{SHIPPED_TARGET}")
    manifest = {
        "method": method,
        "target": SHIPPED_TARGET,
        "command": command,
        "corpus": {"dir": str(corpus.resolve().relative_to(checkout)), **summary.get("corpus", {}),
                   **json.loads((corpus / "manifest.json").read_text()),
                   "extra_dirs": [{"dir": extra, **json.loads((checkout / extra / "manifest.json").read_text())}
                                  for extra in summary.get("corpus", {}).get("extra_dirs", [])]},
        "steps": summary["steps"],
        "train_wall_s": round(summary["wall_s"], 1),
        "trained_tokens": summary["trained_tokens"],
        "held_out_eval": summary["eval"],
        "weights": {"file": WEIGHTS_FILE, "dtype": "float16" + "".join(f"; {name}: int8, a scale per row" for name in int8),
                    "bytes": (dest / WEIGHTS_FILE).stat().st_size,
                    "sha256": hashlib.sha256((dest / WEIGHTS_FILE).read_bytes()).hexdigest()},
        "measured": measured or {},
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", choices=trainable_methods())
    parser.add_argument("run_dir", type=Path, help="the out_dir of `specdec train`")
    parser.add_argument("--command", required=True, help="the `specdec train ...` command that produced run_dir")
    parser.add_argument("--measured", type=Path, help="a JSON file of benchmark numbers for the manifest")
    parser.add_argument("--force", action="store_true", help="replace the shipped draft even without improvement")
    args = parser.parse_args(argv)
    measured = json.loads(args.measured.read_text()) if args.measured else None
    dest = ship(args.method, args.run_dir, args.command, measured, force=args.force)
    print(f"shipped {args.method} to {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()

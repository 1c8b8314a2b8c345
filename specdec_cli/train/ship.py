"""Ship a trained drafter as the embedded target's default: ``specdec_cli/drafters/assets/<target>/<method>/``.

    python -m specdec_cli.train.ship METHOD RUN_DIR --command "specdec train method=METHOD ..."

copies ``RUN_DIR/METHOD`` (what ``specdec train`` wrote) with its floating tensors in float16, drops
the tensors a draft model shares with its target (draft_target: the embedding, listed in config.json
under ``SHARED_WITH_TARGET`` and filled from the target at load time), refuses anything over
``MAX_BYTES``, and writes ``manifest.json``: the command, the corpus, the steps and the held-out
acceptance from ``RUN_DIR/train.json``. Benchmark numbers are added with ``--measured FILE.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import torch

from specdec_cli.drafters.learned import ASSETS, SHIPPED_TARGET, WEIGHTS_FILE, save_checkpoint
from specdec_cli.models.loading import SHARED_WITH_TARGET

MAX_BYTES = 20 * 1024 * 1024
#: tensors of a draft model that are copies of the target's and stay frozen in training
TARGET_COPIES = ("model.embed_tokens.weight", "lm_head.weight")


def shippable(method: str, config: dict[str, Any], tensors: dict[str, torch.Tensor]
              ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config, tensors) to ship: float16, without the tensors a draft_target shares with its target."""
    config = {**config, "torch_dtype": "float16"}
    if method == "draft_target":
        shared = [name for name in TARGET_COPIES if name in tensors]
        tensors = {name: t for name, t in tensors.items() if name not in shared}
        config[SHARED_WITH_TARGET] = ["model.embed_tokens.weight"] + (
            [] if config.get("tie_word_embeddings", False) else ["lm_head.weight"])
    return config, {name: t.half() if t.is_floating_point() else t for name, t in tensors.items()}


def ship(method: str, run_dir: Path, command: str, measured: dict[str, Any] | None = None,
         dest: Path | None = None, force: bool = False) -> Path:
    """Write the shipped draft of ``run_dir`` (see the module doc); returns its directory. An existing
    shipped draft is only replaced by one with a longer held-out acceptance length (or with ``force``)."""
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
    config, tensors = shippable(method, config, load_file(str(source / WEIGHTS_FILE)))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    if size > MAX_BYTES:
        raise SystemExit(f"{method}: {size / 2**20:.1f} MiB of weights, over the {MAX_BYTES / 2**20:.0f} MiB limit")
    save_checkpoint(dest, config, tensors)
    corpus = Path(__file__).resolve().parents[2] / "data" / "distill" / SHIPPED_TARGET
    manifest = {
        "method": method,
        "target": SHIPPED_TARGET,
        "command": command,
        "corpus": {"dir": str(corpus.relative_to(corpus.parents[2])),
                   **json.loads((corpus / "manifest.json").read_text())},
        "steps": summary["steps"],
        "train_wall_s": round(summary["wall_s"], 1),
        "trained_tokens": summary["trained_tokens"],
        "held_out_eval": summary["eval"],
        "weights": {"file": WEIGHTS_FILE, "dtype": "float16", "bytes": (dest / WEIGHTS_FILE).stat().st_size,
                    "sha256": hashlib.sha256((dest / WEIGHTS_FILE).read_bytes()).hexdigest()},
        "measured": measured or {},
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("method", choices=("eagle3", "mtp", "draft_target", "pard", "dflash"))
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

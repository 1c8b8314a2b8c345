"""The files of the learned drafters (EAGLE-3, MTP, draft_target, PARD, DFlash).

- ``shipped_checkpoint``: where the project's own drafts for the embedded target live.
- ``Checkpoint`` / ``save_checkpoint`` / ``arch_config``: a draft directory (``config.json`` +
  safetensors), read with one clear error per problem, naming the file and the tensor.
- ``check_d2t``: a reduced draft vocabulary's map to target ids is one-to-one and in range.
- ``load_head``: a learned head in ``method.head_dtype`` (int8: weight-only, its linears quantised).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch import nn

from specdec_cli.errors import ConfigError
from specdec_cli.files import atomic_write_bytes, atomic_write_json
from specdec_cli.models import ModelArch
from specdec_cli.models.loading import COMPUTE_DTYPES
from specdec_cli.models.quantize import quantize_linears

if TYPE_CHECKING:
    from specdec_cli.drafters.base import DrafterDeps

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_TARGET = "smollm2_135m"
WEIGHTS_FILE = "model.safetensors"
#: a weight ``W`` [N, K] may be stored as ``W_int8`` (int8 [N, K]) and ``W_scale`` (float32 [N]): W = int8 * scale
INT8_SUFFIX, SCALE_SUFFIX = "_int8", "_scale"


def load_head(load: Callable[..., nn.Module], path: str | Path, head_dtype: Optional[str], deps: "DrafterDeps",
              **options: Any) -> nn.Module:
    """``load(path, deps.target, dtype=..., device=..., **options)`` in ``head_dtype`` (None: the resolved auto
    choice ``deps.head_dtype``, else model.dtype); int8 loads float32 weights and quantises every linear of the
    head (weight-only, per channel)."""
    name = head_dtype or deps.head_dtype or deps.model_dtype
    head = load(path, deps.target, dtype=COMPUTE_DTYPES[name], device=deps.device, **options)
    return quantize_linears(head, deps.device, "method.head_dtype=int8") if name == "int8" else head


def shipped_checkpoint(method: str, option: str) -> Path:
    """The draft shipped for the embedded target, or a ConfigError saying how to get one."""
    path = ASSETS / SHIPPED_TARGET / method
    if not (path / "config.json").is_file():
        raise ConfigError([
            f"method={method}: no shipped draft exists yet for {SHIPPED_TARGET}; train one with "
            f"`specdec train method={method}` and pass it with method.{option}=<dir>"
        ])
    return path


class Checkpoint:
    """A draft directory: ``config.json`` plus weights (safetensors; ``pytorch_model.bin`` as published
    by the EAGLE authors). Every problem raises a one-line ``ConfigError`` naming the file and tensor."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).expanduser()
        self.config_file = self.directory / "config.json"
        if not self.config_file.is_file():
            raise ConfigError([f"{self.config_file}: missing (not a draft checkpoint directory)"])
        try:
            self.config: dict[str, Any] = json.loads(self.config_file.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError([f"{self.config_file}: invalid JSON ({err})"]) from None
        self.tensors, self.sources = self._read_weights()
        self.stored_names = {name: name for name in self.tensors}

    def rename(self, canonical: Callable[[str], str]) -> None:
        """Map published name variants to the module's names (errors still quote the stored names)."""
        self.stored_names = {canonical(name): stored for name, stored in self.stored_names.items()}
        self.tensors = {canonical(name): tensor for name, tensor in self.tensors.items()}
        self.sources = {canonical(name): source for name, source in self.sources.items()}

    def field(self, key: str, default: Any = ...) -> Any:
        """A config value; a missing required one (no default) is an error naming config.json."""
        if key in self.config:
            return self.config[key]
        if default is ...:
            raise ConfigError([f"{self.config_file}: missing field {key!r}"])
        return default

    def load_into(self, module: nn.Module, optional: tuple[str, ...] = ()) -> None:
        """Copy checkpoint tensors into ``module``'s state (persistent params and buffers, by name);
        a missing or misshapen tensor is an error unless it is in ``optional`` (it keeps its value)."""
        with torch.no_grad():
            for name, target in module.state_dict().items():
                if name not in self.tensors:
                    if name in optional:
                        continue
                    raise ConfigError([f"{self.directory}: tensor {name!r} missing from the checkpoint"])
                tensor = self.tensors[name]
                if tensor.shape != target.shape:
                    raise ConfigError([f"{self.sources[name]}: tensor {self.stored_names[name]!r} has shape "
                                       f"{tuple(tensor.shape)}, expected {tuple(target.shape)}"])
                target.copy_(tensor)

    def _read_weights(self) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        files = sorted(self.directory.glob("*.safetensors")) or sorted(self.directory.glob("pytorch_model*.bin"))
        if not files:
            raise ConfigError([f"{self.directory}: no weights (*.safetensors or pytorch_model.bin)"])
        tensors: dict[str, torch.Tensor] = {}
        sources: dict[str, Path] = {}
        for file in files:
            try:
                part = load_file(str(file)) if file.suffix == ".safetensors" else torch.load(
                    file, map_location="cpu", weights_only=True)
            except (SafetensorError, RuntimeError, OSError) as err:
                raise ConfigError([f"{file}: unreadable weights ({err})"]) from None
            tensors.update(part)
            sources.update(dict.fromkeys(part, file))
        for name in [n for n in tensors if n.endswith(INT8_SUFFIX)]:  # stored as int8 rows + a scale per row
            base = name.removesuffix(INT8_SUFFIX)
            scale = tensors.pop(base + SCALE_SUFFIX, None)
            if scale is None or scale.shape != tensors[name].shape[:1]:
                raise ConfigError([f"{sources[name]}: tensor {name!r} needs a {base + SCALE_SUFFIX!r} "
                                   f"with one scale per row"])
            tensors[base] = tensors.pop(name).float() * scale.float()[:, None]
            sources[base] = sources[name]
        return tensors, sources


def save_checkpoint(directory: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (each atomically) into ``directory``."""
    from safetensors.torch import save

    directory = Path(directory)
    atomic_write_bytes(directory / WEIGHTS_FILE, save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}))
    atomic_write_json(directory / "config.json", config)
    return directory


def check_d2t(d2t: torch.Tensor, vocab_size: int, source: object) -> None:
    """``d2t`` [Vd] must send the draft ids to distinct target ids in [0, vocab_size)."""
    ids = torch.arange(d2t.numel(), device=d2t.device) + d2t.long()
    if d2t.dim() != 1 or bool(((ids < 0) | (ids >= vocab_size)).any()) or ids.unique().numel() != d2t.numel():
        raise ConfigError([f"{source}: tensor 'd2t' must map the draft ids to distinct target ids "
                           f"in [0, {vocab_size})"])


_CAUSAL_LM = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM"}


def arch_config(arch: ModelArch) -> dict[str, Any]:
    """A HF ``config.json`` dict that ``ModelArch.from_hf_config`` reads back as ``arch``."""
    eos = list(arch.eos_token_ids)
    return {
        "architectures": [_CAUSAL_LM[arch.model_type]],
        "model_type": arch.model_type, "hidden_act": "silu", "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size, "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers, "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads, "head_dim": arch.head_dim, "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta, "rope_scaling": dict(arch.rope_scaling) if arch.rope_scaling else None,
        "max_position_embeddings": arch.max_position_embeddings, "tie_word_embeddings": arch.tie_word_embeddings,
        "attention_bias": arch.attention_bias if arch.model_type != "qwen2" else False, "mlp_bias": arch.mlp_bias,
        "bos_token_id": arch.bos_token_id, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": arch.pad_token_id,
    }

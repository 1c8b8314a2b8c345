"""Architecture description of a Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2).

``ModelArch`` is the single source of model shapes for the runtime and for drafters that reuse
its building blocks. ``ModelArch.from_hf_config`` reads a HF ``config.json`` dict or a
``PretrainedConfig``; HF's own config classes fill in per-family defaults and normalise the
RoPE parameters, so a dict and the config object give the same ``ModelArch``.

Layer-index convention (see reference/methods.md §0.1): a layer id ``i`` (0-based) always
means the **output of decoder layer i**, i.e. HF ``hidden_states[i + 1]``, the un-normalised
residual stream. Papers and engines that say "input to layer j" mean ``hidden_states[j]`` =
output of layer ``j - 1``; convert with ``layer_ids_from_input_convention``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from specdec_cli.models.errors import ModelLoadError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class UnsupportedArchitectureError(ModelLoadError):
    """The checkpoint's architecture is outside the Llama family this runtime implements."""


@dataclass(frozen=True)
class ModelArch:
    """Shapes and options of a decoder-only Llama-family transformer.

    ``rope_scaling`` is None for plain RoPE, else HF's normalised parameter dict (``rope_type``
    plus that type's keys: ``factor``, ``original_max_position_embeddings``, ...).
    ``attention_bias`` puts a bias on q/k/v; ``o_proj_bias`` on the output projection.
    ``sliding_window`` is None unless the checkpoint really uses windowed attention.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 4096
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    model_type: str = "llama"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedArchitectureError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise UnsupportedArchitectureError(f"head_dim={self.head_dim} must be even for RoPE")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"rope_type={rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )

    @property
    def position_limit(self) -> int | None:
        """Positions the model was trained for: ``max_position_embeddings``, or the RoPE scaling's
        ``original_max_position_embeddings * factor`` when larger (YaRN, Llama 3); None for dynamic
        NTK scaling, which extends itself as the sequence grows."""
        scaling = self.rope_scaling or {}
        if scaling.get("rope_type") == "dynamic":
            return None
        original, factor = scaling.get("original_max_position_embeddings"), scaling.get("factor")
        scaled = int(original * factor) if original and factor else 0
        return max(self.max_position_embeddings, scaled)

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelArch:
        """Build from a HF ``config.json`` dict or a ``transformers.PretrainedConfig``.

        Raises ``UnsupportedArchitectureError`` (a ``ModelLoadError``) naming the offending field.
        """
        cfg = _as_pretrained_config(config)
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise UnsupportedArchitectureError(f"hidden_act={cfg.hidden_act!r} is not supported (need 'silu')")
        rope = dict(getattr(cfg, "rope_parameters", None) or {})
        if (rope.get("partial_rotary_factor") or 1.0) != 1.0:
            raise UnsupportedArchitectureError("partial_rotary_factor != 1 is not supported")
        rope_theta = float(rope.pop("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        rope.pop("partial_rotary_factor", None)
        rope.setdefault("rope_type", rope.pop("type", "default"))
        model_type = cfg.model_type
        eos = cfg.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
            head_dim=head_dim,
            intermediate_size=cfg.intermediate_size,
            rms_norm_eps=float(cfg.rms_norm_eps),
            rope_theta=rope_theta,
            rope_scaling=None if rope["rope_type"] == "default" else rope,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            qk_norm=model_type == "qwen3",
            attention_bias=model_type == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
            o_proj_bias=model_type != "qwen2" and bool(getattr(cfg, "attention_bias", False)),
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            max_position_embeddings=cfg.max_position_embeddings,
            sliding_window=_effective_sliding_window(cfg),
            bos_token_id=cfg.bos_token_id,
            eos_token_ids=eos_ids,
            pad_token_id=cfg.pad_token_id,
            model_type=model_type,
        )


def _as_pretrained_config(config: Any) -> Any:
    """Check the model type and return a ``PretrainedConfig`` with HF's defaults applied."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(config, PretrainedConfig):
        model_type = config.model_type
        archs = getattr(config, "architectures", None)
    elif isinstance(config, Mapping):
        model_type = config.get("model_type")
        archs = config.get("architectures")
    else:
        raise TypeError(f"expected a config dict or PretrainedConfig, got {type(config).__name__}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedArchitectureError(
            f"model_type={model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    unsupported = [a for a in archs or () if not a.endswith("ForCausalLM")]
    if unsupported:
        raise UnsupportedArchitectureError(f"architectures={unsupported} is not a causal LM this runtime implements")
    if isinstance(config, PretrainedConfig):
        return config
    fields = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(model_type, **fields)


def _effective_sliding_window(cfg: Any) -> int | None:
    """The attention window actually used by any layer, or None."""
    window = getattr(cfg, "sliding_window", None)
    if cfg.model_type in ("qwen2", "qwen3"):
        layer_types = getattr(cfg, "layer_types", None) or ()
        return window if "sliding_attention" in layer_types else None
    return window if cfg.model_type == "mistral" else None


def layer_ids_from_input_convention(ids: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Convert "input to layer j" ids (= HF hidden_states[j]) to this package's output-of-layer ids."""
    if any(j < 1 for j in ids):
        raise ValueError(f"input-to-layer ids must be >= 1 (the embeddings are not a layer output): {ids}")
    return tuple(j - 1 for j in ids)


def eagle3_default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default low/mid/high features: input to layers (2, N//2, N-3) = outputs of (1, N//2-1, N-4)."""
    low, mid, high = layer_ids_from_input_convention((2, num_layers // 2, num_layers - 3))
    return low, mid, high

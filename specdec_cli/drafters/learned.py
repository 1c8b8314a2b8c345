"""Shared pieces of the learned drafters (EAGLE-3, MTP, draft_target).

- ``shipped_checkpoint``: where the project's own drafts for the embedded target live.
- ``Checkpoint`` / ``save_checkpoint`` / ``arch_config``: a draft directory (``config.json`` +
  safetensors), read with one clear error per problem, naming the file and the tensor.
- ``HeadLayer`` / ``FeatureHead``: a one-layer draft head conditioned on target features.
- ``FeatureDrafter``: the step-form drafter around a ``FeatureHead`` with its own slot KV cache.

Pairing (reference/methods.md §0.2): the head row at position p reads the target feature of
position p and the embedding of token p+1, and predicts token p+2. The target's features of the
newest committed token are unknown until the next verify, so after catching up a slot's head
cache holds exactly ``len(tokens) - 1`` entries computed from real target features; the rows a
chain adds from the head's own hidden states are overwritten by the next catch-up.
"""
from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from specdec_cli.drafters.base import Drafter, DraftRequest, Proposal
from specdec_cli.errors import ConfigError
from specdec_cli.models import KVCache, ModelArch, Transformer
from specdec_cli.models.fast_linear import Linear, LinearGroup
from specdec_cli.models.layers import MLP, Attention, RaggedBatch, RMSNorm
from specdec_cli.models.rope import RotaryTables
from specdec_cli.files import atomic_write_bytes, atomic_write_json
from specdec_cli.sampling import draft_to_target_ids, probs_from_logits, sample_from_probs

log = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parent / "assets"
SHIPPED_TARGET = "smollm2_135m"
WEIGHTS_FILE = "model.safetensors"

#: attention(self_attn, x [T, A]) -> [T, H]: the attention sub-block including o_proj.
AttentionFn = Callable[[Attention, torch.Tensor], torch.Tensor]


def shipped_checkpoint(method: str, option: str) -> Path:
    """The draft shipped for the embedded target, or a ConfigError saying how to get one."""
    path = ASSETS / SHIPPED_TARGET / method
    if not (path / "config.json").is_file():
        raise ConfigError([
            f"method={method}: no shipped draft exists yet for {SHIPPED_TARGET}; train one with "
            f"`specdec train method={method}` and pass it with method.{option}=<dir>"
        ])
    return path


# --------------------------------------------------------------------------- checkpoint files
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


# --------------------------------------------------------------------------- the head
class HeadLayer(nn.Module):
    """A Llama decoder layer whose attention reads ``attn_in_size`` features (EAGLE-3: [emb; hidden], 2H).

    ``block(attn_in [T, A], residual [T, H], attention) -> [T, H]``: h = residual + attention(attn_in);
    out = h + mlp(post_attention_layernorm(h)). ``attention`` is the slot-cache attention at inference
    and the training-time-test attention in ``specdec_cli.train``.
    """

    def __init__(self, arch: ModelArch, attn_in_size: int, *, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.self_attn = Attention(arch, **kw)
        if attn_in_size != arch.hidden_size:
            attn = self.self_attn
            for name in ("q_proj", "k_proj", "v_proj"):
                old = getattr(attn, name)
                setattr(attn, name, Linear(attn_in_size, old.out_features, old.bias is not None, **kw))
            attn.qkv = LinearGroup(attn.q_proj, attn.k_proj, attn.v_proj)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, **kw)
        self.mlp = MLP(arch, **kw)

    def block(self, attn_in: torch.Tensor, residual: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        h = residual + attention(self.self_attn, attn_in)
        return h + self.mlp(self.post_attention_layernorm(h))


class FeatureHead(nn.Module, ABC):
    """A draft head on target features. Subclasses set the attributes below in ``__init__``.

    ``fuse(features [T, F]) -> [T, H]``: target features (the ``hidden_layers`` outputs, then the
    final hidden if ``needs_final_hidden``, concatenated) to the head's hidden input.
    ``forward(hidden [T, H], token_ids [T], attention) -> out [T, H]``: one head step per row.
    ``recycle(out) -> [T, H]``: the hidden fed to the next chain step; ``logits(out) -> [T, Vd]``.
    The token embedding ``embed_weight`` [V, H] is a non-persistent buffer (the target's, frozen).
    """

    arch: ModelArch
    hidden_layers: tuple[int, ...]
    needs_final_hidden: bool
    draft_vocab_size: int
    d2t: Optional[torch.Tensor]
    embed_weight: torch.Tensor

    @abstractmethod
    def fuse(self, features: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor, attention: AttentionFn) -> torch.Tensor: ...

    @abstractmethod
    def recycle(self, out: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def logits(self, out: torch.Tensor) -> torch.Tensor: ...


def target_features(hidden: dict[int, torch.Tensor], final: Optional[torch.Tensor], head: FeatureHead) -> torch.Tensor:
    """The head's feature rows [T, F] from target outputs (layer id -> [T, H], final [T, H])."""
    parts = [hidden[layer] for layer in head.hidden_layers]
    if head.needs_final_hidden:
        parts.append(final)
    return torch.cat(parts, dim=-1)


# --------------------------------------------------------------------------- the drafter
class FeatureDrafter(Drafter):
    """Step-form drafter around a ``FeatureHead``: catch up on new target features, then K chain steps.

    Per slot, ``committed[slot]`` head-cache entries come from real target features. Each ``propose``
    rewinds the slot there, feeds the features of the tokens committed since (recomputing them with the
    target when the request carries none, e.g. a drafter attached mid-request), then chains on its own
    hidden states, drawing each token from ``probs_from_logits`` with the request's filters and generator
    (``draft_policy=argmax``: temperature 0, one-hot q). Tokens are mapped to target ids once (d2t).
    """

    form = "step"
    has_proposal_distribution = True

    def __init__(self, head: FeatureHead, target: Transformer, *, num_slots: int, max_seq_len: int,
                 policy: str) -> None:
        self.head = head.requires_grad_(False).eval()
        self.target = target
        self.policy = policy
        self.draft_vocab_size, self.d2t = head.draft_vocab_size, head.d2t
        self.hidden_layers, self.needs_final_hidden = head.hidden_layers, head.needs_final_hidden
        for module in head.modules():
            if isinstance(module, Linear):
                module.row_invariant = False  # drafts are never compared across batch shapes
        arch, device = head.arch, head.embed_weight.device
        self.rope = RotaryTables(arch, dtype=head.embed_weight.dtype, device=device)
        self.rope.ensure(max_seq_len)
        self.cache = KVCache(num_layers=1, num_kv_heads=arch.num_kv_heads, head_dim=arch.head_dim,
                             num_slots=num_slots, max_len=max_seq_len, dtype=head.embed_weight.dtype, device=device)
        self.committed = [0] * num_slots
        self.recomputed = 0  # requests whose target features had to be recomputed (the slow path)

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        self.cache.rewind(slot, 0)
        self.committed[slot] = 0

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        self.add_request(slot, [])

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], k: int) -> Proposal:
        slots = [r.slot for r in requests]
        features, tokens, counts = self._catch_up(requests)
        device = self.head.embed_weight.device
        out = self._step(self.head.fuse(features), tokens.to(device), slots, counts)
        last = torch.tensor(counts, device=device).cumsum(0) - 1
        out = out[last]
        temperature = torch.tensor([0.0 if self.policy == "argmax" else r.temperature for r in requests])
        top_k = torch.tensor([r.top_k for r in requests], dtype=torch.int64)
        top_p = torch.tensor([r.top_p for r in requests])
        generators = [r.generator for r in requests]
        drafted = torch.zeros(len(requests), k, dtype=torch.int64)
        draft_probs = torch.empty(len(requests), k, self.draft_vocab_size)
        for step in range(k):
            probs = probs_from_logits(self.head.logits(out).float().cpu(), temperature, top_k, top_p)
            draft_probs[:, step] = probs
            drafted[:, step] = draft_to_target_ids(sample_from_probs(probs, generators), self.d2t)
            if step + 1 < k:
                out = self._step(self.head.recycle(out), drafted[:, step].to(device), slots, [1] * len(requests))
        return Proposal(tokens=drafted, draft_probs=draft_probs, num_drafts=[k] * len(requests))

    def _step(self, hidden: torch.Tensor, token_ids: torch.Tensor, slots: list[int], counts: list[int]) -> torch.Tensor:
        """Append ``counts[r]`` rows to each slot's head cache; returns the head outputs [T, H]."""
        batch = RaggedBatch.build(slots, [self.cache.length(s) for s in slots], counts, self.rope)
        k_cache, v_cache = self.cache.layer(0)
        out = self.head(hidden, token_ids, lambda attn, x: attn(x, batch, k_cache, v_cache))
        for slot, n in zip(slots, counts):
            self.cache.advance(slot, n)
        return out

    def _catch_up(self, requests: list[DraftRequest]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Rewind each slot to its last real-feature entry (at least one row is re-fed) and gather the
        rows to feed: features [T, F] of positions start..n-2 and the tokens start+1..n-1 [T]."""
        rows: list[Optional[torch.Tensor]] = []
        starts = []
        for req in requests:
            end = len(req.token_ids) - 1
            start = min(self.committed[req.slot], end - 1)
            needed = end - start
            starts.append(start)
            rows.append(target_features(req.target_hidden, req.target_final_hidden, self.head)[-needed:]
                        if self._num_features(req) >= needed else None)
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            fresh = self._recompute([requests[i] for i in missing], [starts[i] for i in missing])
            for i, row in zip(missing, fresh):
                rows[i] = row
        tokens, counts = [], []
        for req, start in zip(requests, starts):
            end = len(req.token_ids) - 1
            self.cache.rewind(req.slot, start)
            self.committed[req.slot] = end
            tokens.extend(req.token_ids[start + 1 : end + 1])
            counts.append(end - start)
        device = self.head.embed_weight.device
        features = torch.cat([row.to(device=device, dtype=self.head.embed_weight.dtype) for row in rows])
        return features, torch.tensor(tokens, dtype=torch.int64), counts

    def _num_features(self, request: DraftRequest) -> int:
        """How many trailing committed positions the request brought target features for."""
        if self.hidden_layers:
            known = request.target_hidden.get(self.hidden_layers[0])
        else:
            known = request.target_final_hidden
        return 0 if known is None else known.shape[0]

    def _recompute(self, requests: list[DraftRequest], starts: list[int]) -> list[torch.Tensor]:
        """Target features of positions start..n-2 for requests that did not bring them (slow path)."""
        if not self.recomputed:
            log.warning("target features missing for a draft request; recomputing them with the target")
        self.recomputed += len(requests)
        prefixes = [torch.tensor(r.token_ids[:-1], dtype=torch.int64) for r in requests]
        cache = self.target.new_cache(len(requests), max(p.numel() for p in prefixes))
        output = self.target(cache, list(range(len(requests))), prefixes, logits_for=[0] * len(requests),
                             hidden_layers=self.hidden_layers, final_hidden=self.needs_final_hidden)
        features = target_features(output.hidden, output.final_hidden, self.head)
        bounds = torch.tensor([p.numel() for p in prefixes]).cumsum(0).tolist()
        return [features[end - p.numel() + start : end] for p, start, end in zip(prefixes, starts, bounds)]

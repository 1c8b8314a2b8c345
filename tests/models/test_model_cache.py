"""Slot KV cache semantics: incremental = full, ragged = alone, rewind, slot reuse, overflow."""
from __future__ import annotations

import platform
import warnings

import pytest
import torch
from model_factories import tiny_hf, to_ours

from specdec_cli.models import CacheOverflowError, Transformer
from specdec_cli.models.fast_linear import Linear, onednn_available

X86_ONEDNN = onednn_available() and platform.machine() in ("x86_64", "AMD64")


@pytest.fixture(scope="module")
def model() -> Transformer:
    return to_ours(tiny_hf("qwen3", tie=True, layers=2, seed=3))


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(seed))


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@torch.inference_mode()
def test_incremental_decoding_equals_full_forward(model: Transformer) -> None:
    ids = _ids(40, 0)
    full = model(model.new_cache(1, 64), [0], ids).logits
    cache = model.new_cache(1, 64)
    pieces = [model(cache, [0], ids[:20]).logits]  # prefill chunk
    pieces += [model(cache, [0], ids[20:25]).logits]  # a 5-token verify
    pieces += [model(cache, [0], ids[i : i + 1]).logits for i in range(25, 40)]  # decodes
    assert cache.length(0) == 40
    _close(torch.cat(pieces), full)


@torch.inference_mode()
def test_ragged_mixed_batch_equals_each_request_alone(model: Transformer) -> None:
    prompts = [_ids(n, seed) for n, seed in ((12, 1), (7, 2), (9, 3))]
    news = [_ids(n, seed) for n, seed in ((1, 4), (5, 5), (9, 6))]  # decode, verify K+1=5, prefill chunk
    alone = []
    for prompt, new in zip(prompts, news):
        cache = model.new_cache(1, 32)
        model(cache, [0], prompt)
        out = model(cache, [0], new, hidden_layers=(0, 1), final_hidden=True)
        alone.append(out)
    cache = model.new_cache(4, 32)
    slots = [3, 0, 2]  # unordered, non-contiguous slots
    model(cache, slots, prompts)
    mixed = model(cache, slots, news, hidden_layers=(0, 1), final_hidden=True)
    assert [cache.length(s) for s in slots] == [13, 12, 18]
    _close(mixed.logits, torch.cat([a.logits for a in alone]))
    for layer in (0, 1):
        _close(mixed.hidden[layer], torch.cat([a.hidden[layer] for a in alone]))
    _close(mixed.final_hidden, torch.cat([a.final_hidden for a in alone]))


@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("n", [1, 5])
@torch.inference_mode()
def test_uniform_batch_in_adjacent_slots_equals_each_request_alone(n: int, kv_heads: int) -> None:
    """Batch decode / verify (same n, slots 1..3) takes the batched attention path (GQA and MHA)."""
    model = to_ours(tiny_hf("llama", num_key_value_heads=kv_heads, seed=4))
    prompts = [_ids(length, seed) for length, seed in ((3, 21), (270, 22), (20, 23))]
    news = [_ids(n, seed) for seed in (24, 25, 26)]
    alone = []
    for prompt, new in zip(prompts, news):
        cache = model.new_cache(1, 300)
        model(cache, [0], prompt)
        alone.append(model(cache, [0], new).logits)
    cache = model.new_cache(4, 300)
    model(cache, [1, 2, 3], prompts)
    batched = model(cache, [1, 2, 3], news).logits
    _close(batched, torch.cat(alone))


@torch.inference_mode()
def test_logits_for_last_and_per_request_counts(model: Transformer) -> None:
    groups = [_ids(4, 7), _ids(3, 8)]
    cache = model.new_cache(2, 16)
    full = model(cache, [0, 1], groups).logits
    for slot in (0, 1):
        cache.rewind(slot, 0)
    last = model(cache, [0, 1], torch.cat(groups), [4, 3], logits_for="last").logits
    _close(last, full[[3, 6]])
    for slot in (0, 1):
        cache.rewind(slot, 0)
    tail = model(cache, [0, 1], groups, logits_for=[2, 0]).logits
    _close(tail, full[[2, 3]])


@torch.inference_mode()
def test_rewind_then_refeed_gives_the_same_logits(model: Transformer) -> None:
    cache = model.new_cache(1, 32)
    model(cache, [0], _ids(10, 9))
    accepted = model(cache, [0], _ids(5, 10)).logits  # verify 5 drafts
    cache.rewind(0, 12)  # keep 2 of the 5, drop the rest
    model(cache, [0], _ids(3, 11))  # different continuation overwrites positions 12..14
    cache.rewind(0, 10)
    again = model(cache, [0], _ids(5, 10)).logits
    assert torch.equal(again, accepted)
    with pytest.raises(ValueError, match="cannot rewind"):
        cache.rewind(0, 16)


@torch.inference_mode()
def test_reused_slot_leaks_nothing_from_its_previous_owner(model: Transformer) -> None:
    prompt = _ids(6, 12)
    fresh = model(model.new_cache(1, 32), [0], prompt).logits
    cache = model.new_cache(2, 32)
    slot = 1
    model(cache, [slot], _ids(25, 13))  # a long previous request
    cache.rewind(slot, 0)  # what the engine does when the slot gets its next request
    assert torch.equal(model(cache, [slot], prompt).logits, fresh)


@pytest.mark.parametrize("row_invariant", [True, False])
@torch.inference_mode()
def test_verify_rows_match_single_token_decodes(model: Transformer, row_invariant: bool) -> None:
    """A position's logits do not depend on how many tokens share the forward (speculative == AR)."""
    prompt, drafts = _ids(30, 14), _ids(8, 15)
    model.row_invariant = row_invariant
    try:
        cache = model.new_cache(1, 64)
        model(cache, [0], prompt)
        verify = model(cache, [0], drafts).logits
        cache.rewind(0, 30)
        decode = torch.cat([model(cache, [0], drafts[i : i + 1]).logits for i in range(8)])
    finally:
        model.row_invariant = True
    _close(verify, decode)
    if row_invariant and X86_ONEDNN:  # every x86 measured (Xeon, EPYC): bitwise, the GEMMs and attention probed
        assert torch.equal(verify, decode), "a verify row rounds differently from its single-token decode"
    elif row_invariant and not torch.equal(verify, decode):
        warnings.warn("verify and decode logits differ by fp32 rounding on this CPU (not bitwise)")


def test_row_invariant_switch_reaches_every_linear(model: Transformer) -> None:
    draft = model.truncated(1)
    model.row_invariant = False
    try:
        assert not draft.row_invariant
        assert not any(m.row_invariant for m in model.modules() if isinstance(m, Linear))
    finally:
        model.row_invariant = True
    assert all(m.row_invariant for m in model.modules() if isinstance(m, Linear))


@torch.inference_mode()
def test_overflow_raises_and_changes_nothing(model: Transformer) -> None:
    cache = model.new_cache(2, 8)
    model(cache, [0, 1], [_ids(6, 16), _ids(2, 17)])
    with pytest.raises(CacheOverflowError, match="slot 0: 6 cached \\+ 3 new tokens exceed max_len=8"):
        model(cache, [1, 0], [_ids(1, 18), _ids(3, 19)])
    assert (cache.length(0), cache.length(1)) == (6, 2)
    cache.check_fits(0, 2)


@torch.inference_mode()
def test_bad_arguments_raise_before_touching_the_cache(model: Transformer) -> None:
    cache = model.new_cache(2, 8)
    with pytest.raises(ValueError, match="duplicate slots"):
        model(cache, [0, 0], [_ids(1, 0), _ids(1, 1)])
    with pytest.raises(ValueError, match="out of range"):
        model(cache, [0], _ids(2, 0), hidden_layers=(2,))
    with pytest.raises(ValueError, match="logits_for"):
        model(cache, [0], _ids(2, 0), logits_for=[3])
    with pytest.raises(ValueError, match="needs num_new"):
        model(cache, [0, 1], _ids(2, 0))
    assert cache.length(0) == 0


@torch.inference_mode()
def test_truncated_model_shares_weights_and_has_its_own_cache(model: Transformer) -> None:
    draft = model.truncated(1)
    assert draft.arch.num_layers == 1 and draft.layers[0] is model.layers[0]
    assert draft.lm_head.weight is model.lm_head.weight
    ids = _ids(9, 20)
    hidden = model(model.new_cache(1, 16), [0], ids, hidden_layers=(0,)).hidden[0]
    out = draft(draft.new_cache(1, 16), [0], ids, final_hidden=True)
    _close(out.final_hidden, model.norm(hidden))
    with pytest.raises(ValueError):
        model.truncated(3)


@torch.inference_mode()
def test_dtype_conversion_moves_the_rope_tables(model: Transformer) -> None:
    ids = _ids(12, 27)
    ref = model(model.new_cache(1, 16), [0], ids).logits
    wide = to_ours(tiny_hf("qwen3", tie=True, layers=2, seed=3)).to(torch.float64)
    assert wide.rope.cos.dtype == torch.float64 and "rope.cos" not in wide.state_dict()
    torch.testing.assert_close(wide(wide.new_cache(1, 16), [0], ids).logits, ref, rtol=0, atol=1e-4)

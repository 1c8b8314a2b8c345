"""``forward_dense``: the fixed-shape forward a CUDA graph replays equals ``forward`` (CPU, eager), padded rows
on a scratch slot included."""
from __future__ import annotations

import torch

from specdec_cli.testing import toy_model


def _prefilled(model, lengths: list[int], num_slots: int):
    cache = model.new_cache(num_slots, 64)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.arch.vocab_size, (n,), generator=generator) for n in lengths]
    model(cache, list(range(len(lengths))), prompts)
    return cache


@torch.inference_mode()
def test_dense_forward_equals_the_ragged_forward_and_ignores_scratch_padding() -> None:
    model = toy_model(3)
    lengths, slots, n = [5, 9, 2], [0, 2, 1], 4
    new = torch.randint(0, model.arch.vocab_size, (3, n), generator=torch.Generator().manual_seed(2))
    ragged_cache = _prefilled(model, lengths, 4)
    expected = model(ragged_cache, slots, list(new), logits_for="all", hidden_layers=(0,), final_hidden=True)

    dense_cache = _prefilled(model, lengths, 4)  # slot 3 is the scratch slot
    scratch = 3
    padded_tokens = torch.cat([new, torch.zeros(1, n, dtype=torch.int64)])  # a fourth row, padding
    starts = torch.tensor([dense_cache.length(s) for s in slots] + [0])
    got = model.forward_dense(dense_cache, torch.tensor(slots + [scratch]), starts, padded_tokens,
                              hidden_layers=(0,), final_hidden=True)
    rows = 3 * n
    torch.testing.assert_close(got.logits[:rows], expected.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.hidden[0][:rows], expected.hidden[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got.final_hidden[:rows], expected.final_hidden, rtol=0, atol=1e-5)
    assert torch.equal(got.logits[:rows].argmax(-1), expected.logits.argmax(-1))
    # the live slots' K/V are what the ragged forward wrote; lengths are the caller's to advance
    for slot in slots:
        length = lengths[slot]
        torch.testing.assert_close(dense_cache.k[:, slot, :, : length + n], ragged_cache.k[:, slot, :, : length + n],
                                   rtol=0, atol=1e-5)
        assert dense_cache.length(slot) == length

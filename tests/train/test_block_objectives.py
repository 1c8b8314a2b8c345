"""PARD and DFlash training objectives: batch layouts, training view == inference view, loss goes down."""
from __future__ import annotations

import math

import pytest
import torch

from specdec_cli.drafters.base import DraftRequest
from specdec_cli.sampling.params import BatchParams
from specdec_cli.drafters.dflash import save_dflash
from specdec_cli.drafters.dflash_drafter import DFlashDrafter
from specdec_cli.drafters.pard import save_pard
from specdec_cli.models import ModelArch, Transformer
from specdec_cli.train.dflash_objective import build_dflash_batch, default_target_layers, dflash_loss, init_dflash
from specdec_cli.train.pard_objective import build_pard_batch, init_pard_from_target, pard_hidden, pard_loss

VOCAB = 16
MASK = 15


def corpus(num: int, length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [num, length] zero padded, lengths [num], prompt_lens [num]): random ids below the mask."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 2, length + 1, (num,), generator=generator)
    lengths[0] = length
    tokens = torch.randint(0, MASK, (num, length), generator=generator)
    tokens[torch.arange(length)[None] >= lengths[:, None]] = 0
    return tokens, lengths, torch.randint(1, length // 3, (num,), generator=generator)


def fit(module: torch.nn.Module, objective, steps: int = 12) -> tuple[list[float], list[float]]:
    """Adam (lr 1e-2) on ``objective() -> (loss, per-position losses)``: (every step's loss, the last
    step's per-position losses)."""
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss, per_position = objective()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, per_position


@torch.inference_mode()
def target_outputs(target, tokens: torch.Tensor, lengths: torch.Tensor, layers=()) -> tuple[torch.Tensor, torch.Tensor]:
    """(features [R, L, n*H] of ``layers``, final hidden [R, L, H]), zero padded."""
    rows, length = tokens.shape
    cache = target.new_cache(rows, length)
    out = target(cache, list(range(rows)), [t[:n] for t, n in zip(tokens, lengths.tolist())],
                 hidden_layers=layers, final_hidden=True)
    valid = torch.arange(length)[None] < lengths[:, None]
    features = torch.zeros(rows, length, len(layers) * target.arch.hidden_size)
    final = torch.zeros(rows, length, target.arch.hidden_size)
    if layers:
        features[valid] = torch.cat([out.hidden[layer] for layer in layers], -1)
    final[valid] = out.final_hidden
    return features.clone(), final.clone()


# ---------------------------------------------------------------- PARD
def test_pard_batch_layout() -> None:
    tokens = torch.tensor([[10, 11, 12, 13, 14, 9]])
    batch = build_pard_batch(tokens, torch.tensor([6]), torch.tensor([2]), depth=3, mask_token_id=MASK, keep_ratio=1.0)
    entries = list(zip(batch.depth[0].tolist(), batch.position_ids[0].tolist()))
    # depth 0: the sequence; depth g: positions whose label x_{p+1} is a response token, chained to (g-1, p-1)
    assert entries == [(0, p) for p in range(6)] + [(1, p) for p in (1, 2, 3, 4)] + [(2, p) for p in (2, 3, 4)]
    assert batch.input_ids[0].tolist() == [10, 11, 12, 13, 14, 9] + [MASK] * 7
    assert batch.weight[0].tolist() == [0, 1, 1, 1, 1, 0] + [1] * 7  # x_1 is a prompt token, x_6 does not exist
    assert batch.teacher_index[0].tolist() == batch.position_ids[0].tolist()
    seen = {entry for entry, visible in zip(entries, batch.attention[0, entries.index((2, 4))]) if visible}
    assert seen == {(0, 0), (0, 1), (0, 2), (1, 3), (2, 4)}  # the view [x_0, x_1, x_2, m, m]
    assert {e for e, v in zip(entries, batch.attention[0, entries.index((0, 3))]) if v} == {(0, p) for p in range(4)}


def test_pard_drop_keeps_whole_chains() -> None:
    tokens, lengths, prompts = corpus(3, 40)
    batch = build_pard_batch(tokens, lengths, prompts, depth=5, mask_token_id=MASK,
                             generator=torch.Generator().manual_seed(0))
    for row in range(3):
        kept = set(zip(batch.depth[row].tolist(), batch.position_ids[row].tolist()))
        budget = int(lengths[row]) - int(prompts[row])  # depth-0 entries with a loss
        counts = [sum(1 for d, _ in kept if d == g) for g in range(5)]
        assert counts[0] == int(lengths[row]) and counts[1] == int(budget * 0.7)
        assert all(0 < counts[g] <= int(budget * max(0.7**g, 0.2)) for g in range(2, 5))
        assert all((d - 1, p - 1) in kept for d, p in kept if d >= 1)  # every mask has its prefix chain
    padding = batch.depth < 0
    assert bool(padding.any()) and not bool(batch.weight[padding].any())
    others = ~torch.eye(batch.attention.shape[1], dtype=torch.bool)
    assert not bool((batch.attention & (padding[:, None, :] | padding[:, :, None]) & others).any())


def test_pard_training_view_equals_inference(target) -> None:
    """Entry (g, p) of the training forward = the draft model run on [x_0 .. x_{p-g}, mask x g]."""
    model = init_pard_from_target(target, 2, hidden_size=16, seed=3)
    tokens, lengths, prompts = corpus(1, 12, seed=1)
    batch = build_pard_batch(tokens, lengths, prompts, depth=4, mask_token_id=MASK, keep_ratio=1.0)
    with torch.no_grad():
        logits = model.lm_head(pard_hidden(model, batch))[0]
    for index, (g, p) in enumerate(zip(batch.depth[0].tolist(), batch.position_ids[0].tolist())):
        cache = model.new_cache(1, 16)
        with torch.inference_mode():
            view = torch.cat([tokens[0, : p - g + 1], torch.full((g,), MASK)])
            expected = model(cache, [0], [view], logits_for="last").logits[0]
        assert torch.allclose(logits[index], expected, atol=1e-4), (g, p)


def test_pard_loss_decreases(target) -> None:
    model = init_pard_from_target(target, 1, hidden_size=32, seed=0)
    tokens, lengths, prompts = corpus(4, 24)
    _, final = target_outputs(target, tokens, lengths)
    batch = build_pard_batch(tokens, lengths, prompts, depth=3, mask_token_id=MASK,
                             generator=torch.Generator().manual_seed(0))
    losses, per_depth = fit(model, lambda: pard_loss(model, batch, final, target.lm_head.weight))
    assert len(per_depth) == 3 and all(math.isfinite(x) for x in per_depth)
    assert losses[-1] < 0.8 * losses[0], losses


# ---------------------------------------------------------------- DFlash
def test_dflash_batch_layout() -> None:
    tokens, lengths, prompts = corpus(3, 30)
    batch = build_dflash_batch(tokens, lengths, prompts, block_size=4, num_anchors=5, mask_token_id=MASK, gamma=2.0,
                               generator=torch.Generator().manual_seed(0))
    context = int(lengths.max())
    assert batch.block_ids.shape == batch.positions.shape == batch.weight.shape == (3, 20)
    assert batch.attention.shape == (3, 20, context + 20)
    for row in range(3):
        for block, anchor in enumerate(batch.anchors[row].tolist()):
            assert int(prompts[row]) <= anchor < int(lengths[row]) - 1
            span = slice(4 * block, 4 * block + 4)
            assert batch.block_ids[row, span].tolist() == [int(tokens[row, anchor])] + [MASK] * 3
            assert batch.positions[row, span].tolist() == list(range(anchor, anchor + 4))
            assert batch.teacher_index[row, span].tolist()[1:] == list(range(anchor, anchor + 3))
            for query in batch.attention[row, span]:  # context strictly before the anchor, then its own block
                assert query[:context].tolist() == [j < anchor for j in range(context)]
                assert query[context:].tolist() == [span.start <= j < span.stop for j in range(20)]
            inside = [anchor + j < int(lengths[row]) for j in range(1, 4)]
            expected = [0.0] + [math.exp(-(j - 1) / 2.0) * keep for j, keep in zip(range(1, 4), inside)]
            assert torch.allclose(batch.weight[row, span], torch.tensor(expected))


def test_dflash_training_view_equals_inference(target) -> None:
    """The training forward of a block anchored at a = the drafter's q (temperature 1) with the committed
    tokens x_0..x_a (context: the target features of x_0..x_{a-1})."""
    make = lambda: init_dflash(target, (0, 1), mask_token_id=MASK, num_layers=2, block_size=5, seed=2)  # noqa: E731
    draft = make()
    tokens, lengths, prompts = corpus(1, 20, seed=2)
    batch = build_dflash_batch(tokens, lengths, prompts, block_size=5, num_anchors=3, mask_token_id=MASK)
    features, _ = target_outputs(target, tokens, lengths, layers=(0, 1))
    with torch.no_grad():
        probs = torch.softmax(draft.logits(draft(features, batch.block_ids, batch.positions, batch.attention)), -1)
    drafter = DFlashDrafter(make(), target, num_slots=3, max_seq_len=32, policy="sample")
    anchors = batch.anchors[0].tolist()
    requests = [DraftRequest(slot=i, token_ids=tokens[0, : a + 1].tolist()) for i, a in enumerate(anchors)]
    for slot in range(3):
        drafter.add_request(slot, [])
    proposal = drafter.propose(requests, 4, BatchParams.from_values([1.0] * 3, [0] * 3, [1.0] * 3, [None] * 3))
    assert torch.allclose(proposal.draft_probs, probs[0].view(3, 5, -1)[:, 1:], atol=1e-5)


def test_dflash_loss_decreases(target) -> None:
    draft = init_dflash(target, (0, 1), mask_token_id=MASK, num_layers=1, block_size=4, seed=0)
    tokens, lengths, prompts = corpus(4, 24)
    features, final = target_outputs(target, tokens, lengths, layers=(0, 1))
    batch = build_dflash_batch(tokens, lengths, prompts, block_size=4, num_anchors=6, mask_token_id=MASK,
                               generator=torch.Generator().manual_seed(0))
    losses, per_position = fit(draft, lambda: dflash_loss(draft, batch, features, final, target.lm_head.weight))
    assert len(per_position) == 3 and all(math.isfinite(x) for x in per_position)
    assert losses[-1] < 0.8 * losses[0], losses


def test_default_layers_and_sizes_of_the_embedded_defaults(tmp_path) -> None:
    """The initialisers for SmolLM2-135M (its shapes, random weights) save to <= 20 MB in float16."""
    assert default_target_layers(36, 5) == (1, 9, 17, 25, 33)  # Qwen3-8B DFlash
    assert default_target_layers(30, 2) == (1, 27) and default_target_layers(30, 1) == (15,)
    arch = ModelArch(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                     intermediate_size=1536, tie_word_embeddings=True)
    smol = Transformer(arch)
    torch.nn.init.normal_(smol.embed_tokens.weight)
    save_pard(init_pard_from_target(smol, 4, hidden_size=128), tmp_path / "pard", mask_token_id=16,
              dtype=torch.float16)
    save_dflash(init_dflash(smol, mask_token_id=16), tmp_path / "dflash", dtype=torch.float16)
    for method in ("pard", "dflash"):
        assert (tmp_path / method / "model.safetensors").stat().st_size <= 20e6

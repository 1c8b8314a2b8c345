"""Block verification (``block_verify``): what a chain of rounds emits is distributed exactly as the target, and it
keeps at least as many drafts as token-by-token rejection sampling.

A block rule is exact over the whole generated sequence, not per round (a round's second token alone need not
follow the target), so these tests run several rounds on a Markov target and draft (the next-token laws depend
on the previous token) and check the joint law of the first ``LENGTH`` generated tokens, V ** LENGTH cells, with
chi-square and a TV bound (sampling_stats). Drafts are drawn with torch.multinomial, independently of the code
under test.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sampling_stats import assert_binomial_rate, assert_law

from specdec_cli.sampling import block_verify, rejection_sample

VOCAB, K, LENGTH, ROWS = 5, 3, 3, 400_000


def markov_laws(case: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(target [V + 1, V], draft [V + 1, V]): row s is the next-token law after token s (row V: the start)."""
    def rows(scale: float) -> torch.Tensor:
        return (scale * torch.randn(VOCAB + 1, VOCAB, generator=generator)).softmax(-1)

    target = rows(1.5)
    if case == "peaked":
        return target, rows(1.5)
    if case == "one-hot-draft":  # deterministic drafts (retrieval, argmax): q is one-hot at a fixed token
        return target, torch.nn.functional.one_hot(torch.randint(VOCAB, (VOCAB + 1,), generator=generator),
                                                   VOCAB).float()
    if case == "zeros":  # the target rules out tokens the draft proposes, and the other way round
        draft = rows(1.5)
        target[:, 0], draft[:, 1] = 0, 0
        return target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)
    raise ValueError(case)


def generate(verify, target: torch.Tensor, draft: torch.Tensor, generator: torch.Generator, stop_below: float = 0.0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounds of (draft K tokens, verify) on every row until each row has LENGTH tokens -> (the first LENGTH tokens
    [ROWS, LENGTH], tokens emitted by the first round [ROWS]). ``stop_below`` > 0: a row's chain ends with its first
    draft whose draft probability is below it (the engine's confidence stop, ``ChainStop``), and rows are verified
    in groups of equal chain length, as the engine groups them."""
    out = torch.full((ROWS, LENGTH + K + 1), -1, dtype=torch.int64)
    filled = torch.zeros(ROWS, dtype=torch.int64)
    last = torch.full((ROWS,), VOCAB, dtype=torch.int64)
    first_round = None
    while bool((filled < LENGTH).any()):
        states, drafts = [last], []
        for _ in range(K):
            drafts.append(torch.multinomial(draft[states[-1]], 1, generator=generator)[:, 0])
            states.append(drafts[-1])
        draft_tokens, states = torch.stack(drafts, 1), torch.stack(states, 1)
        own = draft[states[:, :-1], draft_tokens]
        low = (own < stop_below).long()
        lengths = torch.where(low.any(1), low.argmax(1) + 1, K)
        tokens = torch.full((ROWS, K + 1), -1, dtype=torch.int64)
        emitted = torch.zeros(ROWS, dtype=torch.int64)
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero()[:, 0]
            group = verify(target[states[rows, : length + 1]], draft[states[rows, :length]],
                           draft_tokens[rows, :length], generator)
            tokens[rows, : length + 1], emitted[rows] = group
        first_round = emitted if first_round is None else first_round
        columns = filled[:, None] + torch.arange(K + 1)
        keep = (torch.arange(K + 1) < emitted[:, None]) & (filled < LENGTH)[:, None]
        out[torch.arange(ROWS)[:, None].expand_as(columns)[keep], columns[keep]] = tokens[keep]
        filled = torch.where(filled < LENGTH, filled + emitted, filled)
        last = out.gather(1, (filled - 1)[:, None])[:, 0]
    return out[:, :LENGTH], first_round


def sequence_law(target: torch.Tensor) -> np.ndarray:
    """The target's law of its first LENGTH tokens, cell = base-V number of the sequence."""
    law = np.zeros(VOCAB ** LENGTH)
    for cell, sequence in enumerate(itertools.product(range(VOCAB), repeat=LENGTH)):
        prob, state = 1.0, VOCAB
        for token in sequence:
            prob, state = prob * float(target[state, token]), token
        law[cell] = prob
    return law


@pytest.mark.parametrize("case,stop_below", [("peaked", 0.0), ("one-hot-draft", 0.0), ("zeros", 0.0), ("peaked", 0.3)])
def test_block_verification_generates_the_target_sequence_law(case, stop_below):
    """Also with chains whose length depends on their own drafts (a confidence stop): still exact."""
    generator = torch.Generator().manual_seed(sum(map(ord, case)))
    target, draft = markov_laws(case, generator)
    sequences, _ = generate(lambda *a: block_verify(*a[:3], a[3]), target, draft, generator, stop_below)
    cells = (sequences * VOCAB ** torch.arange(LENGTH - 1, -1, -1)).sum(1)
    assert_law(cells, sequence_law(target))


def test_block_verification_keeps_more_drafts_than_token_by_token():
    generator = torch.Generator().manual_seed(7)
    target, draft = markov_laws("peaked", generator)
    _, block = generate(lambda *a: block_verify(*a[:3], a[3]), target, draft, generator)
    _, token = generate(lambda *a: rejection_sample(*a[:3], a[3]), target, draft, generator)
    difference, sd = float(block.double().mean() - token.double().mean()), float(
        ((block.double().var() + token.double().var()) / ROWS).sqrt())
    assert difference > 5 * sd, (difference, sd)


def test_block_verification_of_one_draft_is_token_by_token():
    """With K = 1 the block rule is the token rule (h_1 = min(ratio, 1)): same acceptance rate."""
    generator = torch.Generator().manual_seed(3)
    target, draft = markov_laws("peaked", generator)
    drafts = torch.multinomial(draft[VOCAB], ROWS, replacement=True, generator=generator)[:, None]
    _, emitted = block_verify(target[[VOCAB, 0]][None].expand(ROWS, 2, VOCAB).clone(),
                              draft[VOCAB].expand(ROWS, 1, VOCAB), drafts, generator)
    assert_binomial_rate(int((emitted == 2).sum()), ROWS, float(torch.minimum(target[VOCAB], draft[VOCAB]).sum()))


def test_block_verification_is_batch_invariant_and_seeded():
    generator = torch.Generator().manual_seed(11)
    target, draft = markov_laws("peaked", generator)
    target_probs = target[torch.randint(VOCAB, (6, K + 1), generator=generator)]
    draft_probs = draft[torch.randint(VOCAB, (6, K), generator=generator)]
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, VOCAB), 1, generator=generator).view(6, K)
    seeded = lambda rows: [torch.Generator().manual_seed(100 + r) for r in rows]  # noqa: E731
    tokens, emitted = block_verify(target_probs, draft_probs, draft_tokens, generators=seeded(range(6)))
    alone, alone_emitted = block_verify(target_probs[2:3], draft_probs[2:3], draft_tokens[2:3], generators=seeded([2]))
    assert torch.equal(tokens[2:3], alone) and torch.equal(emitted[2:3], alone_emitted)
    assert bool(((emitted >= 1) & (emitted <= K + 1)).all())
    assert bool((tokens[torch.arange(K + 1) >= emitted[:, None]] == -1).all())

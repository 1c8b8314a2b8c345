"""Torch dispatch, import hygiene; flashinfer / CUDA parity where a GPU exists (the backend is chosen in config/)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from sampling_stats import assert_law

from specdec_cli.sampling import (
    rejection_sample,
    rejection_sample_reference,
    rejection_sample_with,
    strict_accept,
)

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
needs_flashinfer = pytest.mark.skipif(
    not HAS_CUDA or importlib.util.find_spec("flashinfer") is None, reason="needs a CUDA device with flashinfer"
)


def test_sampling_imports_neither_flashinfer_nor_the_rest_of_the_project():
    code = (
        "import sys, specdec_cli.sampling\n"
        "bad = [m for m in sys.modules if m.startswith('flashinfer')"
        " or (m.startswith('specdec_cli.') and not m.startswith('specdec_cli.sampling'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_backend_dispatch_is_the_torch_implementation():
    generator = torch.Generator().manual_seed(0)
    target = torch.rand(5, 3, 11, generator=generator).softmax(-1)
    draft = torch.rand(5, 2, 11, generator=generator).softmax(-1)
    draft_tokens = torch.randint(11, (5, 2), generator=generator)
    expected = rejection_sample(target, draft, draft_tokens, torch.Generator().manual_seed(1))
    got = rejection_sample_with("torch", target, draft, draft_tokens, torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


@needs_cuda
def test_torch_implementation_on_cuda_matches_the_reference():
    generator = torch.Generator().manual_seed(2)
    batch, k, vocab = 64, 4, 32_000
    target = (3 * torch.randn(batch, k + 1, vocab, generator=generator)).softmax(-1)
    draft = (target[:, :k].log() + torch.randn(batch, k, vocab, generator=generator)).softmax(-1)
    draft_tokens = torch.multinomial(draft.reshape(-1, vocab), 1, generator=generator).view(batch, k)
    uniforms = torch.rand(batch, k + 1, generator=generator, dtype=torch.float64)
    tokens, emitted = rejection_sample(target.cuda(), draft.cuda(), draft_tokens.cuda(), uniforms=uniforms.cuda())
    ref_tokens, ref_emitted = rejection_sample_reference(target, draft, draft_tokens, uniforms)
    assert torch.equal(tokens.cpu(), ref_tokens) and torch.equal(emitted.cpu(), ref_emitted)


@needs_flashinfer
def test_flashinfer_one_hot_rows_equal_strict_acceptance():
    generator = torch.Generator().manual_seed(3)
    batch, k, vocab = 256, 4, 3
    target_tokens = torch.randint(vocab, (batch, k + 1), generator=generator)
    draft_tokens = torch.randint(vocab, (batch, k), generator=generator)
    one_hot = torch.nn.functional.one_hot
    target_probs = one_hot(target_tokens, vocab).float().cuda()
    draft_probs = one_hot(draft_tokens, vocab).float().cuda()
    tokens, emitted = rejection_sample_with("flashinfer", target_probs, draft_probs, draft_tokens.cuda())
    expected_tokens, expected_emitted = strict_accept(draft_tokens, target_tokens)
    assert torch.equal(tokens.cpu(), expected_tokens) and torch.equal(emitted.cpu(), expected_emitted)


@needs_flashinfer
def test_flashinfer_emitted_law_matches_the_target_like_torch():
    generator = torch.Generator().manual_seed(4)
    rows, k, vocab = 1_000_000, 2, 16
    target = (2 * torch.randn(vocab, generator=generator)).softmax(0)
    draft = (2 * torch.randn(vocab, generator=generator)).softmax(0)
    draft_tokens = torch.multinomial(draft, rows * k, replacement=True, generator=generator).view(rows, k)
    tokens, emitted = rejection_sample_with(
        "flashinfer",
        target.cuda().expand(rows, k + 1, vocab),
        draft.cuda().expand(rows, k, vocab),
        draft_tokens.cuda(),
        torch.Generator("cuda").manual_seed(5),
    )
    assert_law(tokens[:, 0].cpu(), target)
    assert torch.equal(emitted.cpu(), (tokens != -1).sum(1).cpu())

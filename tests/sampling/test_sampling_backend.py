"""Backend resolution on CPU, torch dispatch, import hygiene; flashinfer / CUDA parity where a GPU exists."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from sampling_stats import assert_law

from specdec_cli.sampling import (
    BackendChoice,
    SamplingError,
    flashinfer_unavailable_reason,
    probs_from_logits,
    probs_from_logits_with,
    rejection_sample,
    rejection_sample_reference,
    rejection_sample_with,
    resolve_backend,
    strict_accept,
)

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
needs_flashinfer = pytest.mark.skipif(
    not HAS_CUDA or flashinfer_unavailable_reason("cuda") is not None, reason="needs a CUDA device with flashinfer"
)


def test_resolve_backend_on_cpu():
    assert resolve_backend("torch", "cpu") == BackendChoice("torch", "requested")
    auto = resolve_backend("auto", torch.device("cpu"))
    assert auto.name == "torch" and "CUDA" in auto.reason
    with pytest.raises(SamplingError, match="flashinfer.*CUDA"):
        resolve_backend("flashinfer", "cpu")
    with pytest.raises(SamplingError, match="unknown sampling backend"):
        resolve_backend("triton", "cpu")
    assert "CUDA" in flashinfer_unavailable_reason("cpu")


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
    logits, temperature = torch.randn(4, 11, generator=generator), torch.tensor([0.0, 0.5, 1.0, 2.0])
    top_k, top_p = torch.tensor([0, 3, 5, 20]), torch.tensor([1.0, 0.9, 0.5, 0.7])
    expected_probs = probs_from_logits(logits, temperature, top_k, top_p)
    assert torch.equal(probs_from_logits_with("torch", logits, temperature, top_k, top_p), expected_probs)


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


@needs_flashinfer
def test_flashinfer_filters_match_torch_on_tie_free_logits():
    generator = torch.Generator().manual_seed(6)
    logits = 3 * torch.randn(64, 4096, generator=generator)
    temperature = torch.rand(64, generator=generator) + 0.2
    temperature[:4] = 0
    top_k = torch.randint(-5, 5000, (64,), generator=generator)
    top_p = torch.rand(64, generator=generator) * 1.2
    expected = probs_from_logits(logits, temperature, top_k, top_p)
    got = probs_from_logits_with("flashinfer", logits.cuda(), temperature.cuda(), top_k.cuda(), top_p.cuda())
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4)

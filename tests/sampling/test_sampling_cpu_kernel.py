"""The fused CPU kernel draws exactly what the batched torch path and the float64 reference draw."""
from __future__ import annotations

import pytest
import torch

from specdec_cli.sampling import block_verify, draws, rejection_sample, rejection_sample_reference
from specdec_cli.sampling import cpu_kernel


@pytest.fixture
def torch_path(monkeypatch: pytest.MonkeyPatch):
    """Run ``fn`` with the kernel switched off (the path taken on accelerators or without numba)."""

    def run(fn, *args, **kwargs):
        with monkeypatch.context() as patch:
            patch.setattr(draws, "_cpu_kernel", lambda: None)
            return fn(*args, **kwargs)

    return run


def spiky_inputs(batch: int, k: int, vocab: int, seed: int, dtype=torch.float32):
    """Peaked rows with exact zeros, a draft equal to the target in some rows (empty residual), one-hot rows."""
    generator = torch.Generator().manual_seed(seed)
    logits = 4 * torch.randn(batch, k + 1, vocab, generator=generator)
    logits[logits < -6] = -float("inf")  # exact zeros in both rows
    target = logits.softmax(-1).to(dtype)
    draft = (logits[:, :k] + torch.randn(batch, k, vocab, generator=generator)).softmax(-1).to(dtype)
    draft[::3] = target[::3, :k]  # residual all zero: the draw falls back to the target row
    target[1::4] = 0
    target[1::4, :, vocab - 1] = 1  # one-hot at the last token, also past a chunk edge
    draft_tokens = torch.multinomial(draft.float().reshape(-1, vocab), 1, generator=generator).view(batch, k)
    uniforms = torch.rand(batch, k + 1, generator=generator, dtype=torch.float64)
    return target, draft, draft_tokens, uniforms


@pytest.mark.parametrize("vocab", [7, 256, 1000, 49_152])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_equals_torch_path_and_reference(vocab, dtype, torch_path):
    batch = 40 if vocab == 49_152 else 24  # 40 x 49152 is past the parallel threshold
    target, draft, draft_tokens, uniforms = spiky_inputs(batch, 3, vocab, seed=vocab, dtype=dtype)
    assert cpu_kernel.usable(target, draft)
    fused = rejection_sample(target, draft, draft_tokens, uniforms=uniforms)
    batched = torch_path(rejection_sample, target, draft, draft_tokens, uniforms=uniforms)
    reference = rejection_sample_reference(target, draft, draft_tokens, uniforms)
    for expected in (batched, reference):
        assert torch.equal(fused[0], expected[0]) and torch.equal(fused[1], expected[1])


@pytest.mark.parametrize("vocab", [7, 1000, 49_152])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_verification_on_the_kernel_equals_the_torch_path(vocab, dtype, torch_path):
    """The fused masses and the scaled-residual draw give block_verify the torch path's tokens, row for row."""
    batch = 40 if vocab == 49_152 else 24
    target, draft, draft_tokens, uniforms = spiky_inputs(batch, 4, vocab, seed=vocab + 1, dtype=dtype)
    draft_tokens[::2, 0] = target[::2, 0].argmax(-1)  # likely first drafts: rows that keep a prefix
    fused = block_verify(target, draft, draft_tokens, uniforms=uniforms)
    batched = torch_path(block_verify, target, draft, draft_tokens, uniforms=uniforms)
    assert torch.equal(fused[0], batched[0]) and torch.equal(fused[1], batched[1])
    assert len(set(fused[1].tolist())) > 1  # rows really differ in how much they keep


def test_residual_masses_match_the_torch_sums(torch_path):
    target, draft, _, _ = spiky_inputs(64, 3, 49_152, seed=11)  # past the parallel threshold
    rows = torch.tensor([0, 2])
    scale = torch.rand(64, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fused = draws.residual_masses(target, draft, rows, scale)
    batched = torch_path(draws.residual_masses, target, draft, rows, scale)
    assert fused.dtype == torch.float64 and torch.allclose(fused, batched, rtol=1e-12, atol=1e-15)
    alone = draws.residual_masses(target[5:6], draft[5:6], rows, scale[5:6])  # serial kernel, one entry
    assert torch.equal(alone[0], fused[5])


def test_serial_and_parallel_kernels_agree_row_for_row():
    """A row's token depends only on its row: the batch of 64 (parallel) equals each row drawn alone (serial)."""
    target, draft, draft_tokens, uniforms = spiky_inputs(64, 2, 49_152, seed=5)
    assert 64 * 49_152 >= cpu_kernel.PARALLEL_MIN_ENTRIES
    together = rejection_sample(target, draft, draft_tokens, uniforms=uniforms)[0]
    for row in range(0, 64, 7):
        alone = rejection_sample(target[row : row + 1], draft[row : row + 1], draft_tokens[row : row + 1],
                                 uniforms=uniforms[row : row + 1])[0]
        assert torch.equal(alone[0], together[row])


def test_kernel_reads_strided_and_expanded_inputs_like_the_torch_path(torch_path):
    target, draft, draft_tokens, uniforms = spiky_inputs(8, 2, 300, seed=3)
    shared_target = target[:1].expand(8, -1, -1)  # one prompt's rows shared by the batch (stride 0)
    draft_view = torch.cat([draft, draft], dim=-1)[..., :300]  # rows not contiguous with each other
    assert cpu_kernel.usable(shared_target, draft_view)
    fused = rejection_sample(shared_target, draft_view, draft_tokens, uniforms=uniforms)
    batched = torch_path(rejection_sample, shared_target, draft_view, draft_tokens, uniforms=uniforms)
    assert torch.equal(fused[0], batched[0])


def test_unusable_inputs_take_the_torch_path():
    target, draft, draft_tokens, uniforms = spiky_inputs(4, 2, 64, seed=9)
    half = target.to(torch.bfloat16)
    assert not cpu_kernel.usable(half, draft)
    assert not cpu_kernel.usable(target[..., ::2], None)  # no unit stride over V
    tokens, emitted = rejection_sample(half, draft.to(torch.bfloat16), draft_tokens, uniforms=uniforms)
    assert tokens.shape == (4, 3) and ((emitted >= 1) & (emitted <= 3)).all()


def test_plain_draws_never_return_a_zero_weight_token(torch_path):
    probs = torch.zeros(200, 513)
    probs[:, 511] = 1e-30  # tiny but positive, at the far end of the last partial chunk
    probs[:, 3] = 1.0
    probs[::2, 3] = 0.0  # these rows can only return 511
    tokens = draws.sample_from_probs(probs, torch.Generator().manual_seed(0))
    assert set(tokens[::2].tolist()) == {511} and set(tokens[1::2].tolist()) <= {3, 511}
    assert torch.equal(tokens, torch_path(draws.sample_from_probs, probs, torch.Generator().manual_seed(0)))


def test_an_empty_residual_draws_from_the_target_row(torch_path):
    """draft >= target everywhere (numerically empty residual): the draw falls back to the target row."""
    generator = torch.Generator().manual_seed(4)
    target = torch.rand(6, 1, 700, generator=generator).softmax(-1)
    draft = target * 1.5
    uniforms = torch.rand(6, generator=generator, dtype=torch.float64)
    rows, use_residual = torch.zeros(6, dtype=torch.int64), torch.ones(6, dtype=torch.bool)
    fused = draws.sample_target_or_residual(target, rows, uniforms, draft, rows, use_residual)
    plain = draws.sample_target_or_residual(target, rows, uniforms)
    batched = torch_path(draws.sample_target_or_residual, target, rows, uniforms, draft, rows, use_residual)
    assert torch.equal(fused, plain) and torch.equal(fused, batched)
    assert len(set(fused.tolist())) > 1  # really drawn from the rows, not a constant fallback

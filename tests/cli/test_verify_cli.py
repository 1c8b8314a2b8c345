"""``specdec verify``: passes for lossless configurations, catches a broken acceptance rule.

Toy runs (``--toy``) take a few seconds each; the real-model smoke test is ``slow``.
"""
from __future__ import annotations

import pytest

TOY = ("verify", "--toy", "--prompts", "1")


@pytest.mark.parametrize("overrides", [
    ("method=draft_target", "method.self_speculative_layers=1", "sampler=temperature"),
    ("method=draft_target", "sampler=topk", "sampler.top_k=6", "method.num_draft_tokens=3"),
    ("method=ngram", "method.min_n=1", "sampler=temperature"),
    ("method=draft_target", "method.self_speculative_layers=1", "sampler=temperature", "rejection.verification=block"),
])
def test_toy_verify_passes_for_lossless_configurations(specdec, overrides: tuple[str, ...]) -> None:
    result = specdec(*TOY, "--samples", "600", *overrides)
    assert result.exit_code == 0, result.out + result.err
    assert "verdict: MATCH" in result.out and " exact " in result.out
    assert "speculation: 0 drafts proposed" not in result.out


def test_toy_verify_catches_a_residual_that_is_ignored(specdec, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recovered token drawn from the target instead of normalize(max(p - q, 0)): lossy."""
    import specdec_cli.sampling.acceptance as acceptance

    original = acceptance.sample_target_or_residual

    def broken(target_probs, target_row, uniforms, **kwargs):
        return original(target_probs, target_row, uniforms)

    monkeypatch.setattr(acceptance, "sample_target_or_residual", broken)
    result = specdec(*TOY, "--samples", "1000", "method=draft_target", "sampler=temperature")
    assert result.exit_code == 1, result.out + result.err
    assert "verdict: DIFFER" in result.out and "DIFFER" in result.out.split("verdict")[0]


@pytest.mark.parametrize("args,message", [
    (("method=none",), "method=none drafts nothing"),
    (("method=suffix",), "method=suffix is not implemented yet"),
    (("method=ngram", "rejection=on"), "method=ngram does not support rejection sampling"),
    (("--tokens", "0", "method=ngram"), "--tokens 0: must be in 1..8"),
    (("method=draft_target", "method.self_speculative_layers=4"), "the toy target has 2 layers"),
    (("sampler=nucleus",), "sampler=nucleus: no such option"),
])
def test_verify_config_errors_exit_2(specdec, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...],
                                     message: str) -> None:
    from specdec_cli.drafters import DRAFTERS

    monkeypatch.delitem(DRAFTERS._items, "suffix")  # stands in for a method without a drafter yet
    result = specdec("verify", "--toy", *args)
    assert result.exit_code == 2
    (line,) = result.err.splitlines()
    assert line.startswith("error: ") and message in line, line


@pytest.mark.slow
def test_real_model_verify_smoke(specdec) -> None:
    """The embedded SmolLM2 with self-speculation: a small but complete check."""
    result = specdec("verify", "method=draft_target", "method.self_speculative_layers=4", "sampler=topk",
                     "--samples", "96", "--prompts", "1", "--tokens", "2")
    assert result.exit_code == 0, result.out + result.err
    assert "verdict: MATCH" in result.out and "showcase_0" in result.out  # the default workload's first prompt


@pytest.mark.slow
def test_real_model_verify_checks_the_auto_tree_that_run_uses(specdec, monkeypatch: pytest.MonkeyPatch) -> None:
    """``specdec verify method=eagle3`` checks what ``specdec run method=eagle3`` runs at batch 1: the auto tree
    (tree_topk 2, K + 1 = 5 nodes for a sampled request), not the chain."""
    from specdec_cli.engine.tree import TreeSpecEngine

    built: list[TreeSpecEngine] = []
    init = TreeSpecEngine.__init__

    def recording_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(TreeSpecEngine, "__init__", recording_init)
    result = specdec("verify", "method=eagle3", "sampler=temperature", "--samples", "60", "--prompts", "1",
                     "--tokens", "2")
    assert result.exit_code == 0, result.out + result.err
    assert "verdict: MATCH" in result.out
    assert "method.tree_topk=auto -> 2: checked the dynamic draft tree" in result.out
    assert [(engine.max_nodes, engine.sampled_max_nodes) for engine in built] == [(8, 5)]

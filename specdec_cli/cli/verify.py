"""``specdec verify``: is speculative decoding with this configuration still lossless?"""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from specdec_cli.cli.output import console

if TYPE_CHECKING:
    from specdec_cli.verify.check import VerifyOutcome


def verify(
    overrides: Annotated[
        Optional[list[str]], typer.Argument(help="Hydra overrides, e.g. method=draft_target sampler=topk")
    ] = None,
    tokens: Annotated[int, typer.Option("--tokens", help="Generated tokens tested per sample.")] = 3,
    samples: Annotated[
        Optional[int], typer.Option("--samples", help="Samples per prompt and side [default: 400; --toy: 1000].")
    ] = None,
    prompts: Annotated[
        Optional[int], typer.Option("--prompts", help="Prompts of the workload [default: 3; --toy: 2].")
    ] = None,
    batch: Annotated[
        Optional[int], typer.Option("--batch", help="Engine batch size, replaces engine.max_batch_size "
                                    "[default: 32; --toy: 128].")
    ] = None,
    alpha: Annotated[float, typer.Option("--alpha", help="Family-wise significance level (Bonferroni).")] = 0.01,
    seed: Annotated[int, typer.Option("--seed", help="First request seed.")] = 0,
    toy: Annotated[
        bool, typer.Option("--toy", help="A toy target (seconds on CPU); also tests against its exact law.")
    ] = False,
) -> None:
    """Sample continuations with speculation and with target-only sampling and test that they match.

    \b
    specdec verify method=draft_target method.self_speculative_layers=4 sampler=topk
    specdec verify --toy method=ngram method.min_n=1 sampler=temperature
    Exit 0: the distributions match; 1: they differ; 2: invalid configuration.
    """
    from specdec_cli.verify.check import verify as run_verify  # torch loads only here
    from specdec_cli.verify.setup import VerifyOptions

    options = VerifyOptions(num_tokens=tokens, num_samples=samples, num_prompts=prompts, batch_size=batch,
                            alpha=alpha, seed=seed, toy=toy)
    outcome = run_verify(list(overrides or []), options, progress=_progress)
    _print_outcome(outcome)
    if not outcome.verdict.match:
        raise typer.Exit(code=1)


def _progress(line: str) -> None:
    console.print(Text(f"  sampled {line}", style="dim"), soft_wrap=True)


def _print_outcome(outcome: VerifyOutcome) -> None:
    verdict = outcome.verdict
    table = Table(title=f"losslessness: {outcome.method}, {outcome.sampler}, rejection {outcome.rejection}",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for header in ("prompt", "test", "vs", "chi2/dof", "p-value", "TV", "bound", "result"):
        table.add_column(header, justify="left" if header in ("prompt", "test", "vs", "result") else "right",
                         no_wrap=True)
    for test in verdict.tests:
        failed = verdict.failed(test)
        table.add_row(
            test.prompt, test.test, test.reference, f"{test.chi2:.1f}/{test.dof}", f"{test.p_value:.1e}",
            f"{test.tv:.3f}", f"{test.tv_bound:.3f}",
            Text("DIFFER", style="bold red") if failed else Text("ok", style="green"),
        )
    console.print(table)
    console.print("vs: samples = target-only samples (chi-square homogeneity); target p = the target's "
                  "probabilities given each sampled prefix (chi-square); exact = the exact law (toy)",
                  markup=False, highlight=False, soft_wrap=True)
    rate = outcome.accepted_drafts / outcome.proposed_drafts if outcome.proposed_drafts else 0.0
    lines = [
        f"target: {outcome.target}; {outcome.num_samples} samples per prompt and side, "
        f"{outcome.num_tokens} tokens each",
        f"speculation: {outcome.proposed_drafts} drafts proposed, {outcome.accepted_drafts} accepted ({rate:.1%})",
        f"Bonferroni: {len(verdict.tests)} tests at family-wise alpha={verdict.alpha:g}: a test fails when "
        f"p < {verdict.threshold:.2e} or TV > its bound ({verdict.tv_factor:.2f} x E[TV | same law] + 1/n)",
    ] + [f"note: {note}" for note in outcome.notes]
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if verdict.match:
        console.print(Text("verdict: MATCH - no test rejects that the output follows the target law",
                           style="bold green"))
    else:
        failed = sum(verdict.failed(test) for test in verdict.tests)
        console.print(Text(f"verdict: DIFFER - {failed} of {len(verdict.tests)} tests reject the target law",
                           style="bold red"))

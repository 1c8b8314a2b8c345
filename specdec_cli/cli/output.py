"""Where the CLI prints: results on stdout, errors on stderr as one line per problem."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.table import Table
from rich.text import Text

from specdec_cli.config.compose import describe_hydra_error
from specdec_cli.config.effective import EffectiveConfig
from specdec_cli.config.schema import RunConfig
from specdec_cli.errors import ConfigError, SpecdecError

if TYPE_CHECKING:
    from specdec_cli.run.result import RunResult  # torch loads only for real runs

DEBUG_ENV = "SPECDEC_DEBUG"

console = Console()
err_console = Console(stderr=True)


def debug_enabled() -> bool:
    """``--debug`` or ``SPECDEC_DEBUG=1``: let tracebacks through."""
    return os.environ.get(DEBUG_ENV) == "1"


def error_lines(err: BaseException) -> tuple[list[str], int]:
    """The lines to print for an error and the exit code (2: config or input, 1: other)."""
    if isinstance(err, ConfigError):
        return err.violations, err.exit_code
    if isinstance(err, (HydraException, OmegaConfBaseException)):
        return [describe_hydra_error(err)], 2
    if isinstance(err, SpecdecError):
        return [str(err)], err.exit_code
    return [f"unexpected {type(err).__name__}: {err} (--debug shows the traceback)"], 1


def print_errors(lines: list[str], prefix: str = "") -> None:
    """Each line as ``error: <prefix><line>`` on stderr, never wrapped."""
    for line in lines:
        text = Text("error: ", style="bold red")
        text.append(prefix + line)
        err_console.print(text, soft_wrap=True, highlight=False)


def acceptance_label(effective: EffectiveConfig) -> str:
    """How drafts are accepted, in words."""
    if effective.rejection:
        return "rejection sampling (lossless)" + effective.verification_label()
    return "relaxed (lossy)" if effective.relaxed_acceptance else "strict"


def print_effective(cfg: RunConfig, effective: EffectiveConfig) -> None:
    """The settings a run will use, then why each silent decision was taken."""
    sampler = cfg.sampler
    rows = {
        "method": f"{cfg.method.name}, K={cfg.method.num_draft_tokens}",
        "draft length by batch size": str(effective.draft_len_schedule),
        "sampler": f"{sampler.name} (T={sampler.temperature}, top_k={sampler.top_k}, "
        f"top_p={sampler.top_p})",
        "acceptance": acceptance_label(effective),
        "rejection backend": effective.backend,
        "all requests greedy": "yes" if effective.all_greedy else "no",
        "device": f"{effective.device} ({cfg.model.dtype})",
        "model": cfg.model.path or f"{cfg.model.name} (embedded)",
        "workload": f"{cfg.workload.name}, {cfg.workload.max_new_tokens} new tokens",
    }
    table = Table(title="effective settings", show_header=False, title_justify="left")
    for key, value in rows.items():
        table.add_row(key, Text(value))
    console.print(table)
    for reason in effective.reasons:
        console.print(Text(f"  - {reason}"), soft_wrap=True)


def tree_nodes_label(effective: EffectiveConfig) -> str:
    """The nodes a run's tree verifies: "8", or "8 greedy / 5 sampled" when its requests mix both."""
    greedy, sampled = effective.tree_nodes, effective.sampled_tree_nodes
    if effective.all_greedy or greedy == sampled:
        return str(greedy)
    return str(sampled) if effective.all_sampled else f"{greedy} greedy / {sampled} sampled"


def print_run_summary(result: RunResult, output_dir: str) -> None:
    """The headline numbers of a finished run."""
    metrics, method, effective = result.metrics, result.config.method, result.effective
    topk = effective.tree_topk
    per_position = ", ".join(f"{rate:.2f}" for rate in metrics["per_position_acceptance"]) or "-"
    rows = {
        "method": f"{method.name} (K={method.num_draft_tokens}"
        + (f"; tree: topk {topk}, {tree_nodes_label(effective)} nodes)" if topk > 1 else ")"),
        "sampler": result.config.sampler.name,
        "acceptance": acceptance_label(effective),
        "requests / tokens": f"{metrics['num_requests']} / {metrics['generated_tokens']}",
        "acceptance length": f"{metrics['acceptance_length']:.2f} tokens per verify step",
        "acceptance rate": f"{metrics['acceptance_rate']:.1%} of drafts",
        "per-position acceptance": per_position,
        "throughput": f"{metrics['tokens_per_s']:.1f} tokens/s ({metrics['wall_s']:.1f} s, "
        f"{metrics['target_forwards']} target forwards)",
    }
    if "baseline" in metrics:
        rows.update(baseline_rows(metrics))
    if metrics.get("guard_fallbacks"):
        rows["guard fallbacks"] = str(metrics["guard_fallbacks"])
    rows["results"] = output_dir
    table = Table(title="run summary", show_header=False, title_justify="left")
    for key, value in rows.items():
        table.add_row(key, Text(value))
    console.print(table)


def baseline_rows(metrics: dict) -> dict[str, str]:
    """The summary rows of a ``baseline=true`` run: the autoregressive throughput, the speed-up, the mean time
    per output token of both, and (greedy runs) whether the outputs are identical."""
    baseline = metrics["baseline"]
    rows = {
        "autoregressive baseline": f"{baseline['tokens_per_s']:.1f} tokens/s ({baseline['wall_s']:.1f} s, "
        f"{baseline['target_forwards']} target forwards)",
        "speed-up": f"{metrics['speedup']:.2f}x tokens/s over autoregressive",
    }
    tpot_ms, baseline_tpot_ms = 1e3 * metrics["tpot_s"]["mean"], 1e3 * baseline["tpot_s"]["mean"]
    if tpot_ms > 0 and baseline_tpot_ms > 0:  # after the first token: the prefill, equal for both, left out
        rows["time per output token"] = (f"{tpot_ms:.1f} ms vs {baseline_tpot_ms:.1f} ms autoregressive "
                                         f"({baseline_tpot_ms / tpot_ms:.2f}x), after the first token")
    if "baseline_identical" in metrics:
        rows["greedy output = autoregressive"] = "yes" if metrics["baseline_identical"] else "NO (not lossless)"
    return rows

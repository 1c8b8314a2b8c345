"""``specdec run`` with parallelism: it spawns its ranks itself, or joins torchrun's ranks."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from toy_run import Methods, Paths, Reference, outputs, results

from specdec_cli.cli.main import main


def cli_overrides(paths: Paths, method: list[str]) -> list[str]:
    """The toy run of ``toy_run.run_config`` as command-line overrides."""
    return [
        "model=hf", f"model.path={paths['target']}", "model.chat_template=false", "workload=jsonl",
        f"workload.path={paths['prompts']}", "workload.max_new_tokens=10", "engine.max_batch_size=2",
        "engine.max_seq_len=64", "engine.prefill_chunk=4", *method,
    ]


def test_specdec_run_spawns_its_ranks(toy_paths: Paths, methods: Methods, reference: Reference, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    argv = ["specdec", "run", *cli_overrides(toy_paths, methods["self_spec"]), "parallelism=tp2",
            f"hydra.run.dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        main()
    assert (done.value.code or 0) == 0
    assert [row["output_token_ids"] for row in outputs(tmp_path)] == [
        row["output_token_ids"] for row in reference(*methods["self_spec"])
    ]
    assert results(tmp_path)["parallel"]["collectives"]["draft.argmax_pairs"] > 0


def test_under_torchrun_every_rank_runs_the_cli_and_only_rank_0_writes(
    toy_paths: Paths, methods: Methods, reference: Reference, tmp_path: Path
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(2):  # what torchrun --nproc-per-node 2 -m specdec_cli run ... starts
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        command = [sys.executable, "-m", "specdec_cli", "run", *cli_overrides(toy_paths, methods["ngram"]),
                   "parallelism=adp2", f"hydra.run.dir={tmp_path / f'rank{rank}'}"]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], logs
    assert "run summary" in logs[0] and "run summary" in logs[1]  # every rank returns the merged results
    assert not (tmp_path / "rank1" / "results.json").exists()
    assert not (tmp_path / "rank1" / "outputs.jsonl").exists()
    assert [row["output_token_ids"] for row in outputs(tmp_path / "rank0")] == [
        row["output_token_ids"] for row in reference(*methods["ngram"])
    ]

"""``specdec serve`` as a user starts it: settings refused before loading, then a live server on loopback."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from specdec_cli.cli.main import main

SPECDEC = Path(sys.executable).parent / "specdec"


@pytest.mark.parametrize(("args", "line"), [
    (["server.port=70000"], "error: server.port=70000 must be an integer in [0, 65535] (0: any free port)"),
    (["method=ngram", "rejection=on"], "error: method=ngram does not support rejection sampling"),
    (["server.hots=1"], "error: Could not override 'server.hots'"),
])
def test_bad_settings_exit_2_before_loading(args, line, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPECDEC_DEBUG", "0")
    monkeypatch.setattr(sys, "argv", ["specdec", "serve", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and "loading" not in captured.out
    (printed,) = captured.err.splitlines()
    assert printed.startswith(line)


def test_specdec_serve_answers_on_loopback_and_stops_on_ctrl_c(tiny_model_dir: Path) -> None:
    command = [str(SPECDEC), "serve", f"model.path={tiny_model_dir}", "method=ngram", "server.port=0",
               "server.model_name=tiny"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "specdec serve exited early"
            if "Uvicorn running on " in line:
                url = line.split("Uvicorn running on ")[1].split()[0]
        assert url is not None and url.startswith("http://127.0.0.1:")
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
            assert http.get("/health").json() == {"status": "ok"}
            assert http.get("/v1/models").json()["data"][0]["id"] == "tiny"
            reply = http.post("/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 3})
            assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert "Application shutdown complete" in rest and "Traceback" not in rest
        # a graceful shutdown; uvicorn then re-raises the captured Ctrl-C (130 / -SIGINT), except when the signal
        # lands while its own handlers are being restored, where it exits 0 (seen once on a loaded machine)
        assert proc.returncode in (0, 130, -signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

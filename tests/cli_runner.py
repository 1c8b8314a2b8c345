"""``specdec`` run in-process through its real entry point, for tests of every command (a helper, not tests)."""
from __future__ import annotations


def run_cli_main(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    """``specdec <argv>`` in-process through the real entry point (errors printed, no traceback):
    (exit code, stdout, stderr). ``monkeypatch`` and ``capsys`` are pytest's fixtures."""
    import sys

    from specdec_cli.cli.main import main

    monkeypatch.setenv("SPECDEC_DEBUG", "0")
    monkeypatch.setattr(sys, "argv", ["specdec", *argv])
    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err

"""Shell completion for ``specdec``: its commands, their options and, after ``run`` / ``train``, Hydra overrides.

``eval "$(specdec run -sc install=bash)"`` (Hydra's spelling; ``train`` prints the same script) binds a bash
function to ``specdec``. On <TAB> it runs ``specdec`` with ``SPECDEC_COMPLETE=bash`` and bash's ``COMP_LINE`` /
``COMP_POINT`` and offers what that prints: command names after ``specdec``, a command's options, and for
``run`` / ``train`` Hydra's own candidates (groups, options, fields), asked with the command word taken out
of the line, which is the line Hydra's completion expects of a one-command application.
"""
from __future__ import annotations

import contextlib
import io
import os
from typing import Optional

import click
import typer
import typer.main

COMPLETE_ENV = "SPECDEC_COMPLETE"
HYDRA_COMMANDS = ("run", "train")
SHELLS = ("bash", "zsh")  # zsh: through bashcompinit
BASH_SCRIPT = f"""_specdec_completion()
{{
    local choices
    choices=$({COMPLETE_ENV}=bash COMP_LINE="$COMP_LINE" COMP_POINT="$COMP_POINT" "${{COMP_WORDS[0]}}" 2>/dev/null)
    COMPREPLY=($(compgen -o nospace -o default -W "$choices" -- "${{COMP_WORDS[$COMP_CWORD]}}"))
}}
if [ -n "$ZSH_VERSION" ]; then autoload -U +X bashcompinit && bashcompinit; fi
COMP_WORDBREAKS=${{COMP_WORDBREAKS//=}}
complete -o nospace -o default -F _specdec_completion specdec"""
UNINSTALL_SCRIPT = "complete -r specdec 2>/dev/null; unset -f _specdec_completion"


def script_request(args: list[str]) -> Optional[str]:
    """The script ``-sc install=<shell>`` / ``-sc uninstall=<shell>`` in ``args`` asks for, else None
    (``-sc query=...`` goes on to Hydra). Raises ``typer.BadParameter`` for a shell without a script."""
    for flag, value in zip(args, args[1:]):
        action, _, shell = value.partition("=")
        if flag in ("-sc", "--shell-completion") and action in ("install", "uninstall"):
            if shell not in SHELLS:
                raise typer.BadParameter(f"shell completion: {shell!r} is not one of {', '.join(SHELLS)}")
            return BASH_SCRIPT if action == "install" else UNINSTALL_SCRIPT
    return None


def complete(app: typer.Typer, line: str, point: Optional[int] = None) -> None:
    """Print the candidates for the word at ``point`` of ``line`` (bash's ``COMP_LINE`` / ``COMP_POINT``)."""
    line = line[: len(line) if point is None else point]
    words = line.split()
    before = words if line.endswith(" ") else words[:-1]  # complete words, without the one being typed
    commands = [word for word in before[1:] if not word.startswith("-")]
    group = typer.main.get_command(app)
    assert isinstance(group, typer.main.TyperGroup)
    if not commands:
        print(" ".join([*sorted(group.commands), *_options(group)]))
    elif commands[0] in HYDRA_COMMANDS:
        rest = before[before.index(commands[0]) + 1:] + words[len(before):]
        os.environ["COMP_LINE"] = " ".join(["specdec", *rest]) + (" " if line.endswith(" ") else "")
        with contextlib.redirect_stdout(io.StringIO()) as hydra_out, contextlib.suppress(SystemExit):
            app(prog_name="specdec", args=[commands[0], "-sc", "query=bash"])  # Hydra prints the candidates
        print(" ".join(word for word in hydra_out.getvalue().split() if not _is_schema(word)))
    elif commands[0] in group.commands:
        print(" ".join(_options(group.commands[commands[0]])))


def _options(command: click.Command) -> list[str]:
    opts = [opt for param in command.params for opt in [*param.opts, *param.secondary_opts] if opt.startswith("-")]
    return [*opts, "--help"]


def _is_schema(candidate: str) -> bool:
    """``method=base_eagle3``: a schema in the ConfigStore (config/store.py), not an option to pick."""
    return candidate.rpartition("=")[2].startswith("base_") or "/base_" in candidate

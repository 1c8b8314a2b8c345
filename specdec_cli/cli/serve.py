"""``specdec serve``: the OpenAI-compatible HTTP server (``specdec_cli/serve/``) on ``server.host:server.port``.

Overrides compose and validate exactly as for ``specdec run`` (plus the ``server`` section), all
before the model loads; then uvicorn serves until Ctrl-C.
"""
from __future__ import annotations

import typer

from specdec_cli.cli.output import console
from specdec_cli.config.compose import compose_config
from specdec_cli.config.validate import resolve
from specdec_cli.errors import ConfigError


def serve(ctx: typer.Context) -> None:
    """Serve the OpenAI API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics).

    \b
    specdec serve method=eagle3 server.port=8000
    specdec serve method=ngram engine.max_batch_size=16 sampler=temperature
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'
    """
    from specdec_cli.serve.server import Server, check_server  # torch, fastapi and uvicorn load here only

    cfg = compose_config(list(ctx.args))
    problems = check_server(cfg.server)
    if problems:
        raise ConfigError(problems)
    resolve(cfg)  # every settings problem before the model loads (LLM checks again, in milliseconds)
    from specdec_cli.api.llm import LLM

    console.print(f"loading {cfg.model.path or cfg.model.name} with method={cfg.method.name} ...", markup=False)
    llm = LLM(list(ctx.args))
    server = Server(llm, cfg.server.host, cfg.server.port, log_level="info")
    console.print(f"serving {llm.model_name!r} (OpenAI API under /v1, /health, /metrics); Ctrl-C stops",
                  markup=False)
    server.run()

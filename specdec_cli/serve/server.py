"""uvicorn around the app: ``check_server`` before loading, ``Server`` to run it (foreground or thread)."""
from __future__ import annotations

import threading
import time
from typing import Optional

import uvicorn

from specdec_cli.api.llm import LLM
from specdec_cli.config.schema import ServerConfig
from specdec_cli.serve.app import create_app


def check_server(cfg: ServerConfig) -> list[str]:
    """The problems of the ``server`` section, one line each."""
    out = []
    if not isinstance(cfg.port, int) or not 0 <= cfg.port <= 65535:
        out.append(f"server.port={cfg.port!r} must be an integer in [0, 65535] (0: any free port)")
    if not cfg.host.strip():
        out.append("server.host must be a host name or address (127.0.0.1: this machine only)")
    return out


class Server:
    """uvicorn serving ``llm`` on ``host:port`` (port 0: a free one, see ``port`` once started)."""

    def __init__(self, llm: LLM, host: str, port: int, log_level: str = "warning") -> None:
        config = uvicorn.Config(create_app(llm), host=host, port=port, log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=5)
        self.uvicorn = uvicorn.Server(config)
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        """The bound port (after start)."""
        return self.uvicorn.servers[0].sockets[0].getsockname()[1]

    def run(self) -> None:
        """Serve in this thread until interrupted (Ctrl-C)."""
        self.uvicorn.run()

    def start(self, timeout_s: float = 60.0) -> "Server":
        """Serve from a background thread; returns once it accepts connections."""
        self._thread = threading.Thread(target=self.uvicorn.run, name="specdec-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.uvicorn.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.uvicorn.started:
            raise RuntimeError(f"the server did not start within {timeout_s:g} s")
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)

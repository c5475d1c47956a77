"""The worker's web console: ``memstream.console`` served with uvicorn on the console port.

``memstream worker`` serves it only with ``MEMSTREAM_CONSOLE_TOKEN`` set. ``memstream dev``
makes a token when none is set and keeps it in ``<state dir>/console-token`` (mode 0600), so a
developer's stack has a console at once and the token is never printed or logged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from memstream.console import ConsoleBackend, ConsoleServer, serve, standalone
from memstream.consumers.logs import log
from memstream.consumers.natsconn import nats_options
from memstream.pipeline.redact import Redacts
from memstream.schemas.settings import Settings

TOKEN_FILE = "console-token"


@dataclass
class RunningConsole:
    server: ConsoleServer
    backend: ConsoleBackend
    token_file: Path | None

    @property
    def url(self) -> str:
        return str(self.server.url)

    async def stop(self) -> None:
        await self.server.stop()
        await self.backend.close()


def dev_token(state_dir: Path) -> tuple[str, Path]:
    """The development stack's operator token: kept across restarts, readable by its owner."""
    path = state_dir / TOKEN_FILE
    with contextlib.suppress(OSError):
        if token := path.read_text().strip():
            return token, path
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, path


async def start(
    settings: Settings, nats_url: str, redactor: Redacts | None, dev: bool
) -> RunningConsole | None:
    """Serve the console, or None (no port configured, or no token outside ``dev``)."""
    if settings.console_port is None:
        return None
    token_file = None
    if settings.console_token is not None:
        token = settings.console_token.get_secret_value()
    elif dev:
        token, token_file = dev_token(settings.state_dir)
    else:
        log.info("console.disabled", reason="set MEMSTREAM_CONSOLE_TOKEN to serve the console")
        return None
    backend = await ConsoleBackend.connect(settings, nats_url, redactor, nats_options(settings))
    try:
        server = await serve(
            standalone(backend, token), settings.console_host, settings.console_port
        )
    except BaseException:
        await backend.close()
        raise
    log.info("console.serving", url=server.url)
    return RunningConsole(server, backend, token_file)


async def _serve_alone(settings: Settings, nats_url: str) -> int:
    """``memstream console``: the console alone, a NATS client of workers running elsewhere."""
    import asyncio
    import signal

    if settings.console_token is None:
        log.error("console.disabled", reason="set MEMSTREAM_CONSOLE_TOKEN")
        return 2
    # no redactor here: dead letters are redacted by the workers (<ns>.ops.redact)
    running = await start(settings, nats_url, None, dev=False)
    if running is None:
        return 2
    print(f"memstream console at {running.url} (Ctrl-C stops it)", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop()
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("console", help="serve the web console alone (workers run elsewhere)")

    def main(a: argparse.Namespace) -> int:
        import asyncio

        from memstream.producers.client import discover_nats_url

        settings = Settings()
        if settings.console_port is None:
            settings = settings.model_copy(update={"console_port": 9465})
        return asyncio.run(_serve_alone(settings, settings.nats_url or discover_nats_url()))

    p.set_defaults(func=main)

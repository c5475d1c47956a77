"""Serve the console with uvicorn inside an already running event loop (the worker's)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import uvicorn


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the host process (``memstream dev``) owns
    SIGINT/SIGTERM and stops the console itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass
class ConsoleServer:
    host: str
    port: int
    server: _Server
    task: asyncio.Task[None]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/console/"

    async def stop(self) -> None:
        self.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 10)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def serve(app: Any, host: str = "127.0.0.1", port: int = 0) -> ConsoleServer:
    """Start serving ``app`` on ``host:port`` (0: a free port; a taken port falls back to a
    free one, as the ops port does); returns once it accepts connections."""
    try:
        sock = _bind(host, port)
    except OSError:
        sock = _bind(host, 0)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="off")
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise RuntimeError("the console server stopped during start-up")
        await asyncio.sleep(0.01)
    return ConsoleServer(host, sock.getsockname()[1], server, task)

"""``memstream gateway``: serve the HTTP gateway against configured services; and the
in-process server ``memstream dev`` starts next to its workers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
from typing import Any

from memstream.producers.client import discover_nats_url
from memstream.schemas.settings import Settings


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one), bound before the server starts so the URL
    printed is the one served."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


# The largest request head (request line and headers) the gateway reads. uvicorn's h11 parser
# refuses a head once this much of it has arrived incomplete (its default: 16 KB), with a
# plain-text 400 and a closed connection, which a client still sending sees as a reset: so a
# long query string worked or failed by how the kernel split it. The routes' own limits admit
# query strings of ~130 KB (``filters``: 10,000 characters, 12 bytes each percent-encoded);
# their validation answers above those, in the error shape.
MAX_REQUEST_HEAD = 256 * 1024


class RunningGateway:
    """A uvicorn server on the caller's event loop (no signal handlers of its own)."""

    def __init__(self, server: Any, sock: socket.socket, host: str) -> None:
        self.server, self.sock = server, sock
        self.port = int(sock.getsockname()[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}"

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.server.shutdown(sockets=[self.sock])
        with contextlib.suppress(OSError):
            self.sock.close()


async def start_gateway(
    settings: Settings, nats_url: str | None, host: str, port: int
) -> RunningGateway:
    """Start serving; returns once the socket accepts connections."""
    import uvicorn

    from memstream.gateway.app import GatewayConfig, create_app

    app = create_app(GatewayConfig.from_settings(settings, nats_url))
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD,
    )
    server = uvicorn.Server(config)
    sock = bind(host, port)
    config.load()
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    return RunningGateway(server, sock, host)


async def _serve(a: argparse.Namespace) -> int:
    settings = Settings()
    host = a.host or settings.gateway_host
    port = a.port if a.port is not None else (settings.gateway_port or 0)
    nats_url = settings.nats_url or discover_nats_url(a.state_dir or settings.state_dir)
    running = await start_gateway(settings, nats_url, host, port)
    print(f"memstream gateway on {running.url}  (docs: {running.url}/docs)", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop()
    return 0


async def _mcp(a: argparse.Namespace) -> int:
    import os
    import sys

    from memstream.gateway.mcp_server import serve_stdio, stdio_client
    from memstream.producers.client import MemoryClientError

    settings = Settings()
    env = os.environ.get
    try:
        mem = await stdio_client(
            a.tenant or env("MEMSTREAM_MCP_TENANT"),
            a.user or env("MEMSTREAM_MCP_USER"),
            a.agent or env("MEMSTREAM_MCP_AGENT"),
            a.api_key or env("MEMSTREAM_API_KEY"),
            settings.nats_url or discover_nats_url(a.state_dir or settings.state_dir),
            settings.namespace,
        )
    except (ValueError, MemoryClientError) as exc:  # sanitized: never the key
        print(f"memstream mcp: {exc}", file=sys.stderr)
        return 2
    await serve_stdio(mem, settings.gateway_flush_timeout_s)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gateway", help="serve the HTTP gateway (the seeds' routes) over NATS")
    p.add_argument("--host", default=None, help="default: MEMSTREAM_GATEWAY_HOST or 127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="default: MEMSTREAM_GATEWAY_PORT or 8010")
    p.add_argument("--state-dir", default=None, help="where `memstream dev` wrote stack.json")
    p.set_defaults(func=lambda a: asyncio.run(_serve(a)))

    m = sub.add_parser(
        "mcp",
        help="serve memory tools to an MCP client over stdio (docs/integrations.md)",
        description="The MCP server on stdin/stdout. The identity is this configuration, never "
        "a tool argument. With a key (MEMSTREAM_API_KEY), the key decides tenant and owner.",
    )
    m.add_argument("--tenant", default=None, help="default: MEMSTREAM_MCP_TENANT")
    m.add_argument("--user", default=None, help="default: MEMSTREAM_MCP_USER")
    m.add_argument("--agent", default=None, help="default: MEMSTREAM_MCP_AGENT")
    m.add_argument(
        "--api-key",
        default=None,
        help="default: MEMSTREAM_API_KEY (prefer the variable: arguments show in `ps`)",
    )
    m.add_argument("--state-dir", default=None, help="where `memstream dev` wrote stack.json")
    m.set_defaults(func=lambda a: asyncio.run(_mcp(a)))

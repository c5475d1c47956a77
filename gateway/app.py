"""The app factory, health and the shared state routes use.

``create_app`` builds the FastAPI app over one SDK client (one NATS connection, shared by
every request; per-request clients are ``MemoryClient.scoped`` copies). Nothing is kept
between requests but a short key cache: any number of copies can run side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from nats.errors import Error as NatsError
from starlette.routing import Mount, Route

from memstream.gateway import errors
from memstream.gateway.identity import KeyResolver
from memstream.producers.client import CommandError, MemoryClient, MemoryClientError
from memstream.producers.connection import NatsAuth
from memstream.schemas.errors import ErrorCode
from memstream.schemas.settings import Settings

TITLE = "memstream gateway"


@dataclass(frozen=True)
class GatewayConfig:
    nats_url: str | None = None
    namespace: str = "mem"
    flush_timeout_s: float = 8.0  # Settings.gateway_flush_timeout_s says why
    request_timeout_s: float = 10.0
    # the operator console at /console: served only with an operator token
    settings: Settings | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, s: Settings, nats_url: str | None = None) -> GatewayConfig:
        return cls(
            nats_url=nats_url or s.nats_url,
            namespace=s.namespace,
            flush_timeout_s=s.gateway_flush_timeout_s,
            request_timeout_s=max(s.recall_timeout_s, 10.0),
            settings=s,
        )


def create_app(config: GatewayConfig | None = None) -> FastAPI:
    """The gateway app. Routers of the seeds are included here; other modules (the MCP
    server, the Mem0-compatible API) add theirs with ``app.include_router``."""
    cfg = config or GatewayConfig.from_settings(Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        console = app.state.console
        joining = asyncio.create_task(_connect_console(console, cfg)) if console else None
        async with app.state.mcp_sessions.run():
            yield
        if joining is not None:
            joining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await joining
            if console.nc.is_connected:
                await console.close()
        await app.state.client.close()

    app = FastAPI(
        title=TITLE,
        version="1",
        lifespan=lifespan,
        description=(
            "Agent memory over HTTP, served by the memstream pipeline (NATS JetStream, "
            'Postgres, Qdrant). Errors are `{"code", "message"}`.'
        ),
        responses={
            401: {"model": errors.ErrorBody, "description": "missing or wrong key"},
            422: {"model": errors.ErrorBody, "description": "invalid request"},
            503: {"model": errors.ErrorBody, "description": "the pipeline cannot be reached"},
        },
    )
    client = MemoryClient(
        "_gateway",
        user="_gateway",
        nats_url=cfg.nats_url,
        namespace=cfg.namespace,
        recall_timeout=cfg.request_timeout_s,
        command_timeout=cfg.request_timeout_s,
        connect_timeout=2.0,
    )
    app.state.client = client
    app.state.config = cfg
    app.state.resolver = KeyResolver(client)
    errors.install(app)

    @app.get("/healthz", tags=["health"], summary="what works and what is missing")
    async def healthz(request: Request) -> JSONResponse:
        return await health(request.app.state.client)

    from memstream.gateway import agent_memory, mem0, mem0_memory, memories, v1

    app.include_router(memories.router)
    app.include_router(v1.router)
    app.include_router(agent_memory.router)
    app.include_router(mem0_memory.router)
    app.include_router(mem0.router)  # last: its catch-alls answer Mem0 paths it does not serve
    from memstream.gateway import mcp_server

    endpoint, app.state.mcp_sessions = mcp_server.http_app(
        app.state.resolver, client, cfg.flush_timeout_s
    )
    # MCP over Streamable HTTP (an ASGI endpoint: every method, the transport decides)
    app.router.routes.append(Route("/mcp", endpoint, include_in_schema=False))
    app.state.console = _mount_console(app, cfg)
    return app


def _mount_console(app: FastAPI, cfg: GatewayConfig) -> Any:
    """The operator console (memstream.console) at ``/console`` when the settings hold an
    operator token; its NATS connection is made in the lifespan. Dead letters are redacted by
    the workers: the gateway holds no redaction key."""
    if cfg.settings is None or cfg.settings.console_token is None:
        return None
    from nats.aio.client import Client as NATS

    from memstream.console import ConsoleBackend
    from memstream.console import create_app as console_app

    backend = ConsoleBackend(cfg.settings, NATS(), owns_connection=True)
    token = cfg.settings.console_token.get_secret_value()
    # first: the Mem0 API's catch-all routes must not shadow it
    app.router.routes.insert(0, Mount("/console", console_app(backend, token)))
    return backend


async def _connect_console(backend: Any, cfg: GatewayConfig) -> None:
    """Connect the console's NATS connection, retrying: the gateway starts (and answers
    /healthz) while NATS is still away; the console's pages say so until it is back."""
    while True:
        try:
            await backend.nc.connect(
                cfg.nats_url,
                name="memstream-gateway-console",
                max_reconnect_attempts=-1,
                **NatsAuth.from_env().connect_options(),
            )
            return
        except (OSError, NatsError, TimeoutError):
            await asyncio.sleep(2)


async def health(client: MemoryClient) -> JSONResponse:
    """200 when NATS and a worker answer, else 503 with ``missing`` naming what is not."""
    checks: dict[str, Any] = {"nats": "ok", "workers": "ok"}
    missing: list[str] = []
    try:
        await client.connect()
    except MemoryClientError:
        checks["nats"] = "unreachable"
        checks["workers"] = "unknown"
        missing.append("nats")
    else:
        try:
            # a key that cannot exist: any worker answers `unauthorized` (Postgres up) or
            # `unavailable` (credentials cannot be checked: Postgres down)
            await asyncio.wait_for(client.whoami("healthz-probe"), 5.0)
        except CommandError as exc:
            if exc.code is ErrorCode.UNAUTHORIZED:
                pass
            elif exc.code is ErrorCode.UNAVAILABLE and "worker" in exc.message:
                checks["workers"] = "none running"
                missing.append("workers")
            elif exc.code is ErrorCode.UNAVAILABLE:
                checks["workers"] = "degraded: a store did not answer"
                missing.append("postgres")
            else:
                checks["workers"] = exc.code.value
                missing.append("workers")
        except (MemoryClientError, TimeoutError):
            checks["workers"] = "no answer"
            missing.append("workers")
    body = {"status": "ok" if not missing else "unavailable", "missing": missing, **checks}
    return JSONResponse(body, status_code=200 if not missing else 503)

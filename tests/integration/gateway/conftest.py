"""A real gateway (uvicorn on a free loopback port, in the test's event loop) over a running
worker on real NATS, Postgres and Qdrant Edge; clients talk to it with httpx over TCP."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from memstream.gateway.cli import RunningGateway, start_gateway


@dataclass
class Gateway:
    url: str
    running: Any  # tests/integration/conftest.py Running
    http: httpx.AsyncClient
    server: RunningGateway

    async def key(self, tenant: str, user: str | None = None, agent: str | None = None) -> str:
        """A new API key (as `memstream keys create` makes it)."""
        k: str = await self.running.pg.create_api_key(tenant, "test", user, agent)
        return k

    async def add(
        self, key: str, user: str, chat: str, *texts: str, **extra: Any
    ) -> httpx.Response:
        msgs = [
            {"sender_id": user, "role": "user", "timestamp": 1_780_000_000_000 + i, "content": t}
            for i, t in enumerate(texts)
        ]
        body = {"user_id": user, "user_key": key, "session_id": f"chat:{chat}", "messages": msgs}
        return await self.http.post("/memories/add", json={**body, **extra})

    async def flush(self, key: str, user: str, chat: str, **extra: Any) -> httpx.Response:
        # the tests wait for their turns longer than a client's default 8 s: a loaded
        # machine must not turn a slow flush into a failed test
        extra.setdefault("timeout_s", 30)
        body = {"user_id": user, "user_key": key, "session_id": f"chat:{chat}", **extra}
        return await self.http.post("/memories/flush", json=body, timeout=60)

    async def search(self, key: str, user: str, query: str, **extra: Any) -> httpx.Response:
        body = {"user_id": user, "user_key": key, "query": query, **extra}
        body.setdefault("scope", ["all_user_memory"])
        return await self.http.post("/memories/search", json=body)


@pytest.fixture
async def gateway(running: Any) -> AsyncIterator[Gateway]:
    server = await start_gateway(running.settings, running.nats_url, "127.0.0.1", 0)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        yield Gateway(server.url, running, http, server)
    await server.stop()


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"

"""50 clients at once, each add -> flush -> search over real HTTP: nothing is lost."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.integration

CLIENTS = 50


async def test_fifty_clients_lose_nothing(gateway, tenant) -> None:
    """Every client's turn is flushed and found by its own current_chat search, and the
    tenant holds exactly one episode per client."""
    key = await gateway.key(tenant)  # one service key; each client is its own user

    async def one(i: int) -> str:
        user, chat = f"user{i}", f"chat{i}"
        fact = f"client {i} parks in bay {1000 + i} near the lift"
        r = await gateway.add(key, user, chat, fact)
        assert r.status_code == 202, r.text
        f = await gateway.flush(key, user, chat)
        assert f.status_code == 200 and f.json()["status"] == "flushed", f.text
        s = await gateway.search(
            key, user, f"where does client {i} park?", conversation_id=chat, scope=["current_chat"]
        )
        assert s.status_code == 200, s.text
        texts = [x["text"] for x in s.json()["results"] if x["memory_type"] == "episode"]
        assert any(f"bay {1000 + i}" in t for t in texts), (i, s.json())
        return user

    users = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(CLIENTS))), 240)
    assert len(set(users)) == CLIENTS
    from memstream.storage.postgres import OwnerFilter

    episodes = 0
    for i in range(CLIENTS):
        rows = await gateway.running.pg.list_memories(OwnerFilter(tenant=tenant, user=f"user{i}"))
        episodes += sum(1 for m in rows if m.type.value == "episode")
    assert episodes == CLIENTS

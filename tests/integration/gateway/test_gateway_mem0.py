"""The Mem0-compatible API, driven by the real ``mem0ai`` clients (``MemoryClient`` and
``AsyncMemoryClient``, only ``host`` changed) against a real gateway, worker and stores.

The sync client blocks: its calls run in a thread so the gateway (in this event loop) answers.
``AsyncMemoryClient``'s constructor pings with ``requests`` (blocking) too.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

import pytest

os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-test-"))

from mem0 import AsyncMemoryClient, MemoryClient
from mem0.exceptions import (
    AuthenticationError,
    MemoryError,
    MemoryNotFoundError,
    ValidationError,
)

pytestmark = pytest.mark.integration


async def processed(gateway: Any, tenant: str, key: str, user: str, session: str = "mem0") -> None:
    """Wait (bounded) until what was added to the session is recallable."""
    async with gateway.running.client(tenant, user=user, api_key=key) as mem:
        assert await mem.flush(session, within_s=60), "the pipeline did not catch up in 60 s"


async def sync_client(gateway: Any, key: str) -> MemoryClient:
    return await asyncio.to_thread(MemoryClient, api_key=key, host=gateway.url)


async def test_memory_client_round_trip(gateway, tenant) -> None:
    """MemoryClient: init (ping), add, search finds it once processed, get, update keeps the
    id, history shows ADD then UPDATE, delete makes it not found, delete_all empties get_all."""
    key = await gateway.key(tenant, user="alice")
    c = await sync_client(gateway, key)
    assert c.org_id == tenant and c.project_id == "default"

    added = await asyncio.to_thread(c.add, "I prefer green tea, never coffee", user_id="alice")
    assert added["status"] == "PENDING" and added["event_id"]
    await processed(gateway, tenant, key, "alice")

    found = await asyncio.to_thread(
        c.search, "what does alice drink?", filters={"user_id": "alice"}, top_k=5
    )
    hits = [r for r in found["results"] if "green tea" in r["memory"]]
    assert hits, found
    mid = hits[0]["id"]
    assert hits[0]["user_id"] == "alice" and 0 <= hits[0]["score"] <= 1

    got = await asyncio.to_thread(c.get, mid)
    assert got["id"] == mid and "green tea" in got["memory"]

    updated = await asyncio.to_thread(c.update, mid, text="I prefer oolong tea now")
    assert updated["id"] == mid and updated["memory"] == "I prefer oolong tea now"
    got = await asyncio.to_thread(c.get, mid)
    assert got["memory"] == "I prefer oolong tea now"
    found = await asyncio.to_thread(c.search, "oolong", filters={"user_id": "alice"})
    assert mid in [r["id"] for r in found["results"]]

    hist = await asyncio.to_thread(c.history, mid)
    assert [h["event"] for h in hist] == ["ADD", "UPDATE"], hist
    assert hist[-1]["new_memory"] == "I prefer oolong tea now" and hist[-1]["memory_id"] == mid

    deleted = await asyncio.to_thread(c.delete, mid)
    assert "deleted" in deleted["message"].lower()
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(c.get, mid)
    found = await asyncio.to_thread(c.search, "oolong tea", filters={"user_id": "alice"})
    assert mid not in [r["id"] for r in found["results"]]

    page = await asyncio.to_thread(c.get_all, filters={"user_id": "alice"})
    assert page["count"] == len(page["results"]) >= 1  # the turn's other memories remain
    await asyncio.to_thread(c.delete_all, user_id="alice")
    page = await asyncio.to_thread(c.get_all, filters={"user_id": "alice"})
    assert page == {"count": 0, "next": None, "previous": None, "results": []}


async def test_async_memory_client_round_trip(gateway, tenant) -> None:
    """AsyncMemoryClient: the same calls, answered the same way."""
    key = await gateway.key(tenant, user="bob")
    c = await asyncio.to_thread(AsyncMemoryClient, api_key=key, host=gateway.url)
    msgs = [
        {"role": "user", "content": "My bike is locked in the garage"},
        {"role": "assistant", "content": "Noted: the bike is in the garage."},
    ]
    added = await c.add(msgs, user_id="bob", metadata={"topic": "bike"})
    assert added["status"] == "PENDING"
    await processed(gateway, tenant, key, "bob")

    found = await c.search("where is my bike?", filters={"AND": [{"user_id": "bob"}]}, top_k=3)
    assert found["results"] and "garage" in found["results"][0]["memory"]
    assert found["results"][0]["metadata"]["topic"] == "bike"
    mid = found["results"][0]["id"]
    assert (await c.get(mid))["id"] == mid
    updated = await c.update(mid, text="My bike is at the repair shop", metadata={"topic": "b"})
    assert updated["memory"] == "My bike is at the repair shop"
    assert updated["metadata"] == {"topic": "b"}
    assert [h["event"] for h in await c.history(mid)] == ["ADD", "UPDATE"]
    await c.delete(mid)
    with pytest.raises(MemoryNotFoundError):
        await c.get(mid)
    await c.delete_all(user_id="bob")
    assert (await c.get_all(filters={"user_id": "bob"}))["count"] == 0
    await c.async_client.aclose()


async def test_filters_pagination_threshold_and_infer_false(gateway, tenant) -> None:
    """infer=False stores each message now; get_all pages; OR over two agents of one user
    reads both owners; a threshold of 1.0 keeps nothing; run_id scopes a delete_all."""
    key = await gateway.key(tenant)  # a tenant-wide service key names owners itself
    c = await sync_client(gateway, key)
    for i in range(3):
        r = await asyncio.to_thread(
            c.add, f"Deploy note {i}: use blue-green", user_id="u1", agent_id="a1", infer=False
        )
        assert r["status"] == "SUCCEEDED" and r["results"][0]["event"] == "ADD"
    await asyncio.to_thread(
        c.add, "Deploy note from run: canary first", user_id="u1", agent_id="a2", infer=False
    )
    await asyncio.to_thread(
        c.add, "Run-only note: staging is down", user_id="u1", agent_id="a2", run_id="r9"
    )
    await processed(gateway, tenant, key, "u1", "run:r9")

    p1 = await asyncio.to_thread(
        c.get_all, filters={"AND": [{"user_id": "u1"}, {"agent_id": "a1"}]}, page=1, page_size=2
    )
    assert p1["count"] == 3 and len(p1["results"]) == 2 and p1["next"] and not p1["previous"]
    p2 = await asyncio.to_thread(
        c.get_all, filters={"AND": [{"user_id": "u1"}, {"agent_id": "a1"}]}, page=2, page_size=2
    )
    assert len(p2["results"]) == 1 and p2["previous"] and not p2["next"]
    ids = {m["id"] for m in p1["results"] + p2["results"]}
    assert len(ids) == 3

    both = {"AND": [{"user_id": "u1"}, {"OR": [{"agent_id": "a1"}, {"agent_id": "a2"}]}]}
    found = await asyncio.to_thread(c.search, "deploy note", filters=both, top_k=10)
    assert {r["agent_id"] for r in found["results"]} == {"a1", "a2"}
    only_a2 = await asyncio.to_thread(
        c.search, "deploy note", filters={"user_id": "u1", "agent_id": "a2"}, top_k=10
    )
    assert {r["agent_id"] for r in only_a2["results"]} == {"a2"}
    none = await asyncio.to_thread(
        c.search, "deploy note", filters={"user_id": "u1", "agent_id": "a1"}, threshold=1.0
    )
    assert none["results"] == []

    runs = await asyncio.to_thread(
        c.get_all, filters={"user_id": "u1", "agent_id": "a2", "run_id": "r9"}
    )
    assert runs["count"] >= 1 and all(m["run_id"] == "r9" for m in runs["results"])
    await asyncio.to_thread(c.delete_all, user_id="u1", agent_id="a2", run_id="r9")
    runs = await asyncio.to_thread(
        c.get_all, filters={"user_id": "u1", "agent_id": "a2", "run_id": "r9"}
    )
    kept = await asyncio.to_thread(c.get_all, filters={"user_id": "u1", "agent_id": "a2"})
    assert runs["count"] == 0 and kept["count"] == 1  # the run's memories only


async def test_owner_binding_and_errors(gateway, tenant) -> None:
    """A key bound to alice cannot read or erase bob's; a wrong key fails at init; unserved
    calls are 501 and unsupported filter operators 422, with code and message."""
    alice = await gateway.key(tenant, user="alice")
    bob = await gateway.key(tenant, user="bob")
    cb = await sync_client(gateway, bob)
    await asyncio.to_thread(cb.add, "Bob's locker code is in the blue notebook", user_id="bob")
    await processed(gateway, tenant, bob, "bob")
    bobs = await asyncio.to_thread(cb.get_all, filters={"user_id": "bob"})
    mid = bobs["results"][0]["id"]

    ca = await sync_client(gateway, alice)
    with pytest.raises(AuthenticationError) as err:
        await asyncio.to_thread(ca.search, "locker", filters={"user_id": "bob"})
    assert err.value.details["code"] == "forbidden"
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(ca.get, mid)
    with pytest.raises(MemoryNotFoundError):
        await asyncio.to_thread(ca.delete, mid)
    with pytest.raises(AuthenticationError):
        await asyncio.to_thread(ca.delete_all, user_id="bob")
    with pytest.raises(ValidationError):  # no entity named: nothing is erased by default
        await asyncio.to_thread(cb.delete_all)
    assert (await asyncio.to_thread(cb.get, mid))["id"] == mid  # still there

    with pytest.raises(ValueError, match="Error"):
        await asyncio.to_thread(MemoryClient, api_key="msk_wrong", host=gateway.url)
    with pytest.raises(MemoryError) as err:
        await asyncio.to_thread(cb.users)
    assert err.value.details == {
        "code": "not_implemented",
        "message": "memstream's Mem0-compatible API does not serve entities",
    }
    with pytest.raises(MemoryError) as err:
        await asyncio.to_thread(cb.batch_delete, [{"memory_id": mid}])
    assert err.value.details["code"] == "not_implemented"
    with pytest.raises(ValidationError) as err:
        await asyncio.to_thread(
            cb.search, "x", filters={"user_id": "bob", "created_at": {"gte": "2024-01-01"}}
        )
    assert err.value.details["code"] == "validation_error"
    for exc in (err.value,):
        assert bob not in str(exc.details) and alice not in str(exc.details)

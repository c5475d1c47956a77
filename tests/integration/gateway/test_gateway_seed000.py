"""Seed 000: /memories/add, /memories/flush, /memories/search over real HTTP."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


async def test_add_flush_search_returns_the_turn(gateway, tenant) -> None:  # type: ignore[no-untyped-def]
    """A turn added, then flushed, is found by search with seed 000's result fields."""
    key = await gateway.key(tenant, user="alice")
    r = await gateway.add(key, "alice", "c1", "I always drink oolong tea in the morning")
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "accepted"
    f = await gateway.flush(key, "alice", "c1")
    assert f.status_code == 200 and f.json()["status"] == "flushed", f.text
    s = await gateway.search(
        key, "alice", "what tea does alice drink?", conversation_id="c1", scope=["current_chat"]
    )
    assert s.status_code == 200, s.text
    results = s.json()["results"]
    assert results and "oolong" in results[0]["text"]
    first = results[0]
    assert first["source_scope"] == "current_chat" and first["session_id"] == "chat:c1"
    assert first["memory_type"] == "episode" and 0 <= first["score"] <= 1

"""Recall options and degradation, against real NATS, Postgres and Qdrant engines."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest

from memstream.consumers.embedded import free_port
from memstream.consumers.recall import RecallService
from memstream.producers.client import RecallError
from memstream.schemas.recall import RecallRequest
from memstream.storage.postgres import OwnerFilter
from memstream.storage.qdrant_server import ServerVectorIndex

pytestmark = pytest.mark.integration


async def seed(running, user: str = "zoe") -> dict[str, str]:
    """A few memories with different types, scopes, sessions, tags and times."""
    mem = running.client("acme", user=user)
    ids = {}
    ids["tea"] = (
        await mem.remember(
            "I prefer green tea in the morning", type="preference", tags=["drinks", "morning"]
        )
    ).id
    ids["coffee"] = (
        await mem.remember("Coffee after lunch keeps me awake", type="fact", tags=["drinks"])
    ).id
    ids["deploy"] = (
        await mem.remember(
            "Deploys of the tea shop app run on Fridays", type="decision", scope="project"
        )
    ).id
    ids["note"] = (
        await mem.remember(
            "Session note: we compared tea brands today",
            type="todo",
            scope="session",
            session="s-7",
        )
    ).id
    await mem.close()
    return ids


async def test_methods_and_attribution(running) -> None:
    """keyword, vector and hybrid all find the memory; every hit names its type, session and
    source event."""
    ids = await seed(running)
    async with running.client("acme", user="zoe") as mem:
        parts = {
            "keyword": {"keyword", "fetch", "search", "total"},
            "vector": {"embed", "dense", "fetch", "search", "total"},
            "hybrid": {"embed", "dense", "keyword", "fetch", "search", "total"},
        }
        for method in ("keyword", "vector", "hybrid"):
            reply = await mem.recall("green tea morning", method=method, top_k=3, cache=False)
            assert reply.hits[0].id == ids["tea"], method
            assert reply.method.value == method and reply.degraded == []
            assert set(reply.timings_ms) == parts[method]  # where the worker's time went
            assert reply.timings_ms["total"] >= reply.timings_ms["fetch"] > 0
        hit = (await mem.recall("green tea morning", top_k=1)).hits[0]
        assert hit.type.value == "preference" and hit.session == "default"
        assert hit.source_event_ids and hit.source_event_ids[0].startswith("remember:")


async def test_filters_narrow_never_widen(running) -> None:
    """Types, scopes, tags, session and time range AND with the owner scope."""
    ids = await seed(running)
    await seed(running, user="other")  # same texts, another owner: never returned
    async with running.client("acme", user="zoe") as mem:

        async def found(**kw: object) -> set[str]:
            reply = await mem.recall("tea coffee deploys note", top_k=10, **kw)
            assert all(h.user == "zoe" for h in reply.hits)
            return {h.id for h in reply.hits}

        assert await found(types=["fact"]) == {ids["coffee"]}
        assert await found(scopes=["project"]) == {ids["deploy"]}
        assert ids["note"] in await found(session="s-7")
        assert await found(session="s-7") == {ids["note"]}
        assert await found(context="resources") == {ids["deploy"]}
        assert await found(tags=["drinks", "morning"]) == {ids["tea"]}
        assert await found(tags=["drinks"]) == {ids["tea"], ids["coffee"]}
    now = running.pg.clock()
    svc = running.worker.recall
    future = RecallRequest(
        tenant="acme",
        user="zoe",
        query="tea coffee",
        top_k=10,
        occurred_from=now + timedelta(days=1),
    )
    assert (await svc.recall(future)).hits == []
    window = RecallRequest(
        tenant="acme",
        user="zoe",
        query="tea coffee",
        top_k=10,
        occurred_from=now - timedelta(minutes=1),
        occurred_to=now + timedelta(minutes=1),
    )
    assert len((await svc.recall(window)).hits) >= 2


async def test_top_k_threshold_and_token_budget(running) -> None:
    """top_k -1 returns all above the threshold; the threshold cuts weak hits; the token
    budget trims the reply and says so."""
    await seed(running)
    svc = running.worker.recall
    base = dict(tenant="acme", user="zoe", query="tea")
    everything = await svc.recall(RecallRequest(**base, top_k=-1))
    assert len(everything.hits) >= 3
    strict = await svc.recall(RecallRequest(**base, top_k=-1, score_threshold=0.9))
    assert 1 <= len(strict.hits) < len(everything.hits)
    assert all(h.score >= 0.9 for h in strict.hits)
    budget = await svc.recall(RecallRequest(**base, top_k=-1, token_budget=12))
    assert budget.truncated and len(budget.hits) < len(everything.hits)
    assert sum(len(h.text) // 4 + 1 for h in budget.hits) <= 12
    with pytest.raises(ValueError, match="top_k"):
        RecallRequest(**base, top_k=0)


async def test_query_cache_hits_and_is_invalidated(running) -> None:
    """A repeated query is served from the shared KV cache; a new memory of the owner
    invalidates it at once."""
    await seed(running)
    async with running.client("acme", user="zoe") as mem:
        first = await mem.recall("what do I drink in the morning?")
        assert not first.cached
        await asyncio.sleep(0.1)  # the cache put runs after the reply
        second = await mem.recall("what do I drink in the morning?")
        assert second.cached and [h.id for h in second.hits] == [h.id for h in first.hits]
        new = await mem.remember("In the morning I drink mate now", type="preference")
        third = await mem.recall("what do I drink in the morning?")
        assert not third.cached and new.id in {h.id for h in third.hits}
        fresh = await mem.recall("what do I drink in the morning?", top_k=3)
        assert not fresh.cached  # other parameters, other key


async def test_degrades_to_keyword_when_the_embedder_fails(running) -> None:
    """With a broken embedder, hybrid recall answers from the keyword leg and says so."""
    ids = await seed(running)

    class Broken:
        dim = running.worker.embedder.dim

        def embed(self, texts):
            raise RuntimeError("model file unreadable")

        def embed_query(self, text):
            raise RuntimeError("model file unreadable")

    svc = RecallService(replace(running.worker.services, embedder=Broken()))
    for method in ("hybrid", "vector"):
        reply = await svc.recall(
            RecallRequest(tenant="acme", user="zoe", query="green tea", method=method)
        )
        assert reply.degraded == ["embedder"]
        assert reply.hits[0].id == ids["tea"]


async def test_degrades_to_postgres_when_the_vector_index_is_down(running) -> None:
    """With the Qdrant server unreachable, Postgres full-text search answers."""
    ids = await seed(running)
    down = ServerVectorIndex(
        url=f"http://127.0.0.1:{free_port()}",
        timeout=1,
        check_compatibility=False,
        dim=running.worker.embedder.dim,
    )
    svc = RecallService(replace(running.worker.services, vectors=down))
    reply = await svc.recall(RecallRequest(tenant="acme", user="zoe", query="green tea"))
    assert reply.degraded == ["vector_index"]
    assert reply.hits[0].id == ids["tea"]
    await down.close()


async def test_vector_recall_answers_when_postgres_is_down(
    running, database_url, namespace
) -> None:
    """With Postgres gone, recall still answers from the vector index (records in payload)."""
    ids = await seed(running)
    from memstream.storage.postgres import PgStore

    gone = await PgStore.connect(database_url, schema=namespace)
    await gone.close()
    svc = RecallService(replace(running.worker.services, store=gone))
    reply = await svc.recall(RecallRequest(tenant="acme", user="zoe", query="green tea"))
    assert reply.hits[0].id == ids["tea"] and reply.degraded == []
    await svc.flush_touches()  # access counting fails, logged, not raised


async def test_no_store_answers_gives_an_error_code(running) -> None:
    """Index and Postgres both down: the agent gets 'unavailable', not a hang or a crash."""
    await seed(running)
    running.worker.services.vectors = ServerVectorIndex(
        url=f"http://127.0.0.1:{free_port()}",
        timeout=1,
        check_compatibility=False,
        dim=running.worker.embedder.dim,
    )
    await running.pg.close()
    async with running.client("acme", user="zoe") as mem:
        with pytest.raises(RecallError) as err:
            await mem.recall("green tea", cache=False)
        assert err.value.code.value == "unavailable"


async def test_access_counts_of_a_held_memory_wait_for_the_next_flush(
    running, database_url, namespace
) -> None:
    """A recalled memory whose row a store transaction holds is not counted at that flush
    (the count does not wait for the row, see test_row_locks.py); it waits in the service
    and is counted, once, at a flush after the transaction has ended."""
    import asyncpg

    ids = await seed(running)
    svc = running.worker.recall
    con = await asyncpg.connect(database_url, server_settings={"search_path": namespace})

    async def count() -> int:
        return int(await con.fetchval("SELECT access_count FROM memories WHERE id = $1", tea))

    try:
        tea = ids["tea"]
        holder = con.transaction()
        await holder.start()
        await con.execute("UPDATE memories SET updated_at = now() WHERE id = $1", tea)
        reply = await svc.recall(RecallRequest(tenant="acme", user="zoe", query="green tea"))
        assert tea in [h.id for h in reply.hits]
        await asyncio.wait_for(svc.flush_touches(), timeout=5)
        await holder.commit()
        assert await count() == 0
        await svc.flush_touches()
        assert await count() == 1
    finally:
        await con.close()


async def test_an_access_counts_on_the_callers_own_memories_only(running) -> None:
    """bob's recall finds zoe's global memory and his own: his own is counted, hers is not
    (it is hers to change, and its count ranks it for her; before, every hit was counted)."""
    async with running.client("acme", user="zoe") as mem:
        hers = (await mem.remember("The office kettle is descaled on Mondays", scope="global")).id
    async with running.client("acme", user="bob") as mem:
        his = (await mem.remember("I descale my own kettle on Mondays too")).id
        svc = running.worker.recall
        for _ in range(2):
            reply = await svc.recall(
                RecallRequest(tenant="acme", user="bob", query="kettle descaled Mondays")
            )
            assert {hers, his} <= {h.id for h in reply.hits}
        await svc.flush_touches()
    mine = await running.pg.get(OwnerFilter(tenant="acme", user="bob"), his)
    theirs = await running.pg.get(OwnerFilter(tenant="acme", user="zoe"), hers)
    assert mine is not None and theirs is not None
    assert (mine.access_count, theirs.access_count) == (2, 0)


async def test_access_counts_held_at_shutdown_are_tried_again_then_dropped_aloud(
    running, database_url, namespace
) -> None:
    """At shutdown no later flush would write a waiting count: it is tried again while its
    row is held, for a bounded time. A row freed in that time is counted; one still held
    is dropped with a warning, never silently."""
    import asyncpg
    from structlog.testing import capture_logs

    ids = await seed(running)
    svc = running.worker.recall
    con = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    tea = ids["tea"]

    async def count() -> int:
        return int(await con.fetchval("SELECT access_count FROM memories WHERE id = $1", tea))

    async def held_then_recalled() -> asyncpg.transaction.Transaction:
        holder = con.transaction()
        await holder.start()
        await con.execute("UPDATE memories SET updated_at = now() WHERE id = $1", tea)
        reply = await svc.recall(RecallRequest(tenant="acme", user="zoe", query="green tea"))
        assert tea in [h.id for h in reply.hits]
        return holder

    try:
        holder = await held_then_recalled()
        flushing = asyncio.ensure_future(svc.flush_touches_within(10.0))
        await asyncio.sleep(0.3)
        assert not flushing.done()  # still trying while the row is held
        await holder.commit()
        await asyncio.wait_for(flushing, timeout=5)
        assert await count() == 1

        holder = await held_then_recalled()
        with capture_logs() as logs:
            await asyncio.wait_for(svc.flush_touches_within(0.2), timeout=5)
        await holder.commit()
        dropped = [e for e in logs if e["event"] == "recall.touches_dropped"]
        assert [e["memories"] for e in dropped] == [1]
        await svc.flush_touches()
        assert await count() == 1  # dropped, not written later
    finally:
        await con.close()

"""Management commands over mem.cmd.* against real NATS, Postgres and Qdrant Edge."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import nats
import pytest

from memstream.producers.client import CommandError
from memstream.storage.postgres import OwnerFilter

pytestmark = pytest.mark.integration


async def events_of(running, tenant: str, n: int) -> list[dict[str, Any]]:
    """The first n events published on mem.events.<tenant>."""
    s = running.worker.deps.subjects
    nc = await nats.connect(running.nats_url)
    js = nc.jetstream()
    sub = await js.subscribe(s.events(tenant), stream=s.stream("events"), ordered_consumer=True)
    import json

    out = [json.loads((await sub.next_msg(timeout=5)).data) for _ in range(n)]
    await nc.close()
    return out


async def test_a_pin_while_the_index_is_away_reaches_it_once_it_is_back(
    running, clock, embedder
) -> None:
    """Pinning while the vector index does not answer is done in Postgres and replied to;
    the point (its flag and the expiry a pin lifts) is rebuilt by the maintenance loop
    within seconds of the index's return, not left stale: recall still finds the pinned
    session memory past its TTL."""
    from memstream.consumers.embedded import free_port
    from memstream.storage.qdrant_server import ServerVectorIndex

    worker = running.worker
    async with running.client("acme", user="dee") as mem:
        m = await mem.remember("the spare key is under the blue flowerpot", scope="session")
        live = worker.services.vectors
        assert not (await live.fetch("acme", [m.id]))[m.id]["pinned"]
        worker.services.vectors = ServerVectorIndex(
            url=f"http://127.0.0.1:{free_port()}",
            timeout=1,
            check_compatibility=False,
            dim=embedder.dim,
        )
        try:
            assert (await mem.pin(m.id)).pinned
            assert not (await running.pg.get(OwnerFilter(tenant="acme", user="dee"), m.id)).indexed
        finally:
            worker.services.vectors = live
        # the maintenance interval is 30 s: the deferral wakes the loop, which retries the
        # round every 1-5 s while the index is away
        for _ in range(100):
            if (await live.fetch("acme", [m.id]))[m.id]["pinned"]:
                break
            await asyncio.sleep(0.2)
        assert (await live.fetch("acme", [m.id]))[m.id]["pinned"]
        clock.advance(days=2)  # past the 24 h session TTL, which the pin lifted
        hits = (await mem.recall("where is the spare key?", cache=False)).hits
        assert [h.id for h in hits][:1] == [m.id]


async def test_remember_get_list_and_event_rows(running) -> None:
    """remember stores (redacted) and indexes a memory, get/list return it, an event row and a
    mem.events message record it."""
    async with running.client("acme", user="ann") as mem:
        m = await mem.remember(
            "I prefer aisle seats; mail me at ann@example.org", type="preference"
        )
        assert "ann@example.org" not in m.content and m.type.value == "preference"
        assert (await mem.get(m.id)).id == m.id
        listed = await mem.list_memories(limit=10)
        assert [x.id for x in listed.memories] == [m.id]
        hits = (await mem.recall("which seats do I like?", top_k=3)).hits
        assert hits and hits[0].id == m.id
    rows = await running.pg.events_for("acme", m.id)
    assert [r["kind"] for r in rows] == ["stored"]
    assert (await events_of(running, "acme", 1))[0]["kind"] == "stored"


async def test_owner_and_tenant_boundaries(running) -> None:
    """Another owner or tenant can neither read, pin nor forget a memory: not_found."""
    async with running.client("acme", user="ann") as ann:
        m = await ann.remember("My locker code is behind the blue door")
    for tenant, user in (("acme", "bob"), ("other", "ann")):
        async with running.client(tenant, user=user) as intruder:
            for verb in ("get", "pin", "forget"):
                with pytest.raises(CommandError) as err:
                    await intruder.command(verb, id=m.id)
                assert err.value.code.value == "not_found"
            assert (await intruder.list_memories()).memories == []
            assert all(h.id != m.id for h in (await intruder.recall("locker code")).hits)
    async with running.client("acme", user="ann") as ann:
        assert (await ann.get(m.id)).deleted_at is None


async def test_pin_ranks_first_and_never_expires(running, clock) -> None:
    """A pinned session memory outlives its TTL and ranks above better-matching hits."""
    async with running.client("acme", user="cy") as mem:
        a = await mem.remember("coffee order: flat white with oat milk", scope="session")
        b = await mem.remember("coffee beans are stored in the pantry", scope="session")
        await mem.pin(b.id)
        hits = (await mem.recall("coffee order flat white oat milk", top_k=5)).hits
        assert hits[0].id == b.id
        clock.advance(days=2)  # past the 24 h session TTL
        ids = [h.id for h in (await mem.recall("coffee", top_k=5)).hits]
        assert b.id in ids and a.id not in ids
        assert await running.worker.sweep_once() == 1
        with pytest.raises(CommandError):
            await mem.get(a.id)
        assert (await mem.get(b.id)).pinned
    kinds = [r["kind"] for r in await running.pg.events_for("acme", a.id)]
    assert kinds == ["stored", "expired"]


async def test_forget_hides_at_once_everywhere(running) -> None:
    """forget tombstones the memory: gone from recall, the vector index and get."""
    async with running.client("acme", user="dee") as mem:
        m = await mem.remember("the wifi password hint is the cat's name")
        await mem.forget(m.id)
        assert all(h.id != m.id for h in (await mem.recall("wifi password hint")).hits)
        for method in ("vector", "keyword"):
            reply = await mem.recall("wifi password hint", method=method)
            assert all(h.id != m.id for h in reply.hits)
    kinds = [r["kind"] for r in await running.pg.events_for("acme", m.id)]
    assert kinds == ["stored", "forgotten"]


async def test_erasure_removes_memories_vectors_and_raw_turns(running) -> None:
    """forget_owner leaves nothing of the owner in Postgres, Qdrant or MEM_TURNS; others stay."""
    async with running.client("acme", user="eve") as eve, running.client("acme", user="fay") as fay:
        plans = [
            "buy tulips at the Saturday market",
            "repaint the garage door green",
            "learn three chords on the ukulele",
            "book a cabin near the lake in May",
            "call the plumber about the kitchen sink",
        ]
        for i, plan in enumerate(plans):
            await eve.publish_turn([("user", f"eve plan: {plan}")], session=f"s{i % 2}")
        await fay.publish_turn([("user", "fay likes tulips too")])
        await running.wait_for(running.drained, 30, "ingestion")
        assert len((await eve.list_memories()).memories) == 5
        counts = await eve.forget_owner()
        assert counts["memories"] == 5 and counts["turns"] == 5
        assert (await eve.list_memories()).memories == []
        assert (await eve.recall("eve plan tulips")).hits == []
        assert await running.pg.list_memories(OwnerFilter("acme", user="eve"), live=False) == []
        vectors = running.worker.vectors
        probe = running.worker.embedder.embed_query("eve plan: buy tulips")
        from memstream.storage.ports import VectorFilter

        assert await vectors.search(probe, VectorFilter(tenant="acme", user="eve"), 10) == []
        js = running.worker.deps.js
        s = running.worker.deps.subjects
        info = await js.stream_info(
            s.stream("turns"), subjects_filter=s.turns_filter("acme", "eve")
        )
        assert not info.state.subjects
        assert [h.text for h in (await fay.recall("tulips")).hits] == ["user: fay likes tulips too"]


async def test_facts_over_time(running, clock) -> None:
    """fact_update closes the old version; recall returns only the current one; history and
    point-in-time reads show the chain."""
    async with running.client("acme", user="gus") as mem:
        with pytest.raises(CommandError):
            await mem.fact_update("employer", "Initech")  # nothing to update yet
        first = (await mem.fact_put("employer", "Globex")).memory
        t_first = clock.now
        clock.advance(days=30)
        second = await mem.fact_update("employer", "Initech")
        assert second.detail["superseded"] == first.id
        hits = (await mem.recall("who is the employer?", top_k=5)).hits
        texts = [h.text for h in hits]
        assert "employer: Initech" in texts and "employer: Globex" not in texts
        chain = await mem.fact_history("employer")
        assert [m.content for m in chain] == ["employer: Globex", "employer: Initech"]
        assert chain[0].superseded_by == second.memory.id and chain[0].valid_to is not None
        past = await mem.fact_history("employer", at=t_first + timedelta(days=1))
        assert [m.content for m in past] == ["employer: Globex"]


async def test_peer_reads_do_not_touch_access_counts(running) -> None:
    """Own recall counts accesses; peer_query and peer_query_any read without counting."""
    async with (
        running.client("acme", agent="planner") as planner,
        running.client("acme", agent="coder") as coder,
    ):
        p = await planner.remember("deploys happen on tuesdays only", type="rule")
        c = await coder.remember("deploys use the blue-green script", type="fix")
        assert (await coder.peer_query("planner", "deploys")).hits[0].id == p.id
        any_hits = [h.id for h in (await coder.peer_query_any("deploys")).hits]
        assert p.id in any_hits and c.id not in any_hits
        assert (await planner.get(p.id)).access_count == 0
        await planner.recall("deploys")
        await running.worker.recall.flush_touches()  # access counts are written in batches
        assert (await planner.get(p.id)).access_count == 1


async def test_memory_off_stores_nothing_from_the_session(running) -> None:
    """With memory off, turns of that session still publish but nothing is stored."""
    async with running.client("acme", user="hal") as mem:
        await mem.memory_off("private")
        await mem.publish_turn([("user", "my diary entry about the zeppelin")], session="private")
        await mem.publish_turn([("user", "public note about the zeppelin")], session="open")
        await running.wait_for(running.drained, 20, "ingestion")
        texts = [m.content for m in (await mem.list_memories()).memories]
        assert texts == ["user: public note about the zeppelin"]
        await mem.memory_on("private")
        await mem.publish_turn([("user", "second diary entry, zeppelin again")], session="private")
        await running.wait_for(running.drained, 20, "ingestion")
        assert len((await mem.list_memories()).memories) == 2


async def test_pending_review_counts_per_agent(running, clock) -> None:
    """pending_review counts memories each agent created since a given time."""
    start = clock.now
    async with running.client("acme", agent="a1") as a1, running.client("acme", agent="a2") as a2:
        await a1.remember("one")
        clock.advance(minutes=5)
        mark = clock.now
        clock.advance(minutes=5)
        await a1.remember("two")
        await a2.remember("three")
        counts = await a1.pending_review({"a1": start, "a2": mark, "*": mark})
        assert counts == {"a1": 2, "a2": 1, "*": 2}


async def test_near_duplicate_merges_instead_of_inserting(running) -> None:
    """A turn nearly identical to an existing memory of the same owner updates it (merged
    event, both source events kept) instead of adding a row."""
    async with running.client("acme", user="ivy") as mem:
        await mem.publish_turn(
            [("user", "I have a meeting with the dentist on Friday morning.")], event_id="n1"
        )
        await running.wait_for(running.drained, 20, "first")
        await mem.publish_turn(
            [("user", "I have a meeting with the dentist on Friday morning!!")], event_id="n2"
        )
        await running.wait_for(running.drained, 20, "second")
        rows = (await mem.list_memories()).memories
        assert len(rows) == 1 and sorted(rows[0].source_event_ids) == ["n1", "n2"]
        kinds = [r["kind"] for r in await running.pg.events_for("acme", rows[0].id)]
        assert kinds == ["stored", "merged"]


async def test_bad_command_gets_a_code(running) -> None:
    """A malformed command gets bad_request, not silence or a crash."""
    nc = await nats.connect(running.nats_url)
    msg = await nc.request(running.worker.deps.subjects.cmd("forget"), b"{}", timeout=5)
    await nc.close()
    assert b'"bad_request"' in msg.data


async def test_erasure_also_removes_dead_lettered_copies(running) -> None:
    """A dead-lettered copy of the owner's turn (raw text) is removed by forget_owner; other
    owners' dead letters stay."""
    import json as _json

    s = running.worker.deps.subjects
    js = running.worker.deps.js
    mine = {
        "tenant": "acme",
        "user": "pat",
        "session": "s",
        "messages": [{"role": "user", "content": "pat's raw words"}],
        "unexpected": 1,
    }
    theirs = {**mine, "user": "sam"}
    for body in (mine, theirs):
        await js.publish(s.turns("acme", body["user"], "s"), _json.dumps(body).encode())
    from memstream.consumers.dlq import dead_letters

    await running.wait_for(lambda: _count(dead_letters(js, s, "extract", 10), 2), 20, "dlq")
    async with running.client("acme", user="pat") as pat:
        counts = await pat.forget_owner()
    assert counts["dead_letters"] == 1
    left = await dead_letters(js, s, None, 10)
    assert [_json.loads(m.data)["user"] for m in left] == ["sam"]


async def _count(coro, n: int) -> bool:
    return len(await coro) >= n


async def test_memories_pages_keep_room_for_in_place_updates(running) -> None:
    """The memories table leaves 10% of each page free (migration 006), so access-count
    updates can stay on their page without new index entries (HOT)."""
    async with running.pg._pool.acquire() as con:
        options = await con.fetchval(
            "SELECT reloptions FROM pg_class WHERE oid = 'memories'::regclass"
        )
    assert "fillfactor=90" in (options or [])


async def test_update_keeps_the_id_redacts_reindexes_and_history_records_it(running) -> None:
    """update: same id, new text redacted and found by recall (the old text no longer is);
    history lists stored then updated; another owner gets not_found; a fact is refused; writing
    the edited text again folds into it, and in another scope is a memory of its own, not a
    unique-key collision."""
    async with running.client("acme", user="ann") as ann:
        m = await ann.remember("My gym is on Elm Street")
        reply = await ann.command("update", id=m.id, content="My gym moved; write gym@example.org")
        new = reply.memory
        assert new is not None and new.id == m.id and "gym@example.org" not in new.content
        assert "[EMAIL:" in new.content and new.content_hash.endswith(f"@{m.id}")
        hits = (await ann.recall("where did my gym move?", top_k=3)).hits
        assert hits and hits[0].id == m.id and "moved" in hits[0].text
        assert all("Elm Street" not in h.text for h in (await ann.recall("Elm Street")).hits)
        events = (await ann.command("history", id=m.id)).detail["events"]
        assert [e["kind"] for e in events] == ["stored", "updated"]
        fact = (await ann.fact_put("user:city", "Oslo")).memory
        assert fact is not None
        with pytest.raises(CommandError) as err:
            await ann.command("update", id=fact.id, content="Bergen")
        assert err.value.code.value == "bad_request"
        again = await ann.remember(new.content)  # same owner, type, scope and text as the edit
        assert again.id == m.id  # a near duplicate of the edited memory: folded into it
        own = await ann.remember(new.content, scope="session")  # cannot fold across scopes
        assert own.id != m.id and own.content == new.content  # a memory of its own, no clash
        assert (await ann.get(m.id)).content == new.content
    async with running.client("acme", user="bob") as bob:
        for verb, extra in (("update", {"content": "hijacked"}), ("history", {})):
            with pytest.raises(CommandError) as err:
                await bob.command(verb, id=m.id, **extra)
            assert err.value.code.value == "not_found"

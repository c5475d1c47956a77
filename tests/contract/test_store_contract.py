"""The record-of-truth contract, part 1: the stages' writes (idempotent upserts, merges and
folds), owner filters and facts. Every test runs against PgStore and MemoryStore."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from storerows import Rows, chash

from memstream.schemas.errors import NotFound
from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.pg.sql import OwnerFilter
from memstream.storage.pgports import Store


async def test_upsert_is_idempotent(store: Store, rows: Rows) -> None:
    """Replaying a candidate inserts nothing and adds no source; a new source merges."""
    c = rows.candidate()
    mid = str(uuid.uuid4())
    assert await store.upsert(mid, chash(c), c) is True
    assert await store.upsert(mid, chash(c), c) is False
    flt = OwnerFilter(tenant="t1")
    assert (await store.get_many(flt, [mid]))[mid].source_event_ids == [c.source_event_id]
    again = c.model_copy(update={"source_event_id": "other"})
    assert await store.upsert_many([(mid, chash(c), again)]) == [False]
    assert (await store.get_many(flt, [mid]))[mid].source_event_ids == [c.source_event_id, "other"]
    # the replay wrote no audit row: it is the same "stored", not a merge into itself
    assert [e["kind"] for e in await store.events_for("t1", mid)] == ["stored", "merged"]


async def test_upsert_many_runs_rows_in_order(store: Store, rows: Rows) -> None:
    """A memory id listed twice in one batch is inserted by the first row, merged by the next."""
    a, b = rows.candidate(content="same"), rows.candidate(content="same")
    mid = str(uuid.uuid4())
    assert await store.upsert_many([(mid, chash(a), a), (mid, chash(b), b)]) == [True, False]
    assert await store.existing([("t1", mid), ("t2", mid)]) == {("t1", mid)}
    found = await store.memories_by_id([("t1", mid), ("t2", mid)])
    assert list(found) == [mid] and len(found[mid].source_event_ids) == 2


async def test_merge_records_the_fold(store: Store, rows: Rows) -> None:
    """A merge with a candidate id is found again by ``folded_into``, only in its tenant."""
    mid = await rows.put(store)
    assert await store.merge("t1", mid, "e-near", "cand-1") is True
    assert await store.merge("t1", mid, "e-near", "cand-1") is True  # replayed: same answer
    assert await store.folded_into("t1", "cand-1") == mid
    assert await store.folded_into("t2", "cand-1") is None
    assert await store.folded_into("t1", "cand-other") is None
    record = (await store.get_many(OwnerFilter(tenant="t1"), [mid]))[mid]
    assert record.source_event_ids.count("e-near") == 1 and not record.indexed
    assert await store.merge("t2", mid, "e-x", "cand-2") is False  # another tenant's id
    assert await store.folded_into("t2", "cand-2") is None


async def test_merge_many_reports_each_found(store: Store, rows: Rows) -> None:
    """``merge_many`` says per merge whether its live memory was there, and records each fold
    that happened under its candidate (``folded_among``), never one that did not."""
    mid = await rows.put(store)
    gone = await rows.put(store)
    assert await store.tombstone(OwnerFilter(tenant="t1", user="u1"), gone)
    got = await store.merge_many(
        [("t1", mid, "n1", "c1"), ("t1", gone, "n2", "c2"), ("t9", mid, "n3", "c3")]
    )
    assert got == [True, False, False]
    asked = [("t1", "c1"), ("t1", "c2"), ("t9", "c3"), ("t2", "c1"), ("t1", "c4")]
    assert await store.folded_among(asked) == {("t1", "c1"): mid}
    assert await store.folded_among([]) == {}


async def test_merge_many_folds_into_one_memory_in_order(store: Store, rows: Rows) -> None:
    """Two folds into one memory in the same call both add their source, in the order given;
    a source it already has is not added again; each fold is recorded under its candidate."""
    mid = await rows.put(store)
    before = (await store.get_many(OwnerFilter(tenant="t1"), [mid]))[mid].source_event_ids
    got = await store.merge_many(
        [("t1", mid, "n2", "c1"), ("t1", mid, "n1", "c2"), ("t1", mid, "n2", "c3")]
    )
    assert got == [True, True, True]
    record = (await store.get_many(OwnerFilter(tenant="t1"), [mid]))[mid]
    assert record.source_event_ids == [*before, "n2", "n1"] and not record.indexed
    assert await store.folded_among([("t1", "c1"), ("t1", "c2"), ("t1", "c3")]) == {
        ("t1", "c1"): mid,
        ("t1", "c2"): mid,
        ("t1", "c3"): mid,
    }


async def test_write_batch_folds_then_writes_then_folds_into_its_rows(
    store: Store, rows: Rows
) -> None:
    """``write_batch``: the folds into existing memories first (one gone: False), then the
    rows (inserted or merged, in order), then the folds into the rows just written, each fold
    recorded under its candidate, as the three calls one after the other would."""
    old = await rows.put(store)
    gone = await rows.put(store)
    assert await store.tombstone(OwnerFilter(tenant="t1", user="u1"), gone)
    a, b = rows.candidate(content="new one"), rows.candidate(content="old again")
    new_id = str(uuid.uuid4())
    inserted, folded, then = await store.write_batch(
        [(new_id, chash(a), a), (old, chash(b), b)],
        [("t1", old, "near-1", "c1"), ("t1", gone, "near-2", "c2")],
        [("t1", new_id, "mate-1", "c3")],
    )
    assert (inserted, folded, then) == ([True, False], [True, False], [True])
    got = await store.memories_by_id([("t1", new_id), ("t1", old)])
    assert got[new_id].source_event_ids == [a.source_event_id, "mate-1"]
    assert got[old].source_event_ids[-2:] == ["near-1", b.source_event_id]
    assert await store.folded_among([("t1", "c1"), ("t1", "c2"), ("t1", "c3")]) == {
        ("t1", "c1"): old,
        ("t1", "c3"): new_id,
    }
    assert await store.write_batch([]) == ([], [], [])


async def test_owner_filters_never_cross_tenant_or_owner(store: Store, rows: Rows) -> None:
    """Reads see the owner's memories (plus shared scopes when asked), never another's."""
    own = await rows.put(store, content="alpha own")
    other_user = await rows.put(store, user="u2", content="alpha other user")
    other_tenant = await rows.put(store, tenant="t2", content="alpha other tenant")
    glob = await rows.put(store, user="u3", scope=Scope.GLOBAL, content="alpha global")
    proj = await rows.put(
        store, user="u3", scope=Scope.PROJECT, project="p1", content="alpha project"
    )
    peer = await rows.put(store, user=None, agent="a1", content="alpha agent")
    ids = [own, other_user, other_tenant, glob, proj, peer]
    mine = OwnerFilter(tenant="t1", user="u1")
    assert set(await store.get_many(mine, ids)) == {own}
    shared = OwnerFilter(tenant="t1", user="u1", shared=True, project="p1")
    assert set(await store.get_many(shared, ids)) == {own, glob, proj}
    assert set(await store.get_many(OwnerFilter(tenant="t1", user="u1", shared=True), ids)) == {
        own,
        glob,
    }
    assert set(await store.get_many(OwnerFilter(tenant="t2", user="u1"), ids)) == {other_tenant}
    assert set(await store.get_many(OwnerFilter(tenant="t1", peer=True), ids)) == {peer}
    excluded = OwnerFilter(tenant="t1", peer=True, exclude_agent="a1")
    assert await store.get_many(excluded, ids) == {}
    hits = await store.keyword_search(mine, "alpha", 10)
    assert [h[0] for h in hits] == [own]
    assert {m.id for m in await store.list_memories(mine)} == {own}
    assert await store.get(OwnerFilter(tenant="t1", user="u2"), own) is None


async def test_filters_narrow_by_session_type_and_tags(store: Store, rows: Rows) -> None:
    """Session, types and tags narrow a filter (AND)."""
    a = await rows.put(store, session="s1", tags=["x", "y"])
    b = await rows.put(store, session="s2", type=MemoryType.PREFERENCE, tags=["x"])
    ids = [a, b]
    assert set(await store.get_many(OwnerFilter("t1", "u1", session="s2"), ids)) == {b}
    prefs = OwnerFilter("t1", "u1", types=[MemoryType.PREFERENCE])
    assert set(await store.get_many(prefs, ids)) == {b}
    assert set(await store.get_many(OwnerFilter("t1", "u1", tags=["x", "y"]), ids)) == {a}


async def test_facts_are_versioned(store: Store, rows: Rows, clock) -> None:
    """A new value closes the current version; the same value again changes nothing."""
    flt = OwnerFilter(tenant="t1", user="u1")
    first = rows.candidate(content="lives in Paris", type=MemoryType.FACT)
    v1 = str(uuid.uuid4())
    assert await store.put_fact(v1, chash(first), first, "city", clock()) == (None, v1)
    clock.advance(seconds=10)
    second = rows.candidate(content="lives in Rome", type=MemoryType.FACT)
    v2 = str(uuid.uuid4())
    closed, current = await store.put_fact(v2, chash(second), second, "city", clock())
    assert closed is not None and closed.id == v1 and current == v2
    assert await store.put_fact(str(uuid.uuid4()), chash(second), second, "city", clock()) == (
        None,
        v2,
    )
    now = await store.current_fact(flt, "city")
    assert now is not None and now.id == v2 and now.content == "lives in Rome"
    history = await store.fact_history(flt, "city")
    assert [m.id for m in history] == [v1, v2]
    assert history[0].superseded_by == v2 and history[0].valid_to is not None
    assert await store.get_many(flt, [v1]) == {}  # superseded: never recalled
    assert await store.current_fact(OwnerFilter(tenant="t1", user="u2"), "city") is None
    assert v1 in (await store.pending_vector_deletes()).get("t1", [])


async def test_a_fact_update_closes_only_the_version_it_names(
    store: Store, rows: Rows, clock
) -> None:
    """``supersedes`` names the version to close: a second update of that same version is
    refused (NotFound) and leaves one current version; a retry of the update that won is
    still a no-op, not a refusal."""
    flt = OwnerFilter(tenant="t1", user="u1")
    first = rows.candidate(content="drinks tea", type=MemoryType.FACT)
    v1 = str(uuid.uuid4())
    await store.put_fact(v1, chash(first), first, "drink", clock())
    clock.advance(seconds=1)
    coffee = rows.candidate(content="drinks coffee", type=MemoryType.FACT)
    v2 = str(uuid.uuid4())
    assert (await store.put_fact(v2, chash(coffee), coffee, "drink", clock(), supersedes=v1))[
        1
    ] == v2
    clock.advance(seconds=1)
    water = rows.candidate(content="drinks water", type=MemoryType.FACT)
    with pytest.raises(NotFound):
        await store.put_fact(
            str(uuid.uuid4()), chash(water), water, "drink", clock(), supersedes=v1
        )
    retried = await store.put_fact(
        str(uuid.uuid4()), chash(coffee), coffee, "drink", clock(), supersedes=v1
    )
    assert retried == (None, v2)
    assert [m.id for m in await store.fact_history(flt, "drink")] == [v1, v2]
    with pytest.raises(NotFound):  # nothing current to close
        await store.put_fact(str(uuid.uuid4()), chash(water), water, "none", clock(), supersedes=v1)


async def test_concurrent_first_puts_of_a_key_leave_one_current_version(
    store: Store, rows: Rows, clock
) -> None:
    """Puts of a key nothing holds yet, side by side: each closes the one before, so the key
    ends with one current version (without one put at a time, each opened its own)."""
    flt = OwnerFilter(tenant="t1", user="u1")
    values = [rows.candidate(content=f"works on floor {n}", type=MemoryType.FACT) for n in range(8)]
    at = clock()
    puts = [
        store.put_fact(str(uuid.uuid4()), chash(c), c, "floor", at + timedelta(seconds=n))
        for n, c in enumerate(values)
    ]
    await asyncio.gather(*puts)
    history = await store.fact_history(flt, "floor")
    assert len(history) == 8
    assert sum(m.valid_to is None and m.superseded_by is None for m in history) == 1


async def test_tombstone_hides_and_queues_the_point(store: Store, rows: Rows) -> None:
    """Forgetting hides a memory from every read and queues its point; only the owner may."""
    mid = await rows.put(store)
    assert await store.tombstone(OwnerFilter(tenant="t1", user="u2"), mid) is False
    assert await store.tombstone(OwnerFilter(tenant="t1", user="u1"), mid) is True
    assert await store.tombstone(OwnerFilter(tenant="t1", user="u1"), mid) is False
    assert await store.exists("t1", mid) is False
    assert await store.get_many(OwnerFilter(tenant="t1"), [mid]) == {}
    assert await store.pending_vector_deletes() == {"t1": [mid]}
    await store.vector_deletes_done("t1", [mid])
    assert await store.pending_vector_deletes() == {}
    kinds = [e["kind"] for e in await store.events_for("t1", mid)]
    assert kinds.count("forgotten") == 1


async def test_erase_removes_one_owner_only(store: Store, rows: Rows) -> None:
    """Erasure deletes every memory of the owner (tombstoned ones too) and nobody else's."""
    a = await rows.put(store)
    b = await rows.put(store, session="s2")
    await store.tombstone(OwnerFilter(tenant="t1", user="u1"), b)
    keep = await rows.put(store, user="u2")
    keep_tenant = await rows.put(store, tenant="t2")
    erased = await store.erase(OwnerFilter(tenant="t1", user="u1"))
    assert set(erased) == {a, b}
    assert await store.count("t1") == 1 and await store.exists("t1", keep)
    assert await store.exists("t2", keep_tenant)
    assert set((await store.pending_vector_deletes())["t1"]) == {a, b}
    assert await store.erase(OwnerFilter(tenant="t1", user="u1")) == []


async def test_expired_memories_hide_then_purge(store: Store, rows: Rows, clock) -> None:
    """Past expires_at a memory is hidden, then purged with its point queued; pinned stays."""
    soon = clock() + timedelta(minutes=1)
    gone = await rows.put(store, expires_at=soon)
    pinned = await rows.put(store, expires_at=soon, pinned=True)
    clock.advance(minutes=2)
    flt = OwnerFilter(tenant="t1", user="u1")
    assert set(await store.get_many(flt, [gone, pinned])) == {pinned}
    assert await store.purge_expired() == [("t1", gone, "u1", None)]
    assert await store.purge_expired() == []
    assert await store.pending_vector_deletes() == {"t1": [gone]}

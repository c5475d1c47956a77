"""The record-of-truth contract, part 2: keys, memory switches, indexing and maintenance,
management writes and the audit trail. Every test runs against PgStore and MemoryStore."""

from __future__ import annotations

from datetime import timedelta

from storerows import Rows

from memstream.storage.pg.sql import OwnerFilter
from memstream.storage.pgports import Store


async def test_keys_are_found_by_hash_until_revoked(store: Store) -> None:
    """A created key maps to its tenant and owner; revoked or unknown keys map to nothing."""
    key = await store.create_api_key("t1", "ci", user="u1")
    other = await store.create_api_key("t2")
    assert key.startswith("msk_") and key != other
    assert await store.identity_of_key(key) == ("t1", "u1", None)
    assert await store.tenant_of_key(other) == "t2"
    assert await store.identity_of_key("msk_unknown") is None
    assert await store.revoke_api_key(key) is True
    assert await store.revoke_api_key(key) is False
    assert await store.identity_of_key(key) is None and await store.tenant_of_key(key) is None
    assert await store.tenant_of_key(other) == "t2"


async def test_memory_switch_per_session(store: Store) -> None:
    """Memory off holds for exactly one (tenant, owner, session); switching twice is a no-op."""
    await store.set_memory_off("t1", "u1", "s1", True)
    await store.set_memory_off("t1", "u1", "s1", True)
    assert await store.is_memory_off("t1", "u1", "s1")
    assert not await store.is_memory_off("t1", "u1", "s2")
    assert not await store.is_memory_off("t2", "u1", "s1")
    keys = [("t1", "u1", "s1"), ("t1", "u2", "s1"), ("t2", "u1", "s1")]
    assert await store.memory_off_among(keys) == {("t1", "u1", "s1")}
    await store.set_memory_off("t1", "u1", "s1", False)
    await store.set_memory_off("t1", "u1", "s1", False)
    assert not await store.is_memory_off("t1", "u1", "s1")
    assert await store.memory_off_among(keys) == set()


async def test_unindexed_until_marked(store: Store, rows: Rows) -> None:
    """A stored memory waits in ``unindexed`` until marked; a merge makes it wait again."""
    a = await rows.put(store)
    b = await rows.put(store)
    assert [m.id for m in await store.unindexed()] == [a, b]
    assert [m.id for m in await store.unindexed(1)] == [a]
    await store.mark_indexed([a, b])
    assert await store.unindexed() == []
    assert await store.merge("t1", a, "e-near")
    assert [m.id for m in await store.unindexed()] == [a]
    await store.tombstone(OwnerFilter(tenant="t1", user="u1"), b)
    await store.mark_indexed([a])
    assert await store.unindexed() == []


async def test_unindexed_written_by_a_time(store: Store, rows: Rows, clock) -> None:
    """``written_by`` keeps the memories last written at or before then: a memory written
    later, or merged later (its new source makes it wait again), is left out."""
    started = clock()
    a = await rows.put(store)
    clock.advance(seconds=10)
    b = await rows.put(store)
    assert [m.id for m in await store.unindexed(written_by=started)] == [a]
    assert [m.id for m in await store.unindexed(written_by=clock())] == [a, b]
    await store.mark_indexed([a])
    assert await store.merge("t1", a, "e-near")  # at started + 10 s
    assert await store.unindexed(written_by=started + timedelta(seconds=5)) == []
    assert [m.id for m in await store.unindexed()] == [a, b]


async def test_marked_indexed_only_as_read(store: Store, rows: Rows, clock) -> None:
    """With the versions its points were built from, a memory written since keeps its flag:
    not indexed while the change's own writer has not marked it, indexed once it has (its
    newer point is in, and the older one cannot replace it). The others, and an unchecked
    one, are marked."""
    a = await rows.put(store)
    b = await rows.put(store)
    c = await rows.put(store)
    read = {m.id: m.updated_at for m in await store.unindexed()}
    clock.advance(seconds=1)
    assert await store.merge("t1", a, "e-later")  # written after the read
    await store.mark_indexed([a, b, c], [read[a], read[b], None])
    assert [m.id for m in await store.unindexed()] == [a]
    fresh = {m.id: m.updated_at for m in await store.unindexed()}
    await store.mark_indexed([a], [fresh[a]])  # the merge's writer marks its newer point
    assert await store.unindexed() == []
    await store.mark_indexed([a], [read[a]])  # then the older writer's mark
    assert await store.unindexed() == []


async def test_vector_delete_done_reindexes_a_revived_memory(store: Store, rows: Rows) -> None:
    """A memory stored again after it was forgotten is marked unindexed once its old point
    is deleted (the delete may have removed the new point)."""
    c = rows.candidate()
    mid = "00000000-0000-4000-8000-000000000001"
    await store.upsert(mid, "h", c)
    await store.tombstone(OwnerFilter(tenant="t1", user="u1"), mid)
    assert await store.upsert(mid, "h", c.model_copy(update={"source_event_id": "e-new"})) is False
    await store.mark_indexed([mid])
    await store.vector_deletes_done("t1", [mid])
    assert [m.id for m in await store.unindexed()] == [mid]


async def test_session_neighbours(store: Store, rows: Rows) -> None:
    """Contexts are the episodes right before a memory in its session and owner (oldest
    first); followers the ones right after; other sessions and owners never count."""
    e1, e2, e3, e4 = [await rows.put(store, content=f"turn {i}") for i in range(1, 5)]
    await rows.put(store, session="s2", content="elsewhere")
    await rows.put(store, user="u2", content="someone else")
    records = await store.get_many(OwnerFilter(tenant="t1", user="u1"), [e1, e2, e3, e4])
    contexts = await store.session_contexts([records[e4], records[e1], records[e4]])
    assert contexts == {e4: ["turn 2", "turn 3"]}
    followers = await store.session_followers_many([records[e1], records[e2]])
    assert {f.id for f in followers} == {e2, e3, e4}
    assert len(followers) == 3


async def test_pin_and_edit_stay_within_the_owner(store: Store, rows: Rows) -> None:
    """Pin and edit change the owner's memory (both reset ``indexed``: the index point holds
    the flag, the expiry a pin lifts and the text); another owner's call finds nothing."""
    mid = await rows.put(store)
    await store.mark_indexed([mid])
    mine, theirs = OwnerFilter(tenant="t1", user="u1"), OwnerFilter(tenant="t1", user="u2")
    assert await store.set_pinned(theirs, mid, True) is None
    pinned = await store.set_pinned(mine, mid, True)
    assert pinned is not None and pinned.pinned and not pinned.indexed
    assert await store.update_content(theirs, mid, "x", "hx", None, {}) is None
    edited = await store.update_content(mine, mid, "new text", "hn", {"k": "v"}, {"EMAIL": 1})
    assert edited is not None and edited.content == "new text" and not edited.indexed
    assert edited.metadata == {"k": "v"} and edited.content_hash == f"hn@{mid}"
    kinds = [e["kind"] for e in await store.events_for("t1", mid)]
    assert "pinned" in kinds and "updated" in kinds


async def test_audit_rows_are_recorded_once(store: Store) -> None:
    """Recording the same operation twice leaves one audit row, in the tenant's trail only."""
    await store.record_event("t1", None, "memory_off", "s1:1", {"session": "s1"})
    await store.record_event("t1", None, "memory_off", "s1:1", {"session": "s1"})
    trail = await store.events_for("t1")
    assert [(e["kind"], e["detail"]) for e in trail] == [("memory_off", {"session": "s1"})]
    assert await store.events_for("t2") == []


async def test_pending_review_counts_per_agent(store: Store, rows: Rows, clock) -> None:
    """Counts of memories created since a time, per agent and for all together, of those
    the caller may read: agents' own (no user) and the caller's own, never another user's
    (u2's memories with a1 were counted for everyone) nor another tenant's."""
    since = clock()
    await rows.put(store, user=None, agent="a1")
    await rows.put(store, user=None, agent="a1")
    await rows.put(store, user=None, agent="a2")
    await rows.put(store, tenant="t2", user=None, agent="a1")
    await rows.put(store, user="u2", agent="a1")
    await rows.put(store, user="u1", agent="a1")
    await rows.put(store, user="u1")  # no agent: in no agent's count
    asked = {"a1": since, "*": since}
    assert await store.pending_review("t1", asked) == {"a1": 2, "*": 3}
    assert await store.pending_review("t1", asked, "u1", "a1") == {"a1": 3, "*": 4}
    assert await store.pending_review("t1", asked, "u1") == {"a1": 2, "*": 3}

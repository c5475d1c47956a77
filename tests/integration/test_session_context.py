"""The earlier-turn context of episodes (what the keyword leg indexes with each episode),
read for a whole batch in one statement, against a real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pgplans import buffers

from memstream.pipeline import dedupe
from memstream.schemas.memory import Candidate, MemoryRecord, MemoryType, Owner
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration

BASE = datetime(2026, 1, 1, tzinfo=UTC)
SPECS = [  # tenant, user, agent, session, type, minute
    ("acme", "ann", None, "s1", MemoryType.EPISODE, 0),
    ("acme", "ann", None, "s1", MemoryType.EPISODE, 1),
    ("acme", "ann", None, "s1", MemoryType.EPISODE, 1),  # same time: the id breaks the tie
    ("acme", "ann", None, "s1", MemoryType.EPISODE, 2),  # deleted below
    ("acme", "ann", None, "s1", MemoryType.EPISODE, 3),
    ("acme", "ann", None, "s1", MemoryType.EPISODE, 4),
    ("acme", "ann", None, "s1", MemoryType.FACT, 2),  # not an episode: never context
    ("acme", "bob", None, "s1", MemoryType.EPISODE, 2),  # another user
    ("acme", "ann", "bot", "s1", MemoryType.EPISODE, 2),  # another agent
    ("acme", "ann", None, "s2", MemoryType.EPISODE, 2),  # another session
    ("globex", "ann", None, "s1", MemoryType.EPISODE, 2),  # another tenant
]


def expected(rows: list[MemoryRecord], m: MemoryRecord, turns: int) -> list[str]:
    """What ``session_contexts`` promises, in Python."""

    def order(r: MemoryRecord) -> tuple[datetime, datetime, uuid.UUID]:
        return (r.occurred_at, r.created_at, uuid.UUID(r.id))

    earlier = [
        r
        for r in rows
        if (r.tenant, r.session, r.user, r.agent) == (m.tenant, m.session, m.user, m.agent)
        and r.type is MemoryType.EPISODE
        and order(r) < order(m)
    ]
    return [r.content for r in sorted(earlier, key=order)[-turns:]]


async def test_session_contexts_of_a_batch_follow_the_definition(pg: PgStore) -> None:
    """One query returns each candidate's session context as the definition for a single
    candidate would."""
    cands = [
        Candidate(
            candidate_id=f"c{i}",
            owner=Owner(tenant=t, user=u, agent=a),
            session=s,
            type=kind,
            content=f"turn {i} at minute {minute}",
            source_event_id=f"e{i}",
            occurred_at=BASE + timedelta(minutes=minute),
            redacted=True,
        )
        for i, (t, u, a, s, kind, minute) in enumerate(SPECS)
    ]
    keyed = [dedupe.key(c) for c in cands]
    await pg.bulk_insert([(k.memory_id, k.content_hash, k.candidate) for k in keyed])
    ids = [k.memory_id for k in keyed]
    assert await pg.tombstone(OwnerFilter(tenant="acme", user="ann"), ids[3])
    rows: list[MemoryRecord] = []
    for tenant in ("acme", "globex"):
        rows += (await pg.get_many(OwnerFilter(tenant=tenant), ids)).values()
    assert len(rows) == len(SPECS) - 1
    for turns in (1, 2, 3):
        want = {str(uuid.UUID(m.id)): expected(rows, m, turns) for m in rows}
        got = await pg.session_contexts(rows, turns)
        assert got == {mid: ctx for mid, ctx in want.items() if ctx}
    latest = next(m for m in rows if m.content.endswith("minute 4"))
    first, second = (await pg.session_contexts([latest]))[str(uuid.UUID(latest.id))]
    assert second == "turn 4 at minute 3"  # the deleted turn at minute 2 is skipped
    assert first in {"turn 1 at minute 1", "turn 2 at minute 1"}  # the later id of the tie
    assert await pg.session_contexts([latest, latest]) == await pg.session_contexts([latest])
    assert await pg.session_contexts([]) == {}


async def test_a_context_read_costs_the_same_in_a_long_session(
    pg: PgStore, database_url: str, namespace: str
) -> None:
    """Each memory's context is an ordered index scan of two entries, not a read of every
    earlier episode of its session: the buffers the batch statement touches per memory stay
    the same whether the session holds 40 or 1,600 episodes. Four users share it with no
    agent, as in the ingest bench: the planner, which does not expect ``IS NOT DISTINCT
    FROM`` to match a NULL, read the whole session before migration 016 (a bitmap scan, then
    a sort: 94.3 buffers a memory at 1,600 against 4.6 at 40; now 3.2 and 3.2)."""
    import asyncpg

    from memstream.storage.pg.indexrows import CONTEXTS_SQL, positions

    async def episodes(session: str, n: int) -> list[MemoryRecord]:
        cands = [
            Candidate(
                candidate_id=f"{session}-{i}",
                owner=Owner(tenant="acme", user=f"u{i % 4}"),
                session=session,
                content=f"turn {i} of {session}",
                source_event_id=f"{session}-e{i}",
                occurred_at=BASE + timedelta(seconds=i),
                redacted=True,
            )
            for i in range(n)
        ]
        keyed = [dedupe.key(c) for c in cands]
        await pg.bulk_insert([(k.memory_id, k.content_hash, k.candidate) for k in keyed])
        found = await pg.get_many(OwnerFilter(tenant="acme"), [k.memory_id for k in keyed])
        return sorted(found.values(), key=lambda m: m.occurred_at)[-20:]  # the latest 20

    short, long = await episodes("short", 10 * 4), await episodes("long", 400 * 4)
    con = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        await con.execute("ANALYZE memories")
        cost = {}
        for name, latest in (("short", short), ("long", long)):
            assert len(await pg.session_contexts(latest)) == 20
            cost[name] = await buffers(con, CONTEXTS_SQL, *positions(latest), 2) / len(latest)
    finally:
        await con.close()
    assert cost["long"] <= 1.5 * cost["short"] + 2, cost

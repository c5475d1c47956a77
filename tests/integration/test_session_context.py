"""The earlier-turn context of episodes (what the keyword leg indexes with each episode),
read for a whole batch in one statement, against a real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

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

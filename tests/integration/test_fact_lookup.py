"""What a fact lookup reads, against a real PostgreSQL: the versions of one owner's key,
through ``memories_fact_idx``, whatever the rest of the tenant holds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pgplans import buffers

from memstream.pipeline import dedupe
from memstream.schemas.memory import Candidate, MemoryType, Owner
from memstream.storage.pg.facts import current_fact_sql
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration

BASE = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = [f"k{j}" for j in range(5)]


def _fact(tenant: str, user: str, key: str, i: int) -> Candidate:
    return Candidate(
        candidate_id=f"{tenant}-{user}-{key}-{i}",
        owner=Owner(tenant=tenant, user=user),
        session="s1",
        type=MemoryType.FACT,
        content=f"{user} {key} is value {i}",
        source_event_id=f"{tenant}-{user}-{key}-e{i}",
        occurred_at=BASE + timedelta(seconds=i),
        metadata={"fact_key": key},
        redacted=True,
    )


def _episode(tenant: str, user: str, i: int) -> Candidate:
    return Candidate(
        candidate_id=f"{tenant}-{user}-turn-{i}",
        owner=Owner(tenant=tenant, user=user),
        session=f"s{i % 7}",
        content=f"turn {i} of {user}",
        source_event_id=f"{tenant}-{user}-turn-e{i}",
        occurred_at=BASE + timedelta(seconds=i),
        redacted=True,
    )


async def test_a_fact_lookup_reads_the_key_of_its_owner(
    pg: PgStore, database_url: str, namespace: str
) -> None:
    """``current_fact`` touches as many buffers for a user with 3,000 memories in a tenant
    where 600 users hold facts as for one with 20 memories in a tenant of 8 such users. The
    owner was compared as ``user_id = $n AND agent_id IS NULL``, which
    ``memories_fact_idx`` (keyed by ``coalesce(user_id, '')``, ``coalesce(agent_id, '')``)
    cannot match: the planner read either every fact entry of the tenant or every memory of
    the owner (before: 166 buffers against 7; now 3 and 3)."""
    import asyncpg

    for tenant, users, turns in (("small", 8, 20), ("large", 600, 3000)):
        rows = [dedupe.key(_episode(tenant, "u3", i)) for i in range(turns)]
        await pg.bulk_insert([(k.memory_id, k.content_hash, k.candidate) for k in rows])
        facts = [dedupe.key(_fact(tenant, f"u{u}", k, u)) for u in range(users) for k in KEYS]
        await pg.upsert_many([(k.memory_id, k.content_hash, k.candidate) for k in facts])
    con = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        await con.execute("ANALYZE memories")
        cost = {}
        for tenant in ("small", "large"):
            flt = OwnerFilter(tenant=tenant, user="u3")
            found = await pg.current_fact(flt, "k2")
            assert found is not None and found.content == "u3 k2 is value 3", found
            sql, args = current_fact_sql(flt, "k2", datetime.now(UTC))
            cost[tenant] = await buffers(con, sql, *args)
    finally:
        await con.close()
    assert cost["large"] <= 1.5 * cost["small"] + 2, cost
    # each reader of a key sees that owner's versions only
    history = await pg.fact_history(OwnerFilter(tenant="large", user="u7"), "k4")
    assert [m.content for m in history] == ["u7 k4 is value 7"]
    assert await pg.current_fact(OwnerFilter(tenant="large", user="u7", agent="bot"), "k4") is None

"""The store stage's reads of memories by (tenant, id) pair, against a real PostgreSQL: one
primary-key lookup a pair whatever the table's size, never a scan of the whole table."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from memstream.pipeline import dedupe
from memstream.schemas.memory import Candidate, Owner
from memstream.storage.postgres import BY_ID_SQL, EXISTING_SQL, OwnerFilter, PgStore

pytestmark = pytest.mark.integration

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (node type, relation) of a JSON plan."""
    found = [(node["Node Type"], node.get("Relation Name", ""))]
    for child in node.get("Plans", []):
        found += scans(child)
    return found


async def test_pair_lookups_stay_primary_key_lookups_as_the_table_grows(
    pg: PgStore, database_url: str, namespace: str
) -> None:
    """At 1,000 and at 9,000 memories (a young deployment), reading back 200 of them by
    (tenant, id) scans no table: written as a join of the pairs to the table, the planner
    read all of memories into a hash join (5.9 ms against 0.5 for 200 pairs at 9,000 rows).
    The reads still return exactly the live memories of the pairs asked, and a pair whose
    tenant is not the memory's finds nothing."""
    con = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        ids: list[str] = []
        for size in (1_000, 9_000):
            cands = [
                Candidate(
                    candidate_id=f"c{i}",
                    owner=Owner(tenant=f"t{i % 4}", user=f"u{i % 16}"),
                    session=f"s{i % 64}",
                    content=f"memory number {i}",
                    source_event_id=f"e{i}",
                    occurred_at=NOW,
                    redacted=True,
                )
                for i in range(len(ids), size)
            ]
            keyed = [dedupe.key(c) for c in cands]
            await pg.bulk_insert([(k.memory_id, k.content_hash, k.candidate) for k in keyed])
            ids += [k.memory_id for k in keyed]
            await con.execute("ANALYZE memories")
            pairs = [(f"t{i % 4}", ids[i]) for i in range(0, size, size // 200)]
            args = [[t for t, _ in pairs], [uuid.UUID(m) for _, m in pairs]]
            for sql, extra in ((BY_ID_SQL, [NOW]), (EXISTING_SQL, [])):
                for _ in range(6):  # past PostgreSQL's switch to a generic plan
                    await con.fetch(sql, *args, *extra)
                plan = json.loads(await con.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args, *extra))
                assert ("Seq Scan", "memories") not in scans(plan[0]["Plan"]), (size, plan)
            found = await pg.memories_by_id(pairs)
            assert set(found) == {m for _, m in pairs}
            assert await pg.existing(pairs) == set(pairs)
        assert await pg.memories_by_id([("t1", ids[0])]) == {}  # ids[0] is t0's
        assert await pg.existing([("t1", ids[0])]) == set()
        assert await pg.tombstone(OwnerFilter(tenant="t0"), ids[0])
        assert await pg.memories_by_id([("t0", ids[0])]) == {}
        assert await pg.existing([("t0", ids[0])]) == set()
    finally:
        await con.close()

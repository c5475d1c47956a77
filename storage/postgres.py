"""Postgres adapter (asyncpg): the record of truth.

Every write is idempotent: memory ids are deterministic, inserts use
``ON CONFLICT``, audit rows carry a unique ``event_key``. Driver errors are
translated here, once: connection failures become ``StorageUnavailable``.

``PgStore`` puts the statement groups of storage/pg/ together over one pool; this module
keeps the memories' own writes (the stages' upserts and merges, with their audit rows).
Each group is a small port (storage/pgports.py) that callers name instead of ``PgStore``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from memstream.schemas.memory import Candidate, MemoryRecord
from memstream.storage.pg.audit import PgAudit
from memstream.storage.pg.facts import PgFacts
from memstream.storage.pg.indexrows import PgIndexRows
from memstream.storage.pg.keys import PgKeys
from memstream.storage.pg.maintenance import PgMaintenance
from memstream.storage.pg.managed import PgManaged
from memstream.storage.pg.reads import PgReads
from memstream.storage.pg.sql import (
    _COLUMNS,
    _TRANSIENT,
    Clock,
    OwnerFilter,
    _fold_key,
    _record,
    _upsert_args,
    hash_key,
    keyword_query,
    migrations,
    utcnow,
)
from memstream.storage.pg.switches import PgSwitches
from memstream.storage.pgpool import unavailable

__all__ = ["Clock", "OwnerFilter", "PgStore", "hash_key", "keyword_query", "migrations", "utcnow"]


_UPSERT_ROW = """
INSERT INTO memories (id, tenant, user_id, agent_id, app, project, session, scope, type,
    content, content_hash, salience, confidence, importance, source_event_ids, metadata,
    redactions, occurred_at, pinned, expires_at, fact_key, created_at, updated_at, tags)
VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,ARRAY[$15::text],$16::jsonb,
        $17::jsonb,$18,$19,$20,$21,$22,$22,$23::text[])
ON CONFLICT (id) DO UPDATE SET
    source_event_ids = CASE WHEN $15 = ANY(memories.source_event_ids)
        THEN memories.source_event_ids ELSE memories.source_event_ids || $15::text END,
    deleted_at = CASE WHEN $15 = ANY(memories.source_event_ids)
        THEN memories.deleted_at ELSE NULL END,
    updated_at = CASE WHEN $15 = ANY(memories.source_event_ids)
        THEN memories.updated_at ELSE $22 END,
    indexed = CASE WHEN $15 = ANY(memories.source_event_ids)
        THEN memories.indexed ELSE false END  -- the index record lists the sources
RETURNING (xmax = 0) AS inserted, source_event_ids[1] = $15 AS own
"""
# near-duplicate folds: each memory's new source events appended once, in the order given
_MERGE_SET = """
WITH q AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[])
        WITH ORDINALITY AS q(id, tenant, src, o)
), agg AS (
    SELECT id, tenant, array_agg(src ORDER BY o) AS srcs FROM q GROUP BY id, tenant
)
UPDATE memories m SET
    source_event_ids = m.source_event_ids || ARRAY(
        SELECT u.s FROM unnest(agg.srcs) WITH ORDINALITY AS u(s, o)
        WHERE NOT u.s = ANY(m.source_event_ids) GROUP BY u.s ORDER BY min(u.o)),
    updated_at = $4,
    indexed = false
FROM agg
WHERE m.id = agg.id AND m.tenant = agg.tenant AND m.deleted_at IS NULL
RETURNING m.id, m.tenant
"""


def _by_pairs(columns: str, where: str) -> str:
    """The memories of the (tenant, id) pairs ``$1``/``$2`` that pass ``where``, each found
    by one primary-key lookup. Written as a join of the pairs to the table, the planner chose
    a hash join over a scan of the whole table until it held some 30,000 rows: 5.9 ms
    instead of 0.5 for 200 pairs at 9,000 rows, in every store batch of a young deployment.
    A ``LATERAL ... LIMIT 1`` subquery is never flattened into such a join."""
    return (
        "SELECT m.* FROM unnest($1::text[], $2::uuid[]) AS q(tenant, id) CROSS JOIN LATERAL "
        f"(SELECT {columns} FROM memories WHERE id = q.id AND tenant = q.tenant AND {where} "
        "LIMIT 1) m"
    )


EXISTING_SQL = _by_pairs("tenant, id::text AS id", "deleted_at IS NULL")
BY_ID_SQL = _by_pairs(  # $3: now
    _COLUMNS,
    "deleted_at IS NULL AND superseded_by IS NULL "
    "AND (expires_at IS NULL OR pinned OR expires_at > $3) "
    "AND (valid_to IS NULL OR valid_to > $3) AND (valid_from IS NULL OR valid_from <= $3)",
)


class PgStore(PgReads, PgManaged, PgFacts, PgIndexRows, PgMaintenance, PgSwitches, PgKeys, PgAudit):
    """Memories and their audit trail in one Postgres schema."""

    async def existing(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """The (tenant, memory id) pairs among ``keys`` that are live memories: ``exists``
        for a batch, in one statement."""
        if not keys:
            return set()
        rows = await self._fetch(
            EXISTING_SQL,
            [t for t, _ in keys],
            [uuid.UUID(mid) for _, mid in keys],
        )
        return {(r["tenant"], r["id"]) for r in rows}

    async def memories_by_id(self, keys: Sequence[tuple[str, str]]) -> dict[str, MemoryRecord]:
        """Live memories among (tenant, memory id) pairs of any tenants, in one statement
        (``get_many`` without an owner filter: the store stage reads back what it wrote)."""
        if not keys:
            return {}
        rows = await self._fetch(
            BY_ID_SQL,
            [t for t, _ in keys],
            [uuid.UUID(mid) for _, mid in keys],
            self.clock(),
        )
        return {str(r["id"]): _record(r) for r in rows}

    async def exists(self, tenant: str, memory_id: str) -> bool:
        rows = await self._fetch(
            "SELECT 1 FROM memories WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL",
            memory_id,
            tenant,
        )
        return bool(rows)

    async def upsert(self, memory_id: str, content_hash: str, c: Candidate) -> bool:
        """Insert the memory, or merge the candidate's source event into it.

        Returns True when a row was inserted. Replaying the same candidate is a
        no-op: the source event id is already recorded.
        """
        return (await self.upsert_many([(memory_id, content_hash, c)]))[0]

    async def upsert_many(self, rows: Sequence[tuple[str, str, Candidate]]) -> list[bool]:
        """``upsert`` for many candidates in one transaction and one round trip per statement
        kind (the statements are pipelined): True per row that was inserted. Rows run in
        order, so a memory id listed twice is inserted by the first and merged by the second.
        (One statement over arrays was no faster: the row inserts and their seven indexes
        are the cost, and it cannot insert a row and then update it.)"""
        if not rows:
            return []
        try:
            async with self._transaction() as con:
                return await self._upsert_rows(con, rows)
        except _TRANSIENT as exc:
            raise unavailable(exc) from exc

    async def write_batch(
        self,
        rows: Sequence[tuple[str, str, Candidate]],
        folds: Sequence[tuple[str, str, str, str]] = (),
        then: Sequence[tuple[str, str, str, str]] = (),
    ) -> tuple[list[bool], list[bool], list[bool]]:
        """``merge_many(folds)``, ``upsert_many(rows)``, then ``merge_many(then)``, in one
        transaction: a store batch's near-duplicate folds, its rows and its folds into the
        rows it writes, with one commit instead of three."""
        if not (rows or folds or then):
            return [], [], []
        try:
            async with self._transaction() as con:
                before = await self._fold_rows(con, folds)
                inserted = await self._upsert_rows(con, rows)
                after = await self._fold_rows(con, then)
        except _TRANSIENT as exc:
            raise unavailable(exc) from exc
        return inserted, before, after

    async def _upsert_rows(
        self, con: Any, rows: Sequence[tuple[str, str, Candidate]]
    ) -> list[bool]:
        if not rows:
            return []
        now = self.clock()
        args = [_upsert_args(mid, chash, c, now) for mid, chash, c in rows]
        found = await con.fetchmany(_UPSERT_ROW, args)
        # a replay by the candidate that created the row (its first source) is that "stored"
        # again (its audit row exists already), not a merge
        stored = [bool(r["inserted"] or r["own"]) for r in found]
        await self._events(
            con,
            [
                (
                    c.owner.tenant,
                    mid,
                    "stored" if new else "merged",
                    c.source_event_id,
                    {
                        "source_event_id": c.source_event_id,
                        "type": c.type.value,
                        "redactions": c.redactions,
                    },
                )
                for (mid, _, c), new in zip(rows, stored, strict=True)
            ],
        )
        return [bool(r["inserted"]) for r in found]

    async def _events(
        self,
        con: Any,
        events: Sequence[tuple[str, str | None, str, str, dict[str, Any]]],
        keys: Sequence[str | None] = (),
    ) -> None:
        """``_event`` for many audit rows (tenant, memory id, kind, cause, detail), in one
        statement over arrays; ``keys``, when given, one per row, as ``_event``'s ``key``."""
        if not events:
            return
        keyed = list(keys) or [None] * len(events)
        await con.execute(
            "INSERT INTO memory_events (event_key, tenant, memory_id, kind, at, detail) "
            "SELECT e.key, e.tenant, e.memory_id, e.kind, $5, e.detail::jsonb FROM "
            "unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $6::text[]) "
            "AS e(key, tenant, memory_id, kind, detail) ON CONFLICT (event_key) DO NOTHING",
            [
                key or f"{kind}:{mid or '-'}:{cause}"
                for (_, mid, kind, cause, _), key in zip(events, keyed, strict=True)
            ],
            [tenant for tenant, *_ in events],
            [mid for _, mid, *_ in events],
            [kind for _, _, kind, *_ in events],
            self.clock(),
            [json.dumps(detail) for *_, detail in events],
        )

    async def bulk_insert(self, rows: Sequence[tuple[str, str, Candidate]]) -> None:
        """Load many memories at once (benchmarks, imports): COPY, no audit rows, indexed."""
        records = [
            (
                uuid.UUID(mid),
                c.owner.tenant,
                c.owner.user,
                c.owner.agent,
                c.session,
                c.scope.value,
                c.type.value,
                c.content,
                chash,
                [c.source_event_id],
                json.dumps(c.metadata),
                c.occurred_at,
                True,
            )
            for mid, chash, c in rows
        ]
        async with self._pool.acquire() as con:
            await con.copy_records_to_table(
                "memories",
                records=records,
                columns=[
                    "id",
                    "tenant",
                    "user_id",
                    "agent_id",
                    "session",
                    "scope",
                    "type",
                    "content",
                    "content_hash",
                    "source_event_ids",
                    "metadata",
                    "occurred_at",
                    "indexed",
                ],
            )

    async def merge_many(self, merges: Sequence[tuple[str, str, str, str]]) -> list[bool]:
        """``merge`` for many (tenant, memory id, source event id, candidate id), in one
        transaction and one statement: True for each that found its live memory. A memory
        named twice gets both source events, in order. Each fold is recorded under its
        candidate id, as ``merge`` does."""
        if not merges:
            return []
        async with self._transaction() as con:
            return await self._fold_rows(con, merges)

    async def _fold_rows(self, con: Any, merges: Sequence[tuple[str, str, str, str]]) -> list[bool]:
        if not merges:
            return []
        rows = await con.fetch(
            _MERGE_SET,
            [mid for _, mid, _, _ in merges],
            [tenant for tenant, _, _, _ in merges],
            [src for _, _, src, _ in merges],
            self.clock(),
        )
        live = {(str(r["tenant"]), str(r["id"])) for r in rows}
        done = {i for i, (t, mid, _, _) in enumerate(merges) if (t, str(uuid.UUID(mid))) in live}
        folds = [m for i, m in enumerate(merges) if i in done]
        await self._events(
            con,
            [
                (tenant, mid, "merged", src, {"source_event_id": src, "near_duplicate": True})
                for tenant, mid, src, _ in folds
            ],
            [_fold_key(cid) for *_, cid in folds],
        )
        return [i in done for i in range(len(merges))]

    async def merge(
        self, tenant: str, memory_id: str, source_event_id: str, candidate_id: str | None = None
    ) -> bool:
        """Fold a near-duplicate's source event into an existing live memory. With
        ``candidate_id`` the fold is recorded under it, in the same transaction, so that a
        redelivered candidate finds where it went (``folded_into``) instead of deciding again:
        the near-duplicate check depends on the index, which may be away on the next try."""
        async with self._transaction() as con:
            row = await con.fetchrow(
                "UPDATE memories SET source_event_ids = CASE WHEN $3 = ANY(source_event_ids) "
                "THEN source_event_ids ELSE source_event_ids || $3::text END, updated_at = $4, "
                "indexed = false "
                "WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL RETURNING id",
                memory_id,
                tenant,
                source_event_id,
                self.clock(),
            )
            if row is None:
                return False
            await self._event(
                con,
                tenant,
                memory_id,
                "merged",
                source_event_id,
                {"source_event_id": source_event_id, "near_duplicate": True},
                key=_fold_key(candidate_id) if candidate_id else None,
            )
        return True

    async def folded_into(self, tenant: str, candidate_id: str) -> str | None:
        """The memory a near-duplicate candidate was folded into (``merge``), or None."""
        rows = await self._fetch(
            "SELECT memory_id::text AS id FROM memory_events WHERE event_key = $1 AND tenant = $2",
            _fold_key(candidate_id),
            tenant,
        )
        return str(rows[0]["id"]) if rows else None

    async def folded_among(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """``folded_into`` for many (tenant, candidate id), in one read: the folded ones only."""
        if not pairs:
            return {}
        rows = await self._fetch(
            "SELECT e.tenant, e.event_key, e.memory_id::text AS id FROM memory_events e "
            "JOIN unnest($1::text[], $2::text[]) AS p(tenant, key) "
            "ON e.event_key = p.key AND e.tenant = p.tenant",
            [t for t, _ in pairs],
            [_fold_key(c) for _, c in pairs],
        )
        by_key = {(str(r["tenant"]), str(r["event_key"])): str(r["id"]) for r in rows}
        return {(t, c): by_key[(t, _fold_key(c))] for t, c in pairs if (t, _fold_key(c)) in by_key}

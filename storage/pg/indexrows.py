"""The rows the indexer reads and marks: each episode's neighbours in its session (the
keyword leg's context) and the ``indexed`` flag."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from memstream.schemas.memory import MemoryRecord
from memstream.storage.pg.base import PgBase
from memstream.storage.pg.sql import _COLUMNS, _record

_PLACE = "m.content, m.occurred_at, m.created_at, m.id"  # what ordering a context needs


def _once(memories: Sequence[MemoryRecord]) -> list[MemoryRecord]:
    """Each memory once, by id: a memory listed twice would get its neighbours twice."""
    return list({str(uuid.UUID(m.id)): m for m in memories}.values())


def positions(
    memories: Sequence[MemoryRecord],
) -> tuple[
    list[str],
    list[str],
    list[str | None],
    list[str | None],
    list[datetime],
    list[datetime],
    list[uuid.UUID],
]:
    """The unnest arrays ($1..$7) of the memories' places in their sessions, in the column
    order ``q(tenant, session, user_id, agent_id, occurred_at, created_at, id)``."""
    return (
        [m.tenant for m in memories],
        [m.session for m in memories],
        [m.user for m in memories],
        [m.agent for m in memories],
        [m.occurred_at for m in memories],
        [m.created_at for m in memories],
        [uuid.UUID(m.id) for m in memories],
    )


def _neighbours(columns: str, before: bool) -> str:
    """FROM clause: the $8 episodes right before (or after) each memory of ``positions`` in
    its session and owner, nearest first, as a lateral join on ``q`` (one statement for a
    whole batch, not one per memory). The owner is compared as the index
    ``memories_session_owner_turns_idx`` keys it, so each memory's neighbours are an ordered
    scan of $8 entries, whatever the length of its session."""
    op, order = ("<", " DESC") if before else (">", "")
    return (
        "unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], "
        "$6::timestamptz[], $7::uuid[]) "
        "AS q(tenant, session, user_id, agent_id, occurred_at, created_at, id) "
        f"CROSS JOIN LATERAL (SELECT {columns} FROM memories m WHERE m.tenant = q.tenant "
        "AND m.session = q.session AND m.type = 'episode' "
        "AND coalesce(m.user_id, '') = coalesce(q.user_id, '') "
        "AND coalesce(m.agent_id, '') = coalesce(q.agent_id, '') "
        f"AND (m.occurred_at, m.created_at, m.id) {op} (q.occurred_at, q.created_at, q.id) "
        f"AND m.deleted_at IS NULL ORDER BY m.occurred_at{order}, m.created_at{order}, "
        f"m.id{order} LIMIT $8)"
    )


# ``session_contexts``' statement: $1-$7 ``positions``, $8 the turns
CONTEXTS_SQL = (
    f"SELECT q.id::text AS of, c.content FROM {_neighbours(_PLACE, before=True)} c "
    "ORDER BY q.id, c.occurred_at, c.created_at, c.id"
)


class PgIndexRows(PgBase):
    """Session neighbours in one statement per batch, and the indexed flag."""

    async def session_contexts(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> dict[str, list[str]]:
        """The contents of the ``turns`` episodes right before each memory in its session (by
        occurrence, then arrival, then id; oldest first), in one statement: the earlier-turn
        context of the keyword leg. Memory id -> contents; memories without earlier episodes
        are absent. One statement for the batch, not one per memory."""
        memories = _once(memories)
        if not memories:
            return {}
        rows = await self._fetch(CONTEXTS_SQL, *positions(memories), turns)
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r["of"], []).append(r["content"])
        return out

    async def session_followers(self, m: MemoryRecord, turns: int = 2) -> list[MemoryRecord]:
        """The episodes right after ``m`` in its session: their context includes ``m``, so
        they are re-indexed when ``m`` arrives late (stages may reorder turns)."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE tenant = $1 AND session = $2 "
            "AND type = 'episode' AND coalesce(user_id, '') = coalesce($3, '') "
            "AND coalesce(agent_id, '') = coalesce($4, '') "
            "AND (occurred_at, created_at, id) > ($5, $6, $7) "
            "AND deleted_at IS NULL ORDER BY occurred_at, created_at, id LIMIT $8",
            m.tenant,
            m.session,
            m.user,
            m.agent,
            m.occurred_at,
            m.created_at,
            uuid.UUID(m.id),
            turns,
        )
        return [_record(r) for r in rows]

    async def session_followers_many(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> list[MemoryRecord]:
        """``session_followers`` of every memory, in one statement (each follower once)."""
        memories = _once(memories)
        if not memories:
            return []
        cols = ", ".join(f"f.{c.strip()}" for c in _COLUMNS.split(","))
        rows = await self._fetch(
            f"SELECT DISTINCT ON (f.id) {cols} FROM {_neighbours('*', before=False)} f "
            "ORDER BY f.id",
            *positions(memories),
            turns,
        )
        return [_record(r) for r in rows]

    async def mark_indexed(
        self, ids: Sequence[str], read: Sequence[datetime | None] | None = None
    ) -> None:
        """The points of ``ids`` are in the vector index (idempotent). ``read``: per id, the
        ``updated_at`` of the row its point was built from (None: unchecked). A row written
        since keeps its flag: the change reset it, and its own writer marks it once its newer
        point is in; the older point cannot have replaced that one (versioned points,
        ``VectorIndex.upsert``). Forcing it to not indexed left a memory whose newer point
        was in place for the next reconcile round, up to ``sweep_every_s`` later, whenever
        the newer writer marked first (the reconciler's round against the store stage after
        a restart: docs/benchmarks.md, "twenty-seventh session").

        A row another transaction holds is left unmarked rather than waited for. The store
        stage marks a batch while the next batch's transaction upserts and folds into the
        same memories, and the two took their row locks in different orders: a deadlock
        (1-2 in 25 s of ingest bench here), and PostgreSQL breaks one only after
        ``deadlock_timeout`` (1 s), stalling both batches. A row skipped is one that
        transaction re-indexes and marks itself (a new source resets ``indexed``), or, if it
        rolls back, that the maintenance loop indexes again (idempotent)."""
        if read is None:
            await self._fetch(
                "UPDATE memories SET indexed = true WHERE id IN (SELECT id FROM memories "
                "WHERE id = ANY($1::uuid[]) FOR NO KEY UPDATE SKIP LOCKED)",
                list(ids),
            )
            return
        await self._fetch(
            "UPDATE memories m SET indexed = (q.read IS NULL OR m.updated_at = q.read "
            "OR m.indexed) "
            "FROM unnest($1::uuid[], $2::timestamptz[]) AS q(id, read) "
            "WHERE m.id = q.id AND m.id IN (SELECT id FROM memories "
            "WHERE id = ANY($1::uuid[]) FOR NO KEY UPDATE SKIP LOCKED)",
            list(ids),
            list(read),
        )

"""Reads of memories under an owner filter: recall's keyword leg and hydration, the
access counts recall keeps, and the management commands' get, list and review counts."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memstream.schemas.memory import MemoryRecord
from memstream.storage.pg.base import PgBase
from memstream.storage.pg.sql import _COLUMNS, OwnerFilter, _record, _where, keyword_query


class PgReads(PgBase):
    """Owner-filtered reads: a row of another tenant or owner never passes ``_where``."""

    async def keyword_search(
        self, flt: OwnerFilter, query: str, limit: int
    ) -> list[tuple[str, float]]:
        """(id, rank) by Postgres full-text ranking over an OR of the query words."""
        tsq = keyword_query(query)
        if not tsq:
            return []
        args: list[Any] = [tsq]
        where = _where(flt, args, self.clock())
        args.append(limit)
        rows = await self._fetch(
            f"SELECT id, ts_rank_cd(tsv, q) AS rank FROM memories, "
            f"to_tsquery('english', $1) q WHERE {where} AND tsv @@ q "
            f"ORDER BY rank DESC, id LIMIT ${len(args)}",
            *args,
        )
        return [(str(r["id"]), float(r["rank"])) for r in rows]

    async def get_many(self, flt: OwnerFilter, ids: Sequence[str]) -> dict[str, MemoryRecord]:
        """Live (not deleted, not expired, not superseded) memories among ``ids`` that
        match the filter: a hit from another tenant or owner can never pass."""
        if not ids:
            return {}
        args: list[Any] = [list(ids)]
        where = _where(flt, args, self.clock())
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE id = ANY($1::uuid[]) AND {where}", *args
        )
        return {str(r["id"]): _record(r) for r in rows}

    async def touch(self, tenant: str, counts: Mapping[str, int]) -> list[str]:
        """Count accesses of memories (own recall only; peer reads never call this): one
        statement for a whole batch of recalls. A memory another transaction holds (the
        store stage folding a source into it) is skipped, not waited for, and its id
        returned: waiting, this statement held the rows it had counted while the store's
        transaction might want one of them next, a deadlock that PostgreSQL breaks only
        after ``deadlock_timeout`` (1 s) of both stalled."""
        rows = await self._fetch(
            "WITH t AS (SELECT * FROM unnest($2::uuid[], $3::int[]) AS t(id, n)), "
            "free AS (SELECT m.id FROM memories m JOIN t ON m.id = t.id WHERE m.tenant = $1 "
            "FOR NO KEY UPDATE OF m SKIP LOCKED), "
            "counted AS (UPDATE memories m SET access_count = m.access_count + t.n, "
            "last_accessed_at = $4 FROM t WHERE m.id = t.id AND m.id IN (SELECT id FROM free) "
            "RETURNING m.id) "
            "SELECT m.id::text AS id FROM memories m JOIN t ON m.id = t.id WHERE m.tenant = $1 "
            "AND m.id NOT IN (SELECT id FROM counted)",
            tenant,
            list(counts),
            list(counts.values()),
            self.clock(),
        )
        given = {str(uuid.UUID(mid)): mid for mid in counts}  # as the caller spelled them
        return [given[r["id"]] for r in rows]

    async def list_memories(
        self, flt: OwnerFilter, limit: int = 100, offset: int = 0, live: bool = True
    ) -> list[MemoryRecord]:
        args: list[Any] = []
        where = _where(flt, args, self.clock(), live)
        args += [limit, offset]
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} ORDER BY occurred_at DESC, id "
            f"LIMIT ${len(args) - 1} OFFSET ${len(args)}",
            *args,
        )
        return [_record(r) for r in rows]

    async def get(self, flt: OwnerFilter, memory_id: str) -> MemoryRecord | None:
        """One memory of the caller's scope (superseded and expired included), or None."""
        args: list[Any] = [memory_id]
        where = _where(flt, args, self.clock(), live=False)
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE id = $1 AND {where}", *args
        )
        return _record(rows[0]) if rows else None

    async def pending_review(
        self,
        tenant: str,
        since: dict[str, datetime],
        user: str | None = None,
        agent: str | None = None,
    ) -> dict[str, int]:
        """Memories created per agent since each given time (``*``: every agent together),
        of those the caller may read as theirs or a peer's (``Memories.pending_review``)."""
        out: dict[str, int] = {}
        for name, ts in since.items():
            rows = await self._fetch(
                "SELECT count(*) AS n FROM memories WHERE tenant = $1 AND created_at >= $2 "
                "AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > $3) "
                "AND (user_id IS NULL OR (user_id = $4 AND agent_id IS NOT DISTINCT FROM $5)) "
                + ("AND agent_id IS NOT NULL" if name == "*" else "AND agent_id = $6"),
                *(tenant, ts, self.clock(), user, agent),
                *(() if name == "*" else (name,)),
            )
            out[name] = int(rows[0]["n"])
        return out

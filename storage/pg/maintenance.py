"""Maintenance: memories still to index, expiry, and the queue of vector points to delete
(every change that retires a memory queues its point in the same transaction)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from memstream.schemas.memory import MemoryRecord
from memstream.storage.pg.base import PgBase
from memstream.storage.pg.sql import _COLUMNS, _queue_vector_deletes, _record


class PgMaintenance(PgBase):
    """What the reconciler and the sweeper read and clear."""

    async def unindexed(
        self, limit: int = 256, written_by: datetime | None = None
    ) -> list[MemoryRecord]:
        """Live memories not yet in the vector index (Qdrant was down when stored), oldest
        first; ``written_by``: only those last written at or before then."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE NOT indexed AND deleted_at IS NULL "
            "AND ($2::timestamptz IS NULL OR updated_at <= $2) ORDER BY created_at LIMIT $1",
            limit,
            written_by,
        )
        return [_record(r) for r in rows]

    async def purge_expired(
        self, limit: int = 1000
    ) -> list[tuple[str, str, str | None, str | None]]:
        """Delete memories past expires_at (pinned ones never expire); returns
        (tenant, id, user, agent) of each removed."""
        async with self._transaction() as con:
            rows = await con.fetch(
                "DELETE FROM memories WHERE id IN (SELECT id FROM memories WHERE expires_at <= $1 "
                "AND NOT pinned LIMIT $2) RETURNING tenant, id, user_id, agent_id",
                self.clock(),
                limit,
            )
            for r in rows:
                await _queue_vector_deletes(con, r["tenant"], [str(r["id"])])
                await self._event(con, r["tenant"], str(r["id"]), "expired", "sweeper", {})
        return [(r["tenant"], str(r["id"]), r["user_id"], r["agent_id"]) for r in rows]

    async def pending_vector_deletes(self, limit: int = 1000) -> dict[str, list[str]]:
        """Points still to delete (queued with their memory's change), by tenant."""
        rows = await self._fetch(
            "SELECT tenant, memory_id FROM vector_deletes ORDER BY at LIMIT $1", limit
        )
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r["tenant"], []).append(str(r["memory_id"]))
        return out

    async def vector_deletes_done(self, tenant: str, ids: Sequence[str]) -> None:
        """The points of ``ids`` are deleted: drop them from the queue. A memory among them
        that is live again (re-stored after it was forgotten) may have been indexed before
        the delete ran, so it is marked unindexed and the reconciler indexes it again."""
        async with self._transaction() as con:
            await con.execute(
                "DELETE FROM vector_deletes WHERE tenant = $1 AND memory_id = ANY($2::uuid[])",
                tenant,
                list(ids),
            )
            await con.execute(
                "UPDATE memories SET indexed = false WHERE tenant = $1 AND id = ANY($2::uuid[]) "
                "AND deleted_at IS NULL AND superseded_by IS NULL AND indexed",
                tenant,
                list(ids),
            )

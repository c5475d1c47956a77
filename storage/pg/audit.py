"""The audit trail: ``memory_events`` rows, append-only, one per operation (a unique key
makes a replayed operation record nothing new)."""

from __future__ import annotations

import json
from typing import Any

from memstream.storage.pg.base import PgBase
from memstream.storage.pg.sql import _PERMANENT, _TRANSIENT, _rejected
from memstream.storage.pgpool import unavailable


class PgAudit(PgBase):
    """Record an operation, read a memory's (or a tenant's) trail."""

    async def record_event(
        self,
        tenant: str,
        memory_id: str | None,
        kind: str,
        cause: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        try:
            async with self._pool.acquire() as con:
                await self._event(con, tenant, memory_id, kind, cause, detail or {})
        except _TRANSIENT as exc:
            raise unavailable(exc) from exc
        except _PERMANENT as exc:
            raise _rejected(exc) from exc

    async def events_for(self, tenant: str, memory_id: str | None = None) -> list[dict[str, Any]]:
        """The audit trail of one memory (or a tenant), oldest first."""
        if memory_id is None:
            rows = await self._fetch(
                "SELECT memory_id, kind, at, detail FROM memory_events "
                "WHERE tenant = $1 ORDER BY seq",
                tenant,
            )
        else:
            rows = await self._fetch(
                "SELECT memory_id, kind, at, detail FROM memory_events "
                "WHERE tenant = $1 AND memory_id = $2 ORDER BY seq",
                tenant,
                memory_id,
            )
        return [
            {
                "memory_id": str(r["memory_id"]) if r["memory_id"] else None,
                "kind": r["kind"],
                "at": r["at"],
                "detail": json.loads(r["detail"]),
            }
            for r in rows
        ]

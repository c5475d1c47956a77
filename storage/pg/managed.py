"""The management commands' writes to one owner's memories (pin, edit, forget, erase):
each with its audit row in the same transaction, and a retired memory's point queued for
deletion with it (``vector_deletes``)."""

from __future__ import annotations

import json
from typing import Any

from memstream.schemas.memory import MemoryRecord
from memstream.storage.pg.base import PgBase
from memstream.storage.pg.sql import _COLUMNS, OwnerFilter, _queue_vector_deletes, _record, _where


class PgManaged(PgBase):
    """Writes under the caller's owner filter: another owner's memory is never touched."""

    async def set_pinned(
        self, flt: OwnerFilter, memory_id: str, pinned: bool
    ) -> MemoryRecord | None:
        """Pin (ranks first, never expires) or unpin; None when not the caller's memory. The
        index point holds the flag and the expiry it lifts, so ``indexed`` is reset: the point
        is rebuilt now, or by the reconciler when the index is away."""
        args: list[Any] = [memory_id, pinned]
        where = _where(flt, args, self.clock(), live=False)
        args.append(self.clock())  # the store's clock, as every write: the reconciler compares it
        async with self._transaction() as con:
            row = await con.fetchrow(
                f"UPDATE memories SET pinned = $2, updated_at = ${len(args)}, indexed = false "
                f"WHERE id = $1 AND {where} "
                f"RETURNING {_COLUMNS}",
                *args,
            )
            if row is None:
                return None
            kind = "pinned" if pinned else "unpinned"
            await self._event(con, flt.tenant, memory_id, kind, self.clock().isoformat(), {})
        return _record(row)

    async def update_content(
        self,
        flt: OwnerFilter,
        memory_id: str,
        content: str,
        content_hash: str,
        metadata: dict[str, Any] | None,
        redactions: dict[str, int],
    ) -> MemoryRecord | None:
        """New (redacted) text for one of the caller's live memories, same id; the caller
        rebuilds the index point (``indexed`` is reset). None when not the caller's.

        The row's hash becomes ``<hash>@<id>``: an edited memory keeps its id, which is no
        longer the one exact dedupe derives from its text, so it leaves the exact-dedupe key
        (a later turn with the same text is a memory of its own, or a near-duplicate merge)."""
        args: list[Any] = [memory_id, content, f"{content_hash}@{memory_id}"]
        args.append(json.dumps(redactions))
        meta_sql = ""
        if metadata is not None:
            args.append(json.dumps(metadata))
            meta_sql = f", metadata = ${len(args)}::jsonb"
        where = _where(flt, args, self.clock(), live=True)
        args.append(self.clock())  # the store's clock, as every write: the reconciler compares it
        async with self._transaction() as con:
            row = await con.fetchrow(
                f"UPDATE memories SET content = $2, content_hash = $3, redactions = $4::jsonb,"
                f" indexed = false, updated_at = ${len(args)}{meta_sql} WHERE id = $1 AND {where} "
                f"AND fact_key IS NULL RETURNING {_COLUMNS}",
                *args,
            )
            if row is None:
                return None
            await self._event(
                con,
                flt.tenant,
                memory_id,
                "updated",
                f"{content_hash}:{self.clock().isoformat()}",
                {"redactions": redactions},
            )
        return _record(row)

    async def tombstone(self, flt: OwnerFilter, memory_id: str) -> bool:
        """Forget one memory: tombstoned now, hidden from every read."""
        args: list[Any] = [memory_id, self.clock()]
        where = _where(flt, args, self.clock(), live=False)
        async with self._transaction() as con:
            row = await con.fetchrow(
                f"UPDATE memories SET deleted_at = $2, updated_at = $2 WHERE id = $1 AND {where} "
                "RETURNING id",
                *args,
            )
            if row is None:
                return False
            await _queue_vector_deletes(con, flt.tenant, [memory_id])
            await self._event(con, flt.tenant, memory_id, "forgotten", "tombstone", {})
        return True

    async def erase(self, flt: OwnerFilter) -> list[str]:
        """Erasure: delete every memory of the owner (or one session) for good.
        Returns the ids removed; one audit row records the erasure (no content). Its
        delete locks many rows in the table's order, and a store batch writing the same
        owner's memories can hold one of them: a deadlock PostgreSQL breaks is tried once
        more (``_in_transaction``) rather than answered "unavailable"."""
        args: list[Any] = []
        where = _where(flt, args, self.clock(), live=False).replace("deleted_at IS NULL", "true")

        async def erased(con: Any) -> list[str]:
            rows = await con.fetch(f"DELETE FROM memories WHERE {where} RETURNING id", *args)
            ids = [str(r["id"]) for r in rows]
            await _queue_vector_deletes(con, flt.tenant, ids)
            await self._event(
                con,
                flt.tenant,
                None,
                "erased",
                self.clock().isoformat(),
                {
                    "user": flt.user,
                    "agent": flt.agent,
                    "session": flt.session,
                    "memories": len(ids),
                },
            )
            return ids

        return await self._in_transaction(erased)

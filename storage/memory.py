"""``MemoryStore``: the record-of-truth ports (storage/pgports.py) in process memory.

Shipped beside the Postgres adapter, as structlog ships ``capture_logs``: application tests
(tests/unit) run stage and command logic against it with no server, and
tests/contract/test_store_contract.py holds it to the same behaviour as ``PgStore``. Not for
production: nothing is durable, and the keyword search matches whole words without
Postgres' stemming and ranking (``rank`` is the number of query words matched).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memstream.schemas.errors import NotFound
from memstream.schemas.memory import Candidate, MemoryRecord, MemoryType
from memstream.storage.memory_rows import RowsMixin, matches
from memstream.storage.pg.sql import Clock, OwnerFilter, hash_key, utcnow

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


class MemoryStore(RowsMixin):
    """Every port of ``storage.pgports.Store``, over dicts."""

    def __init__(self, clock: Clock = utcnow) -> None:
        super().__init__(clock)
        self.switches: set[tuple[str, str, str]] = set()
        self.keys: dict[str, tuple[str, str | None, str | None, bool]] = {}  # hash -> row
        self.closed = False

    # --- MemoryReads ------------------------------------------------------------------------

    async def get_many(self, flt: OwnerFilter, ids: Sequence[str]) -> dict[str, MemoryRecord]:
        return {
            i: m
            for i in ids
            if (m := self.rows.get(i)) is not None and matches(flt, m, self.clock())
        }

    async def keyword_search(
        self, flt: OwnerFilter, query: str, limit: int
    ) -> list[tuple[str, float]]:
        words = {w.lower() for w in _WORD.findall(query)}
        found = []
        for m in self.rows.values():
            if matches(flt, m, self.clock()):
                rank = len(words & {w.lower() for w in _WORD.findall(m.content)})
                if rank:
                    found.append((m.id, float(rank)))
        found.sort(key=lambda h: (-h[1], h[0]))
        return found[:limit]

    async def touch(self, tenant: str, counts: Mapping[str, int]) -> list[str]:
        for mid, n in counts.items():
            m = self.rows.get(mid)
            if m is not None and m.tenant == tenant:
                self._put(m, access_count=m.access_count + n, last_accessed_at=self.clock())
        return []  # no other transaction holds a row here

    # --- ManagedMemories --------------------------------------------------------------------

    async def get(self, flt: OwnerFilter, memory_id: str) -> MemoryRecord | None:
        m = self.rows.get(memory_id)
        return m if m is not None and matches(flt, m, self.clock(), live_only=False) else None

    async def list_memories(
        self, flt: OwnerFilter, limit: int = 100, offset: int = 0, live: bool = True
    ) -> list[MemoryRecord]:
        now = self.clock()
        found = [m for m in self.rows.values() if matches(flt, m, now, live_only=live)]
        found.sort(key=lambda m: m.id)
        found.sort(key=lambda m: m.occurred_at, reverse=True)
        return found[offset : offset + limit]

    async def set_pinned(
        self, flt: OwnerFilter, memory_id: str, pinned: bool
    ) -> MemoryRecord | None:
        if await self.get(flt, memory_id) is None:
            return None
        self._event(flt.tenant, memory_id, "pinned" if pinned else "unpinned", "", {})
        return self._put(
            self.rows[memory_id], pinned=pinned, updated_at=self.clock(), indexed=False
        )

    async def update_content(
        self,
        flt: OwnerFilter,
        memory_id: str,
        content: str,
        content_hash: str,
        metadata: dict[str, Any] | None,
        redactions: dict[str, int],
    ) -> MemoryRecord | None:
        m = self.rows.get(memory_id)
        if m is None or not matches(flt, m, self.clock()) or m.fact_key is not None:
            return None
        changes: dict[str, Any] = {"content": content, "content_hash": f"{content_hash}@{m.id}"}
        if metadata is not None:
            changes["metadata"] = metadata
        self.redactions[m.id] = dict(redactions)
        self._event(flt.tenant, m.id, "updated", content_hash, {"redactions": redactions})
        return self._put(m, indexed=False, updated_at=self.clock(), **changes)

    async def tombstone(self, flt: OwnerFilter, memory_id: str) -> bool:
        if await self.get(flt, memory_id) is None:
            return False
        now = self.clock()
        self._put(self.rows[memory_id], deleted_at=now, updated_at=now)
        self._queue_delete(flt.tenant, memory_id)
        self._event(flt.tenant, memory_id, "forgotten", "tombstone", {})
        return True

    async def erase(self, flt: OwnerFilter) -> list[str]:
        now = self.clock()
        ids = [m.id for m in self.rows.values() if matches(flt, m, now, False, tombstoned=True)]
        for mid in ids:
            del self.rows[mid]
            self._queue_delete(flt.tenant, mid)
        detail = {"user": flt.user, "agent": flt.agent, "session": flt.session}
        self._event(flt.tenant, None, "erased", now.isoformat(), {**detail, "memories": len(ids)})
        return ids

    async def pending_review(
        self,
        tenant: str,
        since: dict[str, datetime],
        user: str | None = None,
        agent: str | None = None,
    ) -> dict[str, int]:
        now = self.clock()
        return {
            name: sum(
                1
                for m in self.rows.values()
                if m.tenant == tenant
                and m.deleted_at is None
                and (m.expires_at is None or m.expires_at > now)
                and m.created_at >= ts
                and (m.user is None or (m.user == user and m.agent == agent))
                and (m.agent is not None if name == "*" else m.agent == name)
            )
            for name, ts in since.items()
        }

    # --- Facts ------------------------------------------------------------------------------

    async def current_fact(self, flt: OwnerFilter, key: str) -> MemoryRecord | None:
        now = self.clock()
        found = [m for m in self.rows.values() if m.fact_key == key and matches(flt, m, now)]
        found.sort(key=lambda m: (m.valid_from is not None, m.valid_from or now), reverse=True)
        return found[0] if found else None

    async def put_fact(
        self,
        memory_id: str,
        content_hash: str,
        c: Candidate,
        key: str,
        valid_from: datetime,
        supersedes: str | None = None,
    ) -> tuple[MemoryRecord | None, str]:
        owner = OwnerFilter(tenant=c.owner.tenant, user=c.owner.user, agent=c.owner.agent)
        now = self.clock()
        old = next(
            (
                m
                for m in self.rows.values()
                if m.fact_key == key
                and m.id != memory_id
                and m.superseded_by is None
                and m.valid_to is None
                and matches(owner, m, now, live_only=False)
            ),
            None,
        )
        if old is not None and old.content_hash == content_hash:
            return None, old.id
        if supersedes is not None and (old is None or old.id != supersedes):
            raise NotFound("that fact version is not the current one")
        if memory_id not in self.rows:
            record = self._new(memory_id, content_hash, c, now)
            self._put(
                record,
                type=MemoryType.FACT,
                fact_key=key,
                valid_from=valid_from,
                importance=c.importance,
                confidence=1.0,
                app=None,
                salience=0.5,
                pinned=False,
                expires_at=c.expires_at,
                tags=[],
            )
        if old is not None:
            self._put(old, valid_to=valid_from, superseded_by=memory_id, updated_at=now)
            self._queue_delete(c.owner.tenant, old.id)
            by = {"by": memory_id, "fact_key": key}
            self._event(c.owner.tenant, old.id, "superseded", memory_id, by)
        put = {"fact_key": key, "supersedes": old.id if old else None}
        self._event(c.owner.tenant, memory_id, "fact_put", c.source_event_id, put)
        return old, memory_id

    async def fact_history(self, flt: OwnerFilter, key: str) -> list[MemoryRecord]:
        now = self.clock()
        found = [
            m
            for m in self.rows.values()
            if m.fact_key == key and matches(flt, m, now, live_only=False)
        ]
        found.sort(key=lambda m: (m.valid_from is not None, m.valid_from or now, m.created_at))
        return found

    # --- SessionSwitches --------------------------------------------------------------------

    async def set_memory_off(self, tenant: str, owner_key: str, session: str, off: bool) -> None:
        if off:
            self.switches.add((tenant, owner_key, session))
        else:
            self.switches.discard((tenant, owner_key, session))

    async def is_memory_off(self, tenant: str, owner_key: str, session: str) -> bool:
        return (tenant, owner_key, session) in self.switches

    async def memory_off_among(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> set[tuple[str, str, str]]:
        return {(t, o, s) for t, o, s in keys if (t, o, s) in self.switches}

    # --- Maintenance ------------------------------------------------------------------------

    async def unindexed(
        self, limit: int = 256, written_by: datetime | None = None
    ) -> list[MemoryRecord]:
        found = [
            m
            for m in self.rows.values()
            if not m.indexed
            and m.deleted_at is None
            and (written_by is None or m.updated_at <= written_by)
        ]
        return sorted(found, key=lambda m: m.created_at)[:limit]

    async def purge_expired(
        self, limit: int = 1000
    ) -> list[tuple[str, str, str | None, str | None]]:
        now = self.clock()
        gone = [
            m
            for m in self.rows.values()
            if m.expires_at is not None and m.expires_at <= now and not m.pinned
        ][:limit]
        for m in gone:
            del self.rows[m.id]
            self._queue_delete(m.tenant, m.id)
            self._event(m.tenant, m.id, "expired", "sweeper", {})
        return [(m.tenant, m.id, m.user, m.agent) for m in gone]

    # --- Keys -------------------------------------------------------------------------------

    async def create_api_key(
        self, tenant: str, name: str = "", user: str | None = None, agent: str | None = None
    ) -> str:
        key = "msk_" + secrets.token_urlsafe(32)
        self.keys[hash_key(key)] = (tenant, user, agent, False)
        return key

    async def identity_of_key(self, key: str) -> tuple[str, str | None, str | None] | None:
        row = self.keys.get(hash_key(key))
        return None if row is None or row[3] else row[:3]

    async def revoke_api_key(self, key: str) -> bool:
        row = self.keys.get(hash_key(key))
        if row is None or row[3]:
            return False
        self.keys[hash_key(key)] = (*row[:3], True)
        return True

    async def tenant_of_key(self, key: str) -> str | None:
        found = await self.identity_of_key(key)
        return found[0] if found else None

    # --- Health -----------------------------------------------------------------------------

    async def ping(self) -> None:
        return None

    async def count(self, tenant: str | None = None) -> int:
        return sum(1 for m in self.rows.values() if tenant is None or m.tenant == tenant)

    async def close(self) -> None:
        self.closed = True

"""The rows of ``storage.memory.MemoryStore``: memories, audit rows and the vector-delete
queue in dicts, with the owner filter applied as storage/pg/sql.py's ``_where`` applies it,
and the stages' writes (``MemoryRows``), the indexer's reads (``IndexRows``), ``Audit`` and
``VectorDeletes``."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from memstream.schemas.memory import Candidate, MemoryRecord, MemoryType
from memstream.storage.pg.sql import Clock, OwnerFilter, _fold_key


def live(m: MemoryRecord, now: datetime) -> bool:
    """Not tombstoned, superseded, expired (pinned never expires) or outside its validity."""
    return (
        m.deleted_at is None
        and m.superseded_by is None
        and (m.expires_at is None or m.pinned or m.expires_at > now)
        and (m.valid_to is None or m.valid_to > now)
        and (m.valid_from is None or m.valid_from <= now)
    )


def live_row(m: MemoryRecord) -> bool:
    """Not tombstoned and not superseded: a memory that should have an index point."""
    return m.deleted_at is None and m.superseded_by is None


def _owned(flt: OwnerFilter, m: MemoryRecord) -> bool:
    """The owner rule of ``OwnerFilter`` (an unset user or agent matches only NULL)."""
    if flt.peer:
        return (
            m.user is None
            and m.agent is not None
            and (flt.agent is None or m.agent == flt.agent)
            and (flt.exclude_agent is None or m.agent != flt.exclude_agent)
        )
    if flt.user is None and flt.agent is None:
        return True
    if m.user == flt.user and m.agent == flt.agent:
        return True
    scope = m.scope.value
    in_project = scope == "project" and flt.project is not None and m.project == flt.project
    return flt.shared and (scope == "global" or in_project)


def matches(
    flt: OwnerFilter,
    m: MemoryRecord,
    now: datetime,
    live_only: bool = True,
    tombstoned: bool = False,
) -> bool:
    """Whether ``flt`` selects ``m`` (``tombstoned``: forgotten memories too, for erasure)."""
    return (
        m.tenant == flt.tenant
        and (tombstoned or m.deleted_at is None)
        and (not live_only or live(m, now))
        and _owned(flt, m)
        and (flt.session is None or m.session == flt.session)
        and (not flt.types or m.type in flt.types)
        and (not flt.scopes or m.scope in flt.scopes)
        and (flt.occurred_from is None or m.occurred_at >= flt.occurred_from)
        and (flt.occurred_to is None or m.occurred_at <= flt.occurred_to)
        and set(flt.tags) <= set(m.tags)
    )


def _place(m: MemoryRecord) -> tuple[datetime, datetime, str]:
    return m.occurred_at, m.created_at, str(uuid.UUID(m.id))


class RowsMixin:
    """Dict-backed rows and the ports that write them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: dict[str, MemoryRecord] = {}
        self.redactions: dict[str, dict[str, int]] = {}  # not part of MemoryRecord
        self.events: dict[str, tuple[str, str | None, str, datetime, dict[str, Any]]] = {}
        self.vector_deletes: dict[tuple[str, str], None] = {}  # (tenant, id), oldest first

    def _put(self, m: MemoryRecord, **changes: Any) -> MemoryRecord:
        self.rows[m.id] = m.model_copy(update=changes)
        return self.rows[m.id]

    def _event(
        self,
        tenant: str,
        memory_id: str | None,
        kind: str,
        cause: str,
        detail: dict[str, Any],
        key: str | None = None,
    ) -> None:
        key = key or f"{kind}:{memory_id or '-'}:{cause}"
        self.events.setdefault(key, (tenant, memory_id, kind, self.clock(), detail))

    def _queue_delete(self, tenant: str, memory_id: str) -> None:
        self.vector_deletes.setdefault((tenant, memory_id), None)

    def _new(self, memory_id: str, content_hash: str, c: Candidate, now: datetime) -> MemoryRecord:
        key = c.metadata.get("fact_key")
        self.redactions[memory_id] = dict(c.redactions)
        record = MemoryRecord(
            id=memory_id,
            tenant=c.owner.tenant,
            user=c.owner.user,
            agent=c.owner.agent,
            app=c.app,
            project=c.project,
            session=c.session,
            type=c.type,
            scope=c.scope,
            content=c.content,
            content_hash=content_hash,
            salience=c.salience,
            confidence=c.confidence,
            importance=c.importance,
            pinned=c.pinned,
            source_event_ids=[c.source_event_id],
            metadata=dict(c.metadata),
            occurred_at=c.occurred_at,
            created_at=now,
            updated_at=now,
            expires_at=c.expires_at,
            fact_key=key if isinstance(key, str) else None,
            tags=list(c.tags),
        )
        self.rows[memory_id] = record
        return record

    # --- MemoryRows -------------------------------------------------------------------------

    async def exists(self, tenant: str, memory_id: str) -> bool:
        m = self.rows.get(memory_id)
        return m is not None and m.tenant == tenant and m.deleted_at is None

    async def existing(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        return {(t, i) for t, i in keys if await self.exists(t, i)}

    async def memories_by_id(self, keys: Sequence[tuple[str, str]]) -> dict[str, MemoryRecord]:
        now = self.clock()
        return {
            i: m
            for t, i in keys
            if (m := self.rows.get(i)) is not None and m.tenant == t and live(m, now)
        }

    async def upsert(self, memory_id: str, content_hash: str, c: Candidate) -> bool:
        return (await self.upsert_many([(memory_id, content_hash, c)]))[0]

    async def upsert_many(self, rows: Sequence[tuple[str, str, Candidate]]) -> list[bool]:
        now, out = self.clock(), []
        for mid, chash, c in rows:
            m = self.rows.get(mid)
            if m is None:
                self._new(mid, chash, c, now)
            elif c.source_event_id not in m.source_event_ids:
                sources = [*m.source_event_ids, c.source_event_id]
                self._put(m, source_event_ids=sources, deleted_at=None, updated_at=now)
                self._put(self.rows[mid], indexed=False)
            detail = {
                "source_event_id": c.source_event_id,
                "type": c.type.value,
                "redactions": c.redactions,
            }
            # a replay by the candidate that created the row (its first source) is that
            # "stored" again, not a merge (as in PgStore)
            kind = (
                "stored" if m is None or m.source_event_ids[:1] == [c.source_event_id] else "merged"
            )
            self._event(c.owner.tenant, mid, kind, c.source_event_id, detail)
            out.append(m is None)
        return out

    async def write_batch(
        self,
        rows: Sequence[tuple[str, str, Candidate]],
        folds: Sequence[tuple[str, str, str, str]] = (),
        then: Sequence[tuple[str, str, str, str]] = (),
    ) -> tuple[list[bool], list[bool], list[bool]]:
        # one transaction in Postgres: here nothing can fail half-way through
        before = await self.merge_many(folds)
        inserted = await self.upsert_many(rows)
        return inserted, before, await self.merge_many(then)

    def _fold(self, tenant: str, memory_id: str, source: str, key: str | None) -> bool:
        m = self.rows.get(memory_id)
        if m is None or m.tenant != tenant or m.deleted_at is not None:
            return False
        sources = m.source_event_ids
        if source not in sources:
            sources = [*sources, source]
        self._put(m, source_event_ids=sources, updated_at=self.clock(), indexed=False)
        detail = {"source_event_id": source, "near_duplicate": True}
        self._event(tenant, memory_id, "merged", source, detail, key)
        return True

    async def merge(
        self, tenant: str, memory_id: str, source_event_id: str, candidate_id: str | None = None
    ) -> bool:
        key = _fold_key(candidate_id) if candidate_id else None
        return self._fold(tenant, memory_id, source_event_id, key)

    async def merge_many(self, merges: Sequence[tuple[str, str, str, str]]) -> list[bool]:
        return [self._fold(tenant, mid, src, _fold_key(cid)) for tenant, mid, src, cid in merges]

    async def folded_into(self, tenant: str, candidate_id: str) -> str | None:
        found = self.events.get(_fold_key(candidate_id))
        return found[1] if found is not None and found[0] == tenant else None

    async def folded_among(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        out = {}
        for tenant, cid in pairs:
            if (mid := await self.folded_into(tenant, cid)) is not None:
                out[(tenant, cid)] = mid
        return out

    # --- IndexRows --------------------------------------------------------------------------

    def _neighbours(self, m: MemoryRecord, turns: int, before: bool) -> list[MemoryRecord]:
        """The ``turns`` episodes nearest ``m`` before (or after) it in its session and owner,
        in session order."""
        same = [
            e
            for e in self.rows.values()
            if e.tenant == m.tenant
            and e.session == m.session
            and e.type is MemoryType.EPISODE
            and (e.user, e.agent) == (m.user, m.agent)
            and e.deleted_at is None
            and (_place(e) < _place(m) if before else _place(e) > _place(m))
        ]
        same.sort(key=_place)
        return same[-turns:] if before else same[:turns]

    async def session_contexts(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> dict[str, list[str]]:
        out = {}
        for m in memories:
            if found := self._neighbours(m, turns, before=True):
                out[str(uuid.UUID(m.id))] = [e.content for e in found]
        return out

    async def session_followers_many(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> list[MemoryRecord]:
        found = {f.id: f for m in memories for f in self._neighbours(m, turns, before=False)}
        return [found[i] for i in sorted(found)]

    async def mark_indexed(
        self, ids: Sequence[str], read: Sequence[datetime | None] | None = None
    ) -> None:
        versions = list(read) if read is not None else [None] * len(ids)
        for i, at in zip(ids, versions, strict=True):
            if i in self.rows:
                m = self.rows[i]
                self._put(m, indexed=at is None or m.updated_at == at or m.indexed)

    # --- VectorDeletes ----------------------------------------------------------------------

    async def pending_vector_deletes(self, limit: int = 1000) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for tenant, mid in list(self.vector_deletes)[:limit]:
            out.setdefault(tenant, []).append(mid)
        return out

    async def vector_deletes_done(self, tenant: str, ids: Sequence[str]) -> None:
        for i in ids:
            self.vector_deletes.pop((tenant, i), None)
            m = self.rows.get(i)
            if m is not None and m.tenant == tenant and m.indexed and live_row(m):
                self._put(m, indexed=False)

    # --- Audit ------------------------------------------------------------------------------

    async def record_event(
        self,
        tenant: str,
        memory_id: str | None,
        kind: str,
        cause: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self._event(tenant, memory_id, kind, cause, detail or {})

    async def events_for(self, tenant: str, memory_id: str | None = None) -> list[dict[str, Any]]:
        return [
            {"memory_id": mid, "kind": kind, "at": at, "detail": detail}
            for t, mid, kind, at, detail in self.events.values()
            if t == tenant and (memory_id is None or mid == memory_id)
        ]

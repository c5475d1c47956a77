"""The verbs on facts that change over time: ``fact_put``, ``fact_update`` and
``fact_history``.

Separate from the other verbs because a fact is versioned, never edited in place: a new value
closes the current version (``valid_to``, ``superseded_by``) and retires its point, and the
history is the chain of versions, read at a point in time. ``CommandService`` takes these verbs
by inheritance, so they answer on ``mem.cmd.<verb>`` like every other verb.
"""

from __future__ import annotations

from datetime import datetime

from memstream.consumers.command_base import CommandBase, owner_filter
from memstream.consumers.stages import _redact_candidate
from memstream.pipeline import dedupe
from memstream.schemas.commands import CommandReply as Reply
from memstream.schemas.commands import FactHistoryRequest, FactPutRequest
from memstream.schemas.errors import NotFound
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import Candidate, MemoryType, Owner


class FactCommands(CommandBase):
    """``fact_put``, ``fact_update`` and ``fact_history``."""

    async def fact_put(self, r: FactPutRequest, must_exist: bool = False) -> Reply:
        """A new version of fact ``key``; the current one is closed (valid_to, superseded_by)."""
        flt = owner_filter(r)
        key = r.key.strip().lower()
        if must_exist and await self.deps.pg.current_fact(flt, key) is None:
            raise NotFound(f"no current fact {key!r}")
        now = self.deps.clock()
        valid_from = r.valid_from or now
        c = Candidate(
            candidate_id=derived_id(
                r.tenant, r.user or "", r.agent or "", key, valid_from.isoformat()
            ),
            owner=Owner(tenant=r.tenant, user=r.user, agent=r.agent),
            session=r.session,
            type=MemoryType.FACT,
            scope=r.scope,
            content=f"{r.key}: {r.value}" if r.labelled else r.value,
            source_event_id=f"fact:{key}:{valid_from.isoformat()}",
            occurred_at=valid_from,
            metadata={"fact_key": key},
            importance=r.importance,
            expires_at=r.expires_at,
        )
        c = _redact_candidate(self.deps, c)
        mid = derived_id(
            r.tenant, r.user or "", r.agent or "", "fact", key, valid_from.isoformat(), c.content
        )
        old, current = await self.deps.pg.put_fact(
            mid, dedupe.key(c).content_hash, c, key, valid_from, supersedes=r.supersedes
        )
        if old is not None:
            await self._delete_points(r.tenant, [old.id])
            await self._emit("superseded", r, old.id, mid, MemoryType.FACT, by=mid)
        if current == mid:  # else the value was current already: a retry, nothing changed
            await self._index(r.tenant, mid)
            await self._emit("stored", r, mid, c.source_event_id, MemoryType.FACT, fact_key=key)
        return Reply(
            memory=await self.deps.pg.get(flt, current),
            detail={"superseded": old.id if old else None},
        )

    async def fact_update(self, r: FactPutRequest) -> Reply:
        return await self.fact_put(r, must_exist=True)

    async def fact_history(self, r: FactHistoryRequest) -> Reply:
        chain = await self.deps.pg.fact_history(owner_filter(r), r.key.strip().lower())
        if r.at is not None:
            at: datetime = r.at
            chain = [
                m
                for m in chain
                if (m.valid_from is None or m.valid_from <= at)
                and (m.valid_to is None or at < m.valid_to)
            ]
        return Reply(memories=chain)

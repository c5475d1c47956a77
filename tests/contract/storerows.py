"""Rows for the record-of-truth contract: candidates with distinct contents, sources and
times."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta
from typing import Any

from memstream.schemas.memory import Candidate, MemoryType, Owner, Scope
from memstream.storage.pgports import Store


class Rows:
    """Candidates with distinct contents, sources and times, and their memory ids."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.n = 0

    def candidate(
        self,
        tenant: str = "t1",
        user: str | None = "u1",
        agent: str | None = None,
        content: str | None = None,
        session: str = "s1",
        type: MemoryType = MemoryType.EPISODE,
        scope: Scope = Scope.USER,
        **more: Any,
    ) -> Candidate:
        self.n += 1
        return Candidate(
            candidate_id=f"c{self.n}",
            owner=Owner(tenant=tenant, user=user, agent=agent),
            session=session,
            type=type,
            scope=scope,
            content=content or f"memory number {self.n}",
            source_event_id=f"e{self.n}",
            occurred_at=self.clock() + timedelta(seconds=self.n),
            **more,
        )

    async def put(self, store: Store, **kw: Any) -> str:
        """Store a fresh candidate; its memory id."""
        c = self.candidate(**kw)
        mid = str(uuid.uuid4())
        assert await store.upsert(mid, chash(c), c) is True
        return mid


def chash(c: Candidate) -> str:
    return hashlib.sha256(c.content.encode()).hexdigest()

"""Lifecycles: when a memory expires, given its scope."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from memstream.schemas.memory import Candidate


def expires_at(c: Candidate, now: datetime, ttl_s: Mapping[str, float]) -> datetime | None:
    """Pinned memories never expire; an explicit expires_at wins; run and session scopes
    get their configured TTL from ``now``; other scopes keep no expiry."""
    if c.pinned:
        return None
    explicit: datetime | None = c.expires_at
    if explicit is not None:
        return explicit
    ttl = ttl_s.get(c.scope.value)
    return now + timedelta(seconds=ttl) if ttl else None

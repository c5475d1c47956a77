"""When a vector index's points expire, per tenant, kept next to the index.

A search must hide points whose ``expires_at`` has passed. On segments the engine has not
indexed yet that condition is checked on every point a search visits, a large share of such a
search's time (docs/benchmarks.md), yet it only matters between a point's expiry and the
sweeper's purge of it (at most ``MEMSTREAM_SWEEP_EVERY_S``). ``Expiries`` answers whether any
stored point of a tenant has expired at a given time, so the adapter adds the condition only
then.

Entries are counted, not set: a write adds the new expiry before the engine write and removes
the old one after it, so in between both count and the answer errs towards checking.
"""

from __future__ import annotations

import heapq
from collections import Counter

__all__ = ["Expiries"]


class Expiries:
    """A min-heap of (expires_at, point id) per tenant with lazy deletion. Not thread-safe:
    the owner serialises writes (reads may interleave with them)."""

    __slots__ = ("_heaps", "_live")

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[float, str]]] = {}
        self._live: Counter[tuple[str, str, float]] = Counter()

    def add(self, tenant: str, point_id: str, at: float) -> None:
        """Count a stored point of ``tenant`` expiring at ``at`` (unix seconds)."""
        key = (tenant, point_id, at)
        if self._live[key] == 0:
            heapq.heappush(self._heaps.setdefault(tenant, []), (at, point_id))
        self._live[key] += 1

    def remove(self, tenant: str, point_id: str, at: float) -> None:
        """Take one count of that point out (overwritten or deleted)."""
        key = (tenant, point_id, at)
        left = self._live.get(key, 0) - 1
        if left > 0:
            self._live[key] = left
        else:
            self._live.pop(key, None)

    def any_expired(self, tenant: str, now: float) -> bool:
        """Whether a counted point of ``tenant`` has ``expires_at <= now``."""
        heap = self._heaps.get(tenant)
        while heap:
            at, point_id = heap[0]
            if self._live.get((tenant, point_id, at), 0) > 0:
                return at <= now
            heapq.heappop(heap)  # removed since it was pushed
        self._heaps.pop(tenant, None)
        return False

    def held(self, tenant: str) -> int:
        """Counted points of ``tenant`` (for tests and diagnostics)."""
        return sum(n for (t, _, _), n in self._live.items() if t == tenant)

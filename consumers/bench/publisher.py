"""The ingest side of ``memstream bench faults``: the publisher, and what it reads of progress.

The publisher retries a failed publish with the same event (same ``Nats-Msg-Id``) until its
PubAck arrives, and stays at most ``ahead`` turns beyond what is stored. Progress is read
from PostgreSQL on a connection of its own, which rides out PostgreSQL's restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from memstream.consumers.bench.conversations import Turn
from memstream.producers.client import MemoryClient, PublishError
from memstream.schemas.events import TurnEvent

EPISODE_EVENTS = """
SELECT count(*) AS refs, count(DISTINCT e) AS events
FROM memories m, unnest(m.source_event_ids) e
WHERE m.type = 'episode' AND m.deleted_at IS NULL"""


@dataclass
class Progress:
    """What the monitor last read from Postgres (kept while Postgres is away)."""

    events: int = 0  # distinct turns with an episode
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    seen_at: float = field(default_factory=time.monotonic)  # when ``events`` last grew
    history: list[tuple[float, int]] = field(default_factory=list)  # (when, events)

    def next_growth(self, after: float) -> float | None:
        """Seconds from ``after`` until ``events`` next grew (None: it did not)."""
        before = max((n for t, n in self.history if t <= after), default=0)
        return next((t - after for t, n in self.history if t > after and n > before), None)


class Probe:
    """Reads Postgres on its own connection; None while Postgres cannot be reached."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.con: Any = None

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def fetch(self, sql: str, *args: Any) -> list[Any] | None:
        try:
            if self.con is None or self.con.is_closed():
                self.con = await asyncpg.connect(self.dsn, timeout=2)
            return list(await self.con.fetch(sql, *args, timeout=10))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            if self.con is not None:
                self.con.terminate()
            self.con = None
            return None

    async def close(self) -> None:
        if self.con is not None:
            await self.con.close()


@dataclass
class Publisher:
    """Publishes every turn until its PubAck arrives, never more than ``ahead`` turns beyond
    what is stored."""

    clients: dict[str, MemoryClient]
    progress: Progress
    ahead: int
    # how many turns may be published by now, if fewer than all (the faults bench's plan)
    limit: Callable[[], int] | None = None
    acked: set[str] = field(default_factory=set)
    retries: int = 0
    duplicate_acks: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    took_s: float = 0.0  # from the first publish to the last PubAck

    async def run(self, events: list[TurnEvent], concurrency: int = 8) -> None:
        queue = iter(events)
        started = time.monotonic()

        async def lane() -> None:
            for event in queue:
                while self.held():
                    self.progress.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.progress.changed.wait(), 1.0)
                await self._publish(event)

        await asyncio.gather(*(lane() for _ in range(concurrency)))
        self.took_s = time.monotonic() - started

    def held(self) -> bool:
        """Whether the next publish waits: ``ahead`` turns beyond what is stored, or as
        many as ``limit`` allows now."""
        published = len(self.acked)
        if published - self.progress.events >= self.ahead:
            return True
        return self.limit is not None and published >= self.limit()

    async def _publish(self, event: TurnEvent) -> None:
        pause = 0.2
        while True:
            try:
                result = await self.clients[event.tenant].publish(event)
            except PublishError as exc:  # NATS away: the same event (and Nats-Msg-Id) again
                self.retries += 1
                self.errors[type(exc.__cause__).__name__] += 1
                await asyncio.sleep(random.uniform(pause / 2, pause))  # jitter, not a secret
                pause = min(pause * 2, 2.0)
                continue
            self.duplicate_acks += result.duplicate
            self.acked.add(event.event_id)
            return


def events(clients: dict[str, MemoryClient], plan: list[Turn]) -> list[TurnEvent]:
    return [clients[t.tenant].make_turn(t.messages, user=t.user, session=t.session) for t in plan]


async def monitor(probe: Probe, progress: Progress, stop: asyncio.Event) -> None:
    while not stop.is_set():
        row = await probe.fetchrow(EPISODE_EVENTS)
        if row is not None and row["events"] != progress.events:
            progress.events = int(row["events"])
            progress.seen_at = time.monotonic()
            progress.history.append((progress.seen_at, progress.events))
            progress.changed.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)

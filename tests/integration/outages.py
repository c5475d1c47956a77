"""Helpers for the outage tests: a wait that rides out a server coming back, the turns they
publish, the conditions they wait for, and dropping a test's streams."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import nats

from memstream.consumers.topology import topology
from memstream.schemas.settings import Settings
from memstream.storage.postgres import OwnerFilter, PgStore


async def _until(predicate: Callable[[], Awaitable[bool]], seconds: float, what: str) -> float:
    """Wait for ``predicate``; returns the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        with contextlib.suppress(Exception):  # a server may still be coming back
            if await predicate():
                return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")


FACTS = [
    "My sister Ana lives in Lisbon and teaches chemistry",
    "The spare car key hangs on the hook behind the pantry door",
    "I am allergic to penicillin since childhood",
    "Our wifi router restarts itself every Sunday at three",
    "The dentist appointment moved to the second of March",
    "Grandma's lemon cake needs two spoons of poppy seeds",
    "My bicycle has a flat rear tyre that needs patching",
    "The quarterly tax filing is due before the fifteenth",
    "Buster the beagle eats grain free salmon kibble",
    "The blue folder with warranties sits in the attic trunk",
]


def _turn(i: int) -> list[tuple[str, str]]:
    return [("user", FACTS[i % len(FACTS)])]


async def _count(pg: PgStore, flt: OwnerFilter, n: int) -> bool:
    return len(await pg.list_memories(flt)) >= n


async def _all_indexed(pg: PgStore, flt: OwnerFilter) -> bool:
    rows = await pg.list_memories(flt)
    return bool(rows) and all(m.indexed for m in rows)


async def _drop_streams(nats_url: str, settings: Settings) -> None:
    nc = await nats.connect(nats_url)
    for s in topology(settings).streams:
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(s.name or "")
    await nc.close()

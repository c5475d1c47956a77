"""Servers that go away and come back: what the worker's parts see, and that they recover.
These tests start (and kill) their own servers: never the machine's."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from memstream.consumers.embedded import EmbeddedPostgres
from memstream.schemas.errors import StorageUnavailable
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres.start(tmp_path / "pg")
    yield server
    server.stop()


@pytest.fixture
async def store(own_postgres: EmbeddedPostgres) -> AsyncIterator[PgStore]:
    s = await PgStore.connect(own_postgres.dsn, schema="outage", min_size=8, max_size=8)
    yield s
    await s.close()


async def _progress(count: Callable[[], int], more: int, seconds: float) -> None:
    """Wait until ``count()`` grew by ``more`` (or ``seconds`` passed)."""
    target = count() + more
    for _ in range(int(seconds / 0.02)):
        if count() >= target:
            return
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["fast", "kill"])
async def test_postgres_restart_surfaces_only_storage_unavailable(
    own_postgres: EmbeddedPostgres, store: PgStore, mode: str
) -> None:
    """While Postgres is stopped (operator's fast stop, or SIGKILL of every process) and
    started again under load, every store call either succeeds or raises StorageUnavailable
    (never AdminShutdownError, a refused connection or asyncpg's 'another operation is in
    progress'), and the store works again once the server is back."""
    seen: Counter[str] = Counter()
    ok = 0
    stop = asyncio.Event()

    async def load(i: int) -> None:
        nonlocal ok
        flt = OwnerFilter(tenant="t", user=f"u{i}")
        while not stop.is_set():
            try:
                if i % 3 == 0:
                    await store.count("t")  # pool.fetch
                elif i % 3 == 1:
                    await store.tombstone(flt, "00000000-0000-0000-0000-000000000001")  # tx
                else:
                    await store.record_event("t", None, "probe", f"{i}:{time.monotonic()}")
                ok += 1
            except Exception as exc:  # noqa: BLE001 - the test counts what leaks
                seen[type(exc).__name__] += 1
            await asyncio.sleep(0.002)

    tasks = [asyncio.create_task(load(i)) for i in range(24)]
    try:
        for _ in range(2):
            await _progress(lambda: ok, 200, 10)
            await asyncio.to_thread(own_postgres.halt, mode)
            await asyncio.sleep(0.5)  # down for a moment, as a crashed server is
            await asyncio.to_thread(own_postgres.resume)
        before = ok
        await _progress(lambda: ok, 200, 20)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert set(seen) <= {StorageUnavailable.__name__}, seen
    assert seen, "the restarts were not noticed: the test did not exercise an outage"
    assert await store.count("t") >= 0  # answers again
    assert ok >= before + 200, "the store did not recover after the restart"

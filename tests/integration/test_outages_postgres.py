"""PostgreSQL going away and coming back: the store surfaces only StorageUnavailable and
recovers, a worker stops soon while it is away and loses nothing, and a turn published during
the outage is retried in place (no redelivery, no dead letter) on every stage path. These tests
start (and kill) their own PostgreSQL: never the machine's."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from outages import _count, _drop_streams, _turn, _until
from workers import start_worker

from memstream.consumers.embedded import EmbeddedPostgres
from memstream.consumers.topology import topology
from memstream.producers.client import MemoryClient
from memstream.schemas.errors import StorageUnavailable
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import Subjects
from memstream.storage.ports import Embedder
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


async def test_a_worker_stops_soon_while_postgres_is_away(
    own_postgres: EmbeddedPostgres,
    store: PgStore,
    nats_url: str,
    tmp_path: Path,
    embedder: Embedder,
) -> None:
    """Stopping a worker whose stages hold a batch through a PostgreSQL outage: the batch is
    given the pull loops' grace (10 s) and no more, and the connection closes at once
    (the messages a fetch had delivered do not hold up its drain). Nothing is lost: a new
    worker, once the server is back, stores every turn, the held ones delivered again (each
    turn's event is in its memory's sources: near-duplicate turns fold)."""
    settings = Settings(
        nats_url=nats_url,
        namespace="pgaway",
        state_dir=tmp_path / "state",
    )
    worker = await start_worker(settings, store, embedder)
    flt = OwnerFilter(tenant="acme")
    stopped = False
    try:
        async with MemoryClient("acme", user="lee", nats_url=nats_url, namespace="pgaway") as mem:
            for i in range(20):  # under way as the server goes
                await mem.publish_turn([("user", f"I like green tea number {i}")], event_id=f"t{i}")
            await asyncio.sleep(1.0)
            await asyncio.to_thread(own_postgres.halt, "kill")
            for i in range(20, 40):
                await mem.publish_turn([("user", f"I like green tea number {i}")], event_id=f"t{i}")
            await asyncio.sleep(2.0)  # their batches held, the next fetches under way
        started = time.monotonic()
        await asyncio.wait_for(worker.stop(), 60)
        stopped = True
        took = time.monotonic() - started
        assert took < 15, f"the stop took {took:.1f} s"
    finally:
        if not stopped:
            await worker.stop()
        await worker.services.vectors.close()  # the shard, for the next worker
        await asyncio.to_thread(own_postgres.resume)
    worker = await start_worker(settings, store, embedder)
    try:
        every = {f"t{i}" for i in range(40)}
        await _until(lambda: _events_stored(store, flt, every), 60, "every turn, after the restart")
    finally:
        await worker.stop()


async def _events_stored(store: PgStore, flt: OwnerFilter, events: set[str]) -> bool:
    stored = {e for m in await store.list_memories(flt, limit=1000) for e in m.source_event_ids}
    return events <= stored


@pytest.mark.parametrize(
    ("batched", "fused"),
    [(True, True), (True, False), (False, False)],
    ids=["fused", "batched", "single"],
)
async def test_postgres_outage_is_retried_in_place_without_using_deliveries(
    own_postgres: EmbeddedPostgres,
    nats_url: str,
    namespace: str,
    tmp_path: Path,
    embedder: Embedder,
    batched: bool,
    fused: bool,
) -> None:
    """A turn published while Postgres is down is stored within seconds of its return, with
    no redelivery and no dead letter, though the retry schedule for other errors starts at
    60 s and max_deliver is 2, on every stage path."""
    store = await PgStore.connect(own_postgres.dsn, schema="outage")
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path / "state",
        stage=StageSettings(
            max_deliver=2, ack_wait_s=5, retry_delays_s=[60.0], batched=batched, fused=fused
        ),
    )
    worker = await start_worker(settings, store, embedder)
    try:
        await asyncio.to_thread(own_postgres.halt, "kill")
        async with MemoryClient("acme", user="mo", nats_url=nats_url, namespace=namespace) as mem:
            await mem.publish_turn(_turn(1))
            await asyncio.sleep(8)  # longer than ack_wait: holding must renew it
            await asyncio.to_thread(own_postgres.resume)
            flt = OwnerFilter(tenant="acme", user="mo")
            took = await _until(lambda: _count(store, flt, 1), 30, "the turn")
            assert took < 10, f"stored {took:.0f} s after Postgres came back"
        js = worker.deps.js
        for stage, (stream, cfg) in topology(settings).consumers.items():
            info = await js.consumer_info(stream, cfg.durable_name or "")
            assert info.num_redelivered == 0, stage
        assert (await js.stream_info(Subjects(namespace).stream("dlq"))).state.messages == 0
        assert worker.deps.metrics["extract"].held > 0
    finally:
        await worker.stop()
        await store.close()
        await _drop_streams(nats_url, settings)

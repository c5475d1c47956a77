"""Servers that go away and come back: what the worker's parts see, and that they recover.
These tests start (and kill) their own servers: never the machine's."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest
from workers import start_worker

from memstream.consumers.app import Worker
from memstream.consumers.batch_store import dedupe_batch, store_batch
from memstream.consumers.embedded import EmbeddedNats, EmbeddedPostgres
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.consumers.stages import _redact_candidate, dedupe_work, store_work
from memstream.consumers.topology import topology
from memstream.pipeline import dedupe
from memstream.pipeline.extract import extract
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient
from memstream.schemas.errors import StorageUnavailable
from memstream.schemas.memory import MemoryType
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


# --- a worker on servers of its own ----------------------------------------------------------


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats.start(tmp_path / "nats")
    yield server
    server.stop()


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


async def test_nats_restart_does_not_wedge_ingest(
    own_nats: EmbeddedNats, pg: PgStore, tmp_path: Path, embedder: Embedder
) -> None:
    """nats-server SIGKILLed and restarted mid-run (the memory-backed recall-cache bucket is
    lost with it): the same worker, not restarted, stores the turns published afterwards
    within seconds, the bucket exists again, and recall answers from a fresh cache."""
    settings = Settings(
        nats_url=own_nats.url,
        namespace="mem",
        state_dir=tmp_path / "state",
        stage=StageSettings(max_deliver=3, ack_wait_s=10),
    )
    worker = await start_worker(settings, pg, embedder)
    flt = OwnerFilter(tenant="acme")
    try:
        async with MemoryClient("acme", user="lee", nats_url=own_nats.url) as mem:
            for i in range(5):
                await mem.publish_turn(_turn(i))
            await _until(lambda: _count(pg, flt, 5), 30, "the first turns")
            await mem.recall("where is the spare car key?")  # an entry in the cache bucket
        await asyncio.to_thread(own_nats.halt)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(own_nats.resume)
        async with MemoryClient("acme", user="lee", nats_url=own_nats.url) as mem:
            for i in range(5, 10):
                await mem.publish_turn(_turn(i))
            took = await _until(lambda: _count(pg, flt, 10), 60, "the turns after the restart")
            assert took < 30, f"ingest stalled {took:.0f} s after the restart"
            # the row is committed just before its index write: recall reads the index
            await _until(lambda: _all_indexed(pg, flt), 10, "the last turn's index write")
            reply = await mem.recall("where are the warranties?")
            assert not reply.cached and any("attic trunk" in h.text for h in reply.hits)
        nc = await nats.connect(own_nats.url)
        try:
            await nc.jetstream().stream_info(f"KV_{Subjects('mem').stream('recall_cache')}")
        finally:
            await nc.close()
    finally:
        await worker.stop()


async def test_a_worker_stops_while_nats_is_away(
    own_nats: EmbeddedNats, pg: PgStore, tmp_path: Path, embedder: Embedder
) -> None:
    """Stopping a worker (SIGTERM, a deploy) while nats-server is down: its connections are
    reconnecting, so nothing can be drained; the worker closes them and stops within a few
    seconds, without an error. What it had pulled and not acked is the server's to deliver
    again."""
    settings = Settings(nats_url=own_nats.url, namespace="mem", state_dir=tmp_path / "state")
    worker = await start_worker(settings, pg, embedder)
    async with MemoryClient("acme", user="lee", nats_url=own_nats.url) as mem:
        await mem.publish_turn(_turn(0))
    await _until(lambda: _count(pg, OwnerFilter(tenant="acme"), 1), 30, "the first turn")
    await asyncio.to_thread(own_nats.halt)
    try:
        await _until(
            lambda: _reconnecting(worker), 10, "the worker's connections to notice the outage"
        )
        started = time.monotonic()
        await asyncio.wait_for(worker.stop(), 20)
        assert time.monotonic() - started < 10
    finally:
        await asyncio.to_thread(own_nats.resume)


async def test_an_agent_leaves_its_client_while_nats_is_away(own_nats: EmbeddedNats) -> None:
    """An agent's ``async with MemoryClient(...)`` block that ends while nats-server is down
    ends without an error (the connection is closed, not drained) and at once: the agent's
    turn never waits for NATS to come back."""
    mem = await MemoryClient("acme", user="lee", nats_url=own_nats.url).connect()
    await asyncio.to_thread(own_nats.halt)
    try:
        nc = mem._nc
        assert nc is not None
        await _until(lambda: _true(nc.is_reconnecting), 10, "the client to notice the outage")
        started = time.monotonic()
        await asyncio.wait_for(mem.__aexit__(None, None, None), 20)
        assert time.monotonic() - started < 2 and nc.is_closed
    finally:
        await asyncio.to_thread(own_nats.resume)


async def _true(value: bool) -> bool:
    return value


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


async def _reconnecting(worker: Worker) -> bool:
    conns = [worker.broker._connection, worker._nc]
    return all(c is not None and c.is_reconnecting for c in conns)


async def _count(pg: PgStore, flt: OwnerFilter, n: int) -> bool:
    return len(await pg.list_memories(flt)) >= n


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


async def _drop_streams(nats_url: str, settings: Settings) -> None:
    nc = await nats.connect(nats_url)
    for s in topology(settings).streams:
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(s.name or "")
    await nc.close()


async def test_memories_kept_unindexed_are_indexed_soon_after_the_index_returns(
    pg: PgStore, nats_url: str, namespace: str, tmp_path: Path, embedder: Embedder
) -> None:
    """Memories stored while the vector index was away are indexed within seconds of its
    return, though the maintenance interval (sweep_every_s) is 30 s."""
    flag = tmp_path / "index-offline"
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path / "state",
        sweep_every_s=30.0,
        fault_vector_offline_file=flag,
    )
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    worker = Worker(Services(settings, pg, vectors, embedder, Redactor(key=b"k")), nats_url)
    await worker.start()
    flt = OwnerFilter(tenant="acme", user="kim")
    try:
        flag.touch()
        async with MemoryClient("acme", user="kim", nats_url=nats_url, namespace=namespace) as mem:
            for i in range(3):
                await mem.publish_turn(_turn(i))
            await _until(lambda: _count(pg, flt, 3), 30, "the turns, stored unindexed")
        assert not any(m.indexed for m in await pg.list_memories(flt))
        flag.unlink()
        took = await _until(lambda: _all_indexed(pg, flt), 20, "the memories to be indexed")
        assert took < 10, f"indexed {took:.0f} s after the index came back"
        assert await vectors.count("acme") == len(await pg.list_memories(flt))
    finally:
        await worker.stop()
        await vectors.close()
        await _drop_streams(nats_url, settings)


async def _all_indexed(pg: PgStore, flt: OwnerFilter) -> bool:
    rows = await pg.list_memories(flt)
    return bool(rows) and all(m.indexed for m in rows)


NEAR = (
    "I keep the spare house key under the blue flower pot by the door",
    "I keep the spare house key under the blue flower pot near the door",
)


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
async def test_a_redelivered_near_duplicate_is_not_stored_twice(
    pg: PgStore,
    nats_url: str,
    namespace: str,
    tmp_path: Path,
    embedder: Embedder,
    batched: bool,
) -> None:
    """A candidate folded into a near duplicate and delivered again while the index is away
    (so no near-duplicate check can run) is not stored as a memory of its own, neither by the
    dedupe stage nor by a store message that an earlier try had sent; nor merged into an exact
    duplicate of its text that another turn stored since; on either stage path."""
    flag = tmp_path / "index-offline"
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path / "state",
        fault_vector_offline_file=flag,
        stage=StageSettings(batched=batched),
    )
    worker = await start_worker(settings, pg, embedder)
    flt = OwnerFilter(tenant="acme", user="ola")
    try:
        async with MemoryClient("acme", user="ola", nats_url=nats_url, namespace=namespace) as mem:
            await mem.publish_turn([("user", NEAR[0])])
            await _until(lambda: _all_indexed(pg, flt), 30, "the first turn, indexed")
            second = mem.make_turn([("user", NEAR[1])])
            await mem.publish(second)
            await _until(lambda: _episodes_of(pg, flt, second.event_id, 1), 30, "the fold")
        (folded,) = [
            m for m in await pg.list_memories(flt) if second.event_id in m.source_event_ids
        ]
        assert NEAR[0] in folded.content  # folded into the first turn's episode
        episode = next(c for c in extract(second) if c.type is MemoryType.EPISODE)
        redacted = _redact_candidate(worker.deps, episode)
        body = redacted.model_dump_json().encode()
        subjects = worker.deps.subjects
        flag.touch()  # the index is away on the next try
        if batched:
            assert await dedupe_batch(worker.deps, [redacted]) == 0
            assert await store_batch(worker.deps, [redacted]) == 0
        else:
            assert await dedupe_work(worker.deps, body, subjects.stage("dedupe", "acme")) == 0
            assert await store_work(worker.deps, body, subjects.stage("store", "acme")) == 0
        flag.unlink()
        assert await _episodes_of(pg, flt, second.event_id, 1)
        assert sum(m.type is MemoryType.EPISODE for m in await pg.list_memories(flt)) == 1
        # another turn with the same text stored since, as its own memory: the fold stands
        twin = redacted.model_copy(update={"candidate_id": "twin", "source_event_id": "ev-twin"})
        keyed = dedupe.key(twin)
        await pg.upsert(keyed.memory_id, keyed.content_hash, twin)
        if batched:
            assert await dedupe_batch(worker.deps, [redacted]) == 0
        else:
            assert await dedupe_work(worker.deps, body, subjects.stage("dedupe", "acme")) == 0
        assert await _episodes_of(pg, flt, second.event_id, 1)
        (kept,) = [m for m in await pg.list_memories(flt) if "ev-twin" in m.source_event_ids]
        assert second.event_id not in kept.source_event_ids
    finally:
        await worker.stop()
        await _drop_streams(nats_url, settings)


async def _episodes_of(pg: PgStore, flt: OwnerFilter, event_id: str, n: int) -> bool:
    """Exactly ``n`` episodes hold ``event_id`` among their source events."""
    rows = await pg.list_memories(flt)
    return sum(m.type is MemoryType.EPISODE and event_id in m.source_event_ids for m in rows) == n


async def test_a_worker_indexes_what_an_earlier_process_left_unindexed(
    pg: PgStore, nats_url: str, namespace: str, tmp_path: Path, embedder: Embedder
) -> None:
    """A memory an earlier process stored unindexed (it died during an index outage) is
    indexed within seconds of the next worker's start, not at its first 30 s interval."""
    from datetime import UTC, datetime

    from memstream.pipeline import dedupe
    from memstream.schemas.memory import Candidate, Owner

    c = Candidate(
        candidate_id="left-1",
        owner=Owner(tenant="acme", user="rui"),
        session="s",
        content="the boat keys hang in the shed",
        source_event_id="e-left-1",
        occurred_at=datetime.now(UTC),
        redacted=True,
    )
    keyed = dedupe.key(c)
    await pg.upsert(keyed.memory_id, keyed.content_hash, c)
    flt = OwnerFilter(tenant="acme", user="rui")
    assert not (await pg.list_memories(flt))[0].indexed
    settings = Settings(
        nats_url=nats_url, namespace=namespace, state_dir=tmp_path / "state", sweep_every_s=30.0
    )
    worker = await start_worker(settings, pg, embedder)
    try:
        took = await _until(lambda: _all_indexed(pg, flt), 20, "the memory to be indexed")
        assert took < 10, f"indexed {took:.0f} s after the start"
        assert await worker.vectors.count("acme") == 1
    finally:
        await worker.stop()
        await _drop_streams(nats_url, settings)

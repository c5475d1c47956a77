"""nats-server going away and coming back: ingest does not wedge after a restart, and a worker
or an agent's client that stops while it is away stops soon, without an error. These tests
start (and kill) their own nats-server: never the machine's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from outages import _all_indexed, _count, _turn, _until
from workers import start_worker

from memstream.consumers.app import Worker
from memstream.consumers.embedded import EmbeddedNats
from memstream.producers.client import MemoryClient
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import Subjects
from memstream.storage.ports import Embedder
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats.start(tmp_path / "nats")
    yield server
    server.stop()


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


async def test_a_turn_published_while_nats_is_away_is_stored_once_it_is_back(
    own_nats: EmbeddedNats, pg: PgStore, tmp_path: Path, embedder: Embedder
) -> None:
    """An agent's background publish (``wait=False``) while nats-server is down for longer
    than three tries: the client keeps trying (``retry_for_s``), and the turn is stored
    once, soon after the server is back (before, it was given up after three tries and
    lost, seed 001 asking to queue and retry)."""
    settings = Settings(nats_url=own_nats.url, namespace="mem", state_dir=tmp_path / "state")
    worker = await start_worker(settings, pg, embedder)
    flt = OwnerFilter(tenant="acme")
    outcomes: list[tuple[object, object]] = []
    try:
        async with MemoryClient(
            "acme", user="lee", nats_url=own_nats.url, publish_timeout=0.5
        ) as mem:
            await mem.publish_turn(_turn(0))
            await _until(lambda: _episodes(pg, flt, 1), 30, "the first turn")
            await asyncio.to_thread(own_nats.halt)
            try:
                await mem.publish_turn(
                    _turn(1), wait=False, on_done=lambda r, e: outcomes.append((r, e))
                )
                await asyncio.sleep(5)  # three tries of 0.5 s and their pauses took ~3 s
                assert outcomes == []  # still trying
            finally:
                await asyncio.to_thread(own_nats.resume)
            await _until(lambda: _episodes(pg, flt, 2), 30, "the turn published while away")
            await _until(lambda: _true(bool(outcomes)), 10, "the publish's outcome")
        ((result, error),) = outcomes
        assert error is None and result is not None
        await asyncio.sleep(1)  # a second copy, had a try been stored twice, would be in by now
        rows = await pg.list_memories(flt, limit=50)
        assert len([m for m in rows if m.type.value == "episode"]) == 2
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


async def _episodes(pg: PgStore, flt: OwnerFilter, n: int) -> bool:
    rows = await pg.list_memories(flt, limit=50)
    return len([m for m in rows if m.type.value == "episode"]) >= n


async def _true(value: bool) -> bool:
    return value


async def _reconnecting(worker: Worker) -> bool:
    conns = [worker.broker._connection, worker._nc]
    return all(c is not None and c.is_reconnecting for c in conns)

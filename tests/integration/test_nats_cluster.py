"""A 3-node NATS cluster (three nats-server processes from the wheel on loopback, routes
between them, JetStream on each), streams at R3: one node SIGKILLed mid-ingest loses nothing
and duplicates nothing. The test starts its own servers, never the machine's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import nats
import pytest

from memstream.consumers.app import Worker
from memstream.consumers.embedded import EmbeddedNats, free_port
from memstream.consumers.run import make_vector_index
from memstream.consumers.topology import drained, topology
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient, PublishError
from memstream.schemas.events import TurnEvent
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import Subjects
from memstream.storage.ports import Embedder
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration

TURNS = 240


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[EmbeddedNats]]:
    """Three JetStream nodes routed to each other, as deploy/nats/nats.conf runs them."""
    ports = [free_port() for _ in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    nodes: list[EmbeddedNats] = []
    try:
        for i, port in enumerate(ports):
            extra = ["--name", f"n{i + 1}", "--cluster_name", "memstream"]
            extra += ["--cluster", f"nats://127.0.0.1:{port}", "--routes", routes]
            nodes.append(EmbeddedNats.start(tmp_path / f"n{i + 1}", extra))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _meta_ready(node: EmbeddedNats) -> bool:
    """The JetStream meta group has a leader and three peers (the monitor's /jsz)."""
    with urllib.request.urlopen(f"{node.monitor_url}/jsz", timeout=2) as r:
        meta = json.loads(r.read()).get("meta_cluster") or {}
    return bool(meta.get("leader")) and meta.get("cluster_size") == 3


async def _until(check: Callable[[], Awaitable[bool]], seconds: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        with contextlib.suppress(Exception):  # a node may be electing or gone
            if await check():
                return time.monotonic() - started
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")


async def _publish(mem: MemoryClient, event: TurnEvent) -> int:
    """Publish until a PubAck arrives, always with the same event id (and so Nats-Msg-Id);
    returns the retries it took."""
    for retries in range(200):
        try:
            await mem.publish(event)
            return retries
        except PublishError:
            await asyncio.sleep(0.2)
    raise AssertionError(f"turn {event.event_id} was never acked")


async def _episodes(pg: PgStore) -> tuple[int, int]:
    """(episode rows per source turn, summed; distinct source turns) of this schema."""
    rows = await pg._fetch(
        "SELECT count(*) AS refs, count(DISTINCT e) AS events "
        "FROM memories m, unnest(m.source_event_ids) e WHERE m.type = 'episode'"
    )
    return int(rows[0]["refs"]), int(rows[0]["events"])


async def test_r3_streams_survive_a_killed_node(
    cluster: list[EmbeddedNats], pg: PgStore, tmp_path: Path, embedder: Embedder
) -> None:
    """With the streams at R3, SIGKILLing the node that leads the stage stream mid-ingest
    loses no turn and stores none twice: every acked turn has exactly one episode, nothing is
    dead-lettered, and the index holds what Postgres holds."""
    await _until(lambda: asyncio.to_thread(_meta_ready, cluster[0]), 30, "a JetStream leader")
    urls = ",".join(node.url for node in cluster)
    settings = Settings(
        nats_url=urls,
        namespace="mem",
        state_dir=tmp_path / "state",
        stream_replicas=3,
        stage=StageSettings(ack_wait_s=10),
    )
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    await _until(lambda: _places_r3(urls), 60, "the cluster to place R3 streams")
    worker = Worker(settings, urls, pg, vectors, embedder, Redactor(key=b"k"))
    await worker.start()
    s = Subjects("mem")
    killed: EmbeddedNats | None = None
    try:
        js = worker.deps.js
        for cfg in topology(settings).streams:
            info = await js.stream_info(cfg.name or "")
            assert info.config.num_replicas == 3 and info.cluster is not None
            assert len(info.cluster.replicas or []) == 2, cfg.name  # two followers
        async with MemoryClient("acme", user="ana", nats_url=urls, publish_timeout=2.0) as mem:
            events = [
                mem.make_turn([("user", f"Note {i}: the parcel {i * 7} goes to desk {i % 9}")])
                for i in range(TURNS)
            ]
            retries = 0
            for event in events[: TURNS // 3]:
                retries += await _publish(mem, event)
            await _until(lambda: _stored_at_least(pg, TURNS // 6), 60, "ingest to be under way")
            leader = (await js.stream_info(s.stream("stages"))).cluster
            assert leader is not None and leader.leader
            killed = cluster[int(leader.leader.removeprefix("n")) - 1]
            await asyncio.to_thread(killed.halt)
            for event in events[TURNS // 3 :]:
                retries += await _publish(mem, event)
        await _until(lambda: _stored_at_least(pg, TURNS), 120, "every turn to be stored")
        await _until(lambda: drained(js, settings), 60, "the stages to drain")
        refs, distinct = await _episodes(pg)
        assert distinct == TURNS and refs == TURNS, (refs, distinct)
        stored = {
            e
            for m in await pg.list_memories(OwnerFilter(tenant="acme"), limit=10_000)
            for e in m.source_event_ids
        }
        assert {e.event_id for e in events} <= stored
        dlq = await js.stream_info(s.stream("dlq"))
        assert dlq.state.messages == 0
        await _until(lambda: _all_indexed(pg), 60, "every memory to be indexed")
        assert await vectors.count() == await pg.count()
    finally:
        await worker.stop()
        await vectors.close()
        if killed is not None:
            await asyncio.to_thread(killed.resume)  # the fixture stops every node


async def _places_r3(urls: str) -> bool:
    """An R3 stream can be created (and is deleted again): the cluster is formed."""
    nc = await nats.connect(urls.split(","))
    try:
        js = nc.jetstream()
        await js.add_stream(name="PROBE", subjects=["probe.r3"], num_replicas=3)
        await js.delete_stream("PROBE")
        return True
    finally:
        await nc.close()


async def _stored_at_least(pg: PgStore, n: int) -> bool:
    return (await _episodes(pg))[1] >= n


async def _all_indexed(pg: PgStore) -> bool:
    return not await pg.unindexed(1)

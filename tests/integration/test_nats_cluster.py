"""A 3-node NATS cluster as deploy/nats/nats.conf runs it (three nats-server processes from
the wheel on loopback, each loading the shipped file in operator mode, routes between them,
JetStream on each), streams at R3: one node SIGKILLed mid-ingest loses nothing and
duplicates nothing. The test starts its own servers, never the machine's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from memstream.consumers import creds
from memstream.consumers.app import Worker
from memstream.consumers.cache import RecallCache
from memstream.consumers.embedded import free_ports, nats_server_binary, wait_for_port
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
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
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats.conf"
NS = "mem"


@pytest.fixture
def authority(tmp_path: Path) -> Path:
    """`memstream creds init`: the operator, accounts, auth.conf and worker.creds."""
    creds.init(tmp_path / "authority", NS)
    return tmp_path / "authority"


class Node:
    """One nats-server on the shipped nats.conf: the store directory (from /data) and the
    cluster port (from 6222, on loopback) are rewritten; the route authorization is the
    file's (its routes.conf). Name, client ports and routes come from the command line, as
    compose gives them. The cluster port is not given as ``--cluster``: that flag replaces
    the file's route authorization with its URL's user and password."""

    def __init__(self, home: Path, name: str, ports: tuple[int, int, int], routes: str) -> None:
        self.home, (self.port, self.monitor, cluster_port) = home, ports
        self.cluster_port = cluster_port
        self.url, self.monitor_url = (
            f"nats://127.0.0.1:{self.port}",
            f"http://127.0.0.1:{self.monitor}",
        )
        conf = DEPLOY.read_text()
        assert "store_dir: /data" in conf and "\n  port: 6222\n" in conf
        conf = conf.replace("/data", str(home / "js"))
        conf = conf.replace("\n  port: 6222\n", f"\n  host: 127.0.0.1\n  port: {cluster_port}\n")
        (home / "nats.conf").write_text(conf)
        self.args = [nats_server_binary(), "-c", str(home / "nats.conf"), "--name", name]
        self.args += ["-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.monitor)]
        self.args += ["--routes", routes]
        self.proc: subprocess.Popen[bytes] | None = None
        self.resume()

    def resume(self) -> None:
        with (self.home / "nats-server.log").open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, 15, self.proc)

    def halt(self) -> None:
        """SIGKILL: no shutdown, no flush."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path, authority: Path) -> Iterator[list[Node]]:
    """Three nodes, each on the shipped nats.conf with the same auth.conf and routes.conf
    beside it."""
    # every node's client, monitoring and route ports, all distinct
    ports = free_ports(9)
    cluster_ports = ports[6:]
    password = creds.route_password(authority)  # routes carry it: routes.conf requires it
    routes = ",".join(creds.route_url(password, f"127.0.0.1:{p}") for p in cluster_ports)
    nodes: list[Node] = []
    try:
        for i, port in enumerate(cluster_ports):
            home = tmp_path / f"n{i + 1}"
            home.mkdir()
            for name in (creds.AUTH_CONF, creds.ROUTES_CONF):
                shutil.copy(authority / name, home / name)
            own = (ports[2 * i], ports[2 * i + 1], port)
            nodes.append(Node(home, f"nats-{i + 1}", own, routes))
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def _meta_ready(node: Node) -> bool:
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
    cluster: list[Node], authority: Path, pg: PgStore, tmp_path: Path, embedder: Embedder
) -> None:
    """With the streams at R3, SIGKILLing the node that leads the stage stream mid-ingest
    loses no turn and stores none twice: every acked turn has exactly one episode, nothing is
    dead-lettered, and the index holds what Postgres holds."""
    await _until(lambda: asyncio.to_thread(_meta_ready, cluster[0]), 30, "a JetStream leader")
    urls = ",".join(node.url for node in cluster)
    worker_creds = authority / creds.WORKER_CREDS
    settings = Settings(
        nats_url=urls,
        nats_creds=worker_creds,
        namespace=NS,
        state_dir=tmp_path / "state",
        stream_replicas=3,
        stage=StageSettings(ack_wait_s=10),
    )
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    await _until(lambda: _places_r3(urls, worker_creds), 60, "the cluster to place R3 streams")
    worker = Worker(Services(settings, pg, vectors, embedder, Redactor(key=b"k")), urls)
    await worker.start()
    s = Subjects(NS)
    agent_creds = creds.tenant(authority, NS, "acme", tmp_path / "acme.creds", user="ana")[0]
    killed: Node | None = None
    try:
        js = worker.deps.js
        for cfg in topology(settings).streams:
            info = await js.stream_info(cfg.name or "")
            assert info.config.num_replicas == 3 and info.cluster is not None
            assert len(info.cluster.replicas or []) == 2, cfg.name  # two followers
        async with MemoryClient(
            "acme",
            user="ana",
            nats_url=urls,
            namespace=NS,
            nats_creds=agent_creds,
            publish_timeout=2.0,
        ) as mem:
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
            killed = cluster[int(leader.leader.removeprefix("nats-")) - 1]
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
        # the dead-letter stream may be electing a leader after the kill: ask until it answers
        dlq: list[int] = []

        async def dlq_read() -> bool:
            dlq.append((await js.stream_info(s.stream("dlq"))).state.messages)
            return True

        await _until(dlq_read, 60, "the dead-letter stream to answer")
        assert dlq[-1] == 0
        await _until(lambda: _all_indexed(pg), 60, "every memory to be indexed")
        assert await vectors.count() == await pg.count()
    finally:
        await worker.stop()
        await vectors.close()
        if killed is not None:
            await asyncio.to_thread(killed.resume)  # the fixture stops every node


async def _places_r3(urls: str, worker_creds: Path) -> bool:
    """An R3 stream can be created (and is deleted again): the cluster is formed."""
    nc = await nats.connect(urls.split(","), user_credentials=str(worker_creds))
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


async def test_an_r1_cache_bucket_is_raised_to_the_streams_replicas(
    cluster: list[Node], authority: Path
) -> None:
    """A recall-cache bucket made at R1 (before the streams were raised to R3) is raised to
    R3 when a worker opens it, so it outlives the node that held it."""
    await _until(lambda: asyncio.to_thread(_meta_ready, cluster[0]), 30, "a JetStream leader")
    urls = ",".join(node.url for node in cluster)
    worker_creds = authority / creds.WORKER_CREDS
    await _until(lambda: _places_r3(urls, worker_creds), 60, "the cluster to place R3 streams")
    nc = await nats.connect(urls.split(","), user_credentials=str(worker_creds))
    js = nc.jetstream()
    bucket = Subjects(NS).stream("recall_cache")
    await js.create_key_value(bucket=bucket, ttl=30, history=1, replicas=1)
    cache = RecallCache(js, bucket, 30, replicas=3)
    try:
        await cache.start()

        async def two_followers() -> bool:
            info = await js.stream_info(cache.stream)
            return (
                info.config.num_replicas == 3
                and info.cluster is not None
                and len(info.cluster.replicas or []) == 2
            )

        await _until(two_followers, 30, "the bucket at R3")
    finally:
        await cache.stop()
        await nc.close()


def _routez(monitor_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{monitor_url}/routez", timeout=2) as r:
        routez: dict[str, Any] = json.loads(r.read())
    return routez


async def test_a_node_without_the_route_password_cannot_join(
    cluster: list[Node], tmp_path: Path
) -> None:
    """The shipped nats.conf takes routes only with the password of routes.conf: a server
    that reaches a node's cluster port without it is refused (it would otherwise join the
    cluster and receive every account's messages), while the three nodes route to each
    other."""
    await _until(lambda: asyncio.to_thread(_meta_ready, cluster[0]), 30, "a JetStream leader")
    port, monitor, route = free_ports(3)
    args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-m", str(monitor)]
    args += ["--name", "intruder", "--cluster_name", "memstream"]
    args += ["--cluster", f"nats://127.0.0.1:{route}"]
    args += ["--routes", f"nats://127.0.0.1:{cluster[0].cluster_port}"]
    intruder = await asyncio.to_thread(
        subprocess.Popen, args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(monitor, 15, intruder)
        log = cluster[0].home / "nats-server.log"

        async def dialled() -> bool:
            # refused (node 1 logs it) or let in (a route): the check below tells which, and
            # never runs before the intruder has tried
            refused = "Authentication Failure" in log.read_text(errors="replace")
            return refused or _routez(f"http://127.0.0.1:{monitor}")["num_routes"] > 0

        await _until(dialled, 15, "the intruder to dial node 1")
        names = {str(r.get("remote_name")) for r in _routez(cluster[0].monitor_url)["routes"]}
        assert names == {"nats-2", "nats-3"}
        assert _routez(f"http://127.0.0.1:{monitor}")["num_routes"] == 0
    finally:
        intruder.terminate()
        intruder.wait(10)

"""Helpers for integration tests that start a worker of their own, or that need Postgres to
refuse one value as it refuses bad data (a SQLSTATE of class 22)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from memstream.consumers.app import Worker
from memstream.consumers.batching import PullLoops
from memstream.consumers.dlq import dead_letters
from memstream.consumers.embedded import free_port
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.consumers.topology import drained
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import DLQ_REASON_HEADER
from memstream.storage.ports import Embedder
from memstream.storage.postgres import OwnerFilter, PgStore
from memstream.storage.qdrant_server import ServerVectorIndex

REFUSED = "quux-refuse"  # a memory whose content holds this is refused by ``refuse_inserts``


class SlowUpserts:
    """A worker's real index, each upsert held back ``delay_s`` first: a batch's index write
    still under way while the next batch is deduplicated."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def upsert(self, points: Any) -> None:
        await asyncio.sleep(self.delay_s)
        await self.inner.upsert(points)


async def start_worker(settings: Settings, pg: PgStore, embedder: Embedder) -> Worker:
    """A started worker over ``pg`` and a fresh vector index from ``settings``."""
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    worker = Worker(
        Services(settings, pg, vectors, embedder, Redactor(key=b"k")), settings.nats_url or ""
    )
    await worker.start()
    return worker


async def one_turn_batch(running: Any, texts: list[str], prefix: str) -> list[Any]:
    """Stop the running worker's pull loops, publish ``texts`` as turns of acme/bo's session
    s1 (event ids ``prefix`` + position) and fetch them as one extract batch, as a stage loop
    would have: the test hands it to a runner itself."""
    worker = running.worker
    await worker.broker.pulls.stop()
    s, js = worker.deps.subjects, worker.deps.js
    async with running.client("acme", user="bo") as mem:
        for i, text in enumerate(texts):
            await mem.publish_turn([("user", text)], session="s1", event_id=f"{prefix}{i}")
    sub = await js.pull_subscribe_bind(durable=s.durable("extract"), stream=s.stream("turns"))
    msgs: list[Any] = []
    while len(msgs) < len(texts):
        msgs += await sub.fetch(len(texts) - len(msgs), timeout=5)
    return msgs


async def consumer_when(
    js: Any, stream: str, durable: str, ok: Callable[[Any], bool], within_s: float = 5.0
) -> Any:
    """The consumer's info once ``ok`` holds for it, or as it stands after ``within_s``.
    A consumer's counts can lag the requests that changed them: a stage's ``ack()`` is a
    plain publish the server applies later, and a filtered consumer's pending count read
    right after the PubAcks of five messages has been seen at four (in CI). An info read at
    once can be behind either."""
    deadline = time.monotonic() + within_s
    while True:
        info = await js.consumer_info(stream, durable)
        if ok(info) or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.05)


async def acks_settled(js: Any, stream: str, durable: str) -> Any:
    """``consumer_when`` no message awaits its ack."""
    return await consumer_when(js, stream, durable, lambda info: info.num_ack_pending == 0)


async def refuse_inserts(pg: PgStore) -> None:
    """A trigger in the test's schema that raises SQLSTATE 22023 for a memory containing
    ``REFUSED`` (test setup through the pool: no API would add one)."""
    async with pg._pool.acquire() as con:
        await con.execute(
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused' USING ERRCODE = '22023'; END; $$ LANGUAGE plpgsql; "
            "CREATE TRIGGER refuse BEFORE INSERT ON memories FOR EACH ROW "
            f"WHEN (NEW.content LIKE '%{REFUSED}%') EXECUTE FUNCTION refuse()"
        )


async def drain_with_new_loops(running: Any) -> None:
    """Start the running worker's pull loops again (a test stopped them to hand a batch to
    a runner itself) and wait until every stage has drained."""
    loops = running.worker.broker.pulls
    restarted = PullLoops(loops.nc, loops.runners, running.settings.stage.batch_size)
    await restarted.start()
    try:
        await running.wait_for(running.drained, 30, "the stages")
    finally:
        await restarted.stop()


async def one_refused_memory_dead_lettered(running: Any) -> set[str]:
    """After a batch with the ``REFUSED`` memory: exactly one dead letter at store, refused
    by Postgres; returns the source events of acme/bo's stored memories."""
    deps = running.worker.deps
    dead = await dead_letters(deps.js, deps.subjects, "store", 5)
    assert len(dead) == 1 and "SQLSTATE 22023" in dead[0].headers[DLQ_REASON_HEADER]
    flt = OwnerFilter(tenant="acme", user="bo")
    return {e for m in await running.pg.list_memories(flt) for e in m.source_event_ids}


@dataclass
class Running:
    settings: Settings
    worker: Worker
    pg: PgStore
    nats_url: str

    def client(self, tenant: str, **kw: Any) -> MemoryClient:
        return MemoryClient(tenant, nats_url=self.nats_url, namespace=self.settings.namespace, **kw)

    async def wait_for(
        self,
        predicate: Callable[[], Awaitable[bool]],
        seconds: float = 30.0,
        what: str = "condition",
    ) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await predicate():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")

    async def drained(self) -> bool:
        """True once every stage consumer has nothing pending or unacked."""
        return await drained(self.worker.deps.js, self.settings)

    @contextlib.asynccontextmanager
    async def index_away(self) -> AsyncIterator[None]:
        """Inside: the worker's vector index is a Qdrant server that is not there, so every
        index call fails as in an outage."""
        w = self.worker
        live = w.services.vectors
        down = ServerVectorIndex(
            url=f"http://127.0.0.1:{free_port()}",
            timeout=1,
            check_compatibility=False,
            dim=w.embedder.dim,
        )
        w.services.vectors = down  # Worker, Deps, recall and commands all read it
        try:
            yield
        finally:
            w.services.vectors = live
            await down.close()


async def _delete_streams(nats_url: str, settings: Settings) -> None:
    """Leave a shared server as it was: drop this test's streams."""
    import nats

    from memstream.schemas.subjects import Subjects

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for kind in ("turns", "stages", "events", "dlq"):
        with contextlib.suppress(Exception):  # already gone is fine
            await js.delete_stream(Subjects(settings.namespace).stream(kind))
    await nc.close()

"""The worker outlives what goes wrong around it: a failing maintenance round, a flood of
recall requests, a NATS connection that closes; /healthz says what it cannot reach."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from workers import start_worker

from memstream.consumers.embedded import EmbeddedNats
from memstream.consumers.ops import serve_http
from memstream.schemas.recall import RecallRequest
from memstream.schemas.settings import Settings
from memstream.storage.ports import Embedder
from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration


async def test_maintenance_loop_survives_unexpected_errors(running) -> None:
    """A maintenance round that raises something other than a MemstreamError (a NATS timeout
    in the sweeper's emit, a bug) is logged, and rounds go on."""
    worker = running.worker
    worker.services.settings = worker.settings.model_copy(update={"sweep_every_s": 0.05})
    rounds: list[str] = []
    done = asyncio.Event()

    async def flaky() -> None:
        rounds.append("round")
        if len(rounds) <= 2:
            raise RuntimeError("a round that fails")
        done.set()

    setattr(worker, "maintain_once", flaky)  # noqa: B010 - replaces a method on one instance
    assert worker._reconciler is not None
    worker._reconciler.cancel()
    worker._reconciler = asyncio.create_task(worker._reconcile_forever())
    await asyncio.wait_for(done.wait(), 10)
    assert len(rounds) >= 3 and not worker._reconciler.done()


async def test_index_optimizations_are_timed(running) -> None:
    """Every optimization of the index (it pauses the process that holds a Qdrant Edge
    shard) is timed in memstream_index_optimize_duration_seconds: the maintenance round's,
    and one the index's own writes started, which the index tells the worker about."""
    worker = running.worker
    name = "memstream_index_optimize_duration_seconds_count"

    def timed() -> float:
        return worker.telemetry.registry.get_sample_value(name) or 0.0

    before = timed()
    await worker.maintain_once()
    assert timed() == before + 1
    told = worker.vectors.on_optimized  # what an EdgeVectorIndex calls after its own optimize
    assert told is not None
    told(0.25, None)
    assert timed() == before + 2


async def _request(nc: NATS, subject: str, body: bytes) -> dict[str, object]:
    reply = await nc.request(subject, body, timeout=10)
    return json.loads(reply.data)  # type: ignore[no-any-return]


async def test_recall_is_bounded_and_every_request_has_a_deadline(running) -> None:
    """With every recall slot taken, requests beyond recall_max_pending are answered
    `unavailable` at once, and the queued ones `timeout` at their deadline: no request waits
    without bound and no task is made per request beyond the bound."""
    worker = running.worker
    worker.services.settings = worker.settings.model_copy(
        update={"recall_max_pending": 4, "recall_deadline_s": 0.5}
    )
    for _ in range(64):  # every slot busy, as under a flood of slow recalls
        await worker._recall_slots.acquire()
    body = RecallRequest(tenant="acme", user="x", query="anything").model_dump_json().encode()
    nc = await nats.connect(running.nats_url)
    try:
        subject = worker.deps.subjects.recall
        replies = await asyncio.gather(*(_request(nc, subject, body) for _ in range(12)))
    finally:
        for _ in range(64):
            worker._recall_slots.release()
        await nc.close()
    codes = sorted(str(r["error"]["code"]) for r in replies)  # type: ignore[index]
    assert codes == ["timeout"] * 4 + ["unavailable"] * 8
    assert worker._recall_pending == 0


async def test_closed_nats_connection_marks_the_worker_lost(
    tmp_path: Path, pg: PgStore, embedder: Embedder
) -> None:
    """The worker's NATS connections reconnect forever (a server away for minutes does not
    leave a zombie); a connection that closes anyway sets `lost`, which makes `memstream
    worker` exit non-zero for its supervisor."""
    server = EmbeddedNats.start(tmp_path / "nats")
    settings = Settings(nats_url=server.url, namespace="mem", state_dir=tmp_path / "state")
    worker = await start_worker(settings, pg, embedder)
    try:
        assert worker._nc.options["max_reconnect_attempts"] == -1
        broker_nc = worker.broker.config.connection_state.connection
        assert broker_nc.options["max_reconnect_attempts"] == -1
        await asyncio.to_thread(server.halt)
        await asyncio.sleep(3)  # reconnecting, not given up
        assert not worker.lost.is_set() and not worker._nc.is_closed
        await asyncio.to_thread(server.resume)
        for _ in range(100):
            if worker._nc.is_connected and broker_nc.is_connected:
                break
            await asyncio.sleep(0.1)
        assert worker._nc.is_connected and broker_nc.is_connected
        await worker._nc.close()  # as if the client had given up
        await asyncio.wait_for(worker.lost.wait(), 5)
    finally:
        await worker.stop()
        server.stop()


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = (await reader.read()).decode()
    writer.close()
    return int(data.split(" ", 2)[1]), data.split("\r\n\r\n", 1)[1]


async def test_healthz_names_every_server_it_cannot_reach(
    tmp_path: Path, database_url: str, embedder: Embedder
) -> None:
    """/healthz is 200 only while NATS, Postgres and the vector index all answer, and 503
    naming the missing one when any is away."""
    server = EmbeddedNats.start(tmp_path / "nats")
    flag = tmp_path / "index-offline"
    settings = Settings(
        nats_url=server.url,
        namespace="mem",
        state_dir=tmp_path / "state",
        fault_vector_offline_file=flag,
    )
    pg = await PgStore.connect(database_url, schema="healthz")
    worker = await start_worker(settings, pg, embedder)
    ops = await serve_http(worker, "127.0.0.1", 0)
    port = ops.sockets[0].getsockname()[1]
    try:
        assert await _get(port, "/healthz") == (200, "ok\n")
        flag.touch()
        status, body = await _get(port, "/healthz")
        assert status == 503 and body.startswith("vector_index:"), body
        flag.unlink()
        await asyncio.to_thread(server.halt)
        status, body = await _get(port, "/healthz")
        assert status == 503 and body.startswith("nats:"), body
        await asyncio.to_thread(server.resume)
        for _ in range(100):
            if (await _get(port, "/healthz"))[0] == 200:
                break
            await asyncio.sleep(0.1)
        real = worker.pg
        worker.services.store = await PgStore.connect(database_url, schema="healthz")
        await worker.pg.close()  # a pool that cannot answer
        status, body = await _get(port, "/healthz")
        assert status == 503 and body.startswith("postgres:"), body
        worker.services.store = real
        assert (await _get(port, "/healthz"))[0] == 200
    finally:
        ops.close()
        await worker.stop()
        await pg.close()
        server.stop()

"""The index process (consumers/indexproc.py) on a real worker, NATS, Postgres and Qdrant Edge
shard: the worker's stages write the shard through it, recall is answered there (the worker
itself no longer subscribes; its /metrics carries the index process's series), and an index
process killed in the middle of ingest costs no turn: the stages keep the memories unindexed,
a new process takes over, and the maintenance loop indexes what waited."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_batches import TOKENS, distinct_note
from workers import Running, _delete_streams

from memstream.consumers.app import Worker
from memstream.consumers.indexproc import IndexProcessGone, RemoteIndex, without_recall
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.pipeline.redact import Redactor
from memstream.producers.errors import RecallError
from memstream.schemas.memory import MemoryType, Scope
from memstream.schemas.recall import RecallReply
from memstream.schemas.settings import Settings, StageSettings
from memstream.storage.ports import VectorPoint
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration


@pytest.fixture
async def remote(
    nats_url: str, database_url: str, pg: PgStore, namespace: str, tmp_path: Path, embedder
) -> AsyncIterator[Running]:
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path,
        sweep_every_s=1.0,
        stage=StageSettings(max_deliver=3, retry_delays_s=[0.2, 0.5], ack_wait_s=10),
    )
    index = RemoteIndex(settings, nats_url, database_url, b"test-key", schema=namespace)
    await index.start()
    services = Services(without_recall(settings), pg, index, embedder, Redactor(key=b"test-key"))
    worker = Worker(services, nats_url)
    await worker.start()
    yield Running(without_recall(settings), worker, pg, nats_url)
    await worker.stop()
    await index.close()
    await _delete_streams(nats_url, settings)


async def _sources(running: Running) -> list[str]:
    flt = OwnerFilter(tenant="acme", user="bo")
    memories = await running.pg.list_memories(flt)
    return [e for m in memories if m.type is MemoryType.EPISODE for e in m.source_event_ids]


async def test_the_index_process_holds_the_shard_and_answers_recall(remote: Running) -> None:
    """Twelve turns through a worker whose shard is in an index process: every memory is
    indexed there (its count matches Postgres) and recall, which the worker does not answer,
    finds them."""
    index = remote.worker.vectors
    assert isinstance(index, RemoteIndex) and index.pid not in (None, os.getpid())
    assert remote.worker._recall_sub is None
    async with remote.client("acme", user="bo") as mem:
        for i in range(12):
            await mem.publish_turn([("user", distinct_note(i))], session="s1", event_id=f"t{i}")
        await remote.wait_for(remote.drained, 30, "ingestion")
        hits = await mem.recall(TOKENS[3], top_k=3)
    assert any(TOKENS[3] in h.text for h in hits.hits)
    memories = await remote.pg.list_memories(OwnerFilter(tenant="acme"))
    assert sorted(await _sources(remote)) == sorted(f"t{i}" for i in range(12))
    assert await index.count("acme") == len(memories) > 0
    # the worker's /metrics carries the index process's recall series, labelled
    body = (await remote.worker.telemetry.render_all()).decode()
    recall = {f.name: f for f in text_string_to_metric_families(body)}["memstream_recall"]
    served = {tuple(sorted(s.labels.items())): s.value for s in recall.samples}
    assert served[(("process", "index"), ("result", "ok"))] >= 1
    assert served[(("result", "ok"),)] == 0  # the worker itself answered none


async def test_an_index_process_killed_during_ingest_loses_no_turn(remote: Running) -> None:
    """The index process killed (SIGKILL) after the sixth of forty turns: each turn is stored
    exactly once, a new index process is started, every memory ends up indexed in it, and
    recall answers again."""
    index = remote.worker.vectors
    assert isinstance(index, RemoteIndex)
    first = index.pid
    async with remote.client("acme", user="bo") as mem:
        for i in range(40):
            await mem.publish_turn([("user", distinct_note(i))], session="s1", event_id=f"t{i}")
            if i == 5:
                await asyncio.sleep(0.3)  # some turns stored and indexed first
                os.kill(first or 0, signal.SIGKILL)
        await remote.wait_for(remote.drained, 60, "ingestion")
        assert sorted(await _sources(remote)) == sorted(f"t{i}" for i in range(40))
        memories = await remote.pg.list_memories(OwnerFilter(tenant="acme"))

        async def all_indexed() -> bool:
            try:
                return await index.count("acme") == len(memories)
            except Exception:  # noqa: BLE001 - the new process may still be starting
                return False

        await remote.wait_for(all_indexed, 60, "the memories indexed in a new index process")
        assert index.restarts == 1 and index.pid not in (None, first)
        hits = await mem.recall(TOKENS[30], top_k=3)
    assert any(TOKENS[30] in h.text for h in hits.hits)


async def test_recall_is_answered_from_postgres_while_the_index_process_optimizes(
    remote: Running,
) -> None:
    """An optimize that builds holds the index process for seconds: the worker asks it to
    stop answering recall and answers it itself meanwhile, from Postgres (replies say
    vector_index degraded, and find the memory by its words); after it, the index process
    answers again, not degraded."""
    index = remote.worker.vectors
    assert isinstance(index, RemoteIndex)
    # this test runs the maintenance round itself: the loop's (every second here) would
    # optimize the shard as soon as the points below are written
    assert remote.worker._reconciler is not None
    remote.worker._reconciler.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await remote.worker._reconciler
    remote.worker._reconciler = None
    async with remote.client("acme", user="bo") as mem:
        for i in range(6):
            await mem.publish_turn([("user", distinct_note(i))], session="s1", event_id=f"t{i}")
        await remote.wait_for(remote.drained, 30, "ingestion")
        # past the engine's indexing threshold (10,000 KB of vectors), in another tenant
        rng = random.Random(8)
        dim = remote.worker.embedder.dim
        bulk = [
            VectorPoint(
                id=str(uuid.uuid4()),
                vector=[rng.gauss(0, 1) for _ in range(dim)],
                tenant="bulk",
                user="u",
                agent=None,
                session="s",
                type=MemoryType.EPISODE,
                scope=Scope.USER,
                occurred_at=time.time(),
            )
            for _ in range(10_240 * 256 // dim + 200)
        ]
        for lo in range(0, len(bulk), 512):
            await index.upsert(bulk[lo : lo + 512])
        assert await index.optimize_builds()
        maintained = asyncio.create_task(remote.worker.maintain_once())
        replies: list[RecallReply] = []
        started = time.perf_counter()
        while not maintained.done():
            try:
                reply = await mem.recall(TOKENS[3], top_k=3, cache=False)
            except RecallError as exc:  # say when: before, during or after the hand-over
                degraded = sum(r.degraded == ["vector_index"] for r in replies)
                pytest.fail(
                    f"recall {len(replies) + 1} failed ({exc}) "
                    f"{time.perf_counter() - started:.2f} s into the maintenance round, after "
                    f"{len(replies) - degraded} replies from the index process and {degraded} "
                    f"from Postgres; the round {'ended' if maintained.done() else 'still runs'}"
                )
            replies.append(reply)
            assert any(TOKENS[3] in h.text for h in reply.hits)
        await maintained
        assert any(r.degraded == ["vector_index"] for r in replies)
        assert not await index.optimize_builds()
        after = await mem.recall(TOKENS[3], top_k=3, cache=False)
    assert after.degraded == [] and any(TOKENS[3] in h.text for h in after.hits)
    assert remote.worker._recall_sub is None  # the worker's stand-in is gone


async def test_an_index_process_left_paused_answers_recall_after_the_next_round(
    remote: Running,
) -> None:
    """An index process whose recall was paused and never resumed (a hand-over whose last
    step failed) answers recall again after the next maintenance round, with no restart."""
    index = remote.worker.vectors
    assert isinstance(index, RemoteIndex)
    async with remote.client("acme", user="bo") as mem:
        await mem.publish_turn([("user", distinct_note(1))], session="s1", event_id="t1")
        await remote.wait_for(remote.drained, 30, "ingestion")
        await index.pause_recall()
        with pytest.raises(RecallError):  # nobody answers: the worker stands by only around
            await mem.recall(TOKENS[1], top_k=3, cache=False)  # an optimize
        await remote.worker.maintain_once()
        reply = await mem.recall(TOKENS[1], top_k=3, cache=False)
    assert reply.degraded == [] and any(TOKENS[1] in h.text for h in reply.hits)


def test_settings_without_recall_keep_the_other_roles() -> None:
    """The worker beside an index process keeps every role but recall."""
    settings = Settings()
    assert without_recall(settings).stages == ("extract", "redact", "dedupe", "store")


async def test_an_index_process_that_cannot_start_is_tried_again_after_growing_pauses(
    remote: Running,
) -> None:
    """The index process killed while another holder has taken its shard: the next call
    fails as an index outage (the new process cannot open the shard), calls within the pause
    fail at once without a new start, the pause grows with each failed start, and once the
    shard is free the next start succeeds and the pause is gone."""
    index = remote.worker.vectors
    assert isinstance(index, RemoteIndex)
    os.kill(index.pid or 0, signal.SIGKILL)
    await remote.wait_for(_gone(index), 10, "the index process to be gone")
    holder = make_vector_index(remote.settings)
    await holder.ensure(remote.worker.embedder.dim)  # the shard's lock, in this process
    try:
        with pytest.raises(IndexProcessGone):
            await index.count()
        first = index.pause_s
        assert 1.0 <= first <= 2.0 and index.restarts == 0
        started = time.monotonic()
        with pytest.raises(IndexProcessGone):  # within the pause: no new start
            await index.count()
        assert time.monotonic() - started < 0.5
        index._failed_at -= first
        with pytest.raises(IndexProcessGone):
            await index.count()
        assert index.pause_s > first  # drawn from the doubled step, 2-4 s
    finally:
        await holder.close()
    index._failed_at = 0.0
    assert await index.count() == 0
    assert index.restarts == 1 and index.pause_s == 0.0


def _gone(index: RemoteIndex) -> Callable[[], Awaitable[bool]]:
    async def gone() -> bool:
        return index._writer is None

    return gone


async def test_a_caller_given_up_on_does_not_stop_the_start_of_a_new_index_process(
    remote: Running,
) -> None:
    """The index process killed, then a call given up on after 0.2 s (a health check's
    deadline) while the new process starts: the start goes on, and the next call is answered
    by that same new process (one start, not two)."""
    index = remote.worker.vectors
    assert isinstance(index, RemoteIndex)
    os.kill(index.pid or 0, signal.SIGKILL)
    await remote.wait_for(_gone(index), 10, "the index process to be gone")
    before = index.spawned
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await index.count()
    assert await index.count() == 0
    assert index.spawned == before + 1 and index.restarts == 1

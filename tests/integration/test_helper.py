"""The helper process (consumers/helper.py) on a real worker: turns extracted, redacted and
embedded there are stored and recallable as on the in-process path; a helper killed in the
middle of ingest costs no turn and is replaced; a batch that fails with a helper goes on
over the stage subjects, the poison memory dead-lettered alone. Batches overlap, in a worker
with a helper and in the index owner that runs dedupe and store beside extract/redact
processes."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from test_batches import TOKENS, distinct_note
from workers import (
    REFUSED,
    SlowUpserts,
    _delete_streams,
    drain_with_new_loops,
    one_refused_memory_dead_lettered,
    one_turn_batch,
    refuse_inserts,
)

from memstream.consumers.app import Worker
from memstream.consumers.batch_store import publish_to_stage
from memstream.consumers.batching import BatchRunner
from memstream.consumers.chains import batch_stage
from memstream.consumers.helper import Helper, HelperGone
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.consumers.stages import redact_candidate
from memstream.pipeline.extract import extract
from memstream.pipeline.redact import Redactor
from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.memory import MemoryType
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import STAGES
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration


@pytest.fixture
def stage_helper() -> bool:
    return True


async def _episodes(running: Any) -> list[Any]:
    flt = OwnerFilter(tenant="acme", user="bo")
    return [m for m in await running.pg.list_memories(flt) if m.type is MemoryType.EPISODE]


async def test_turns_prepared_by_the_helper_are_stored_redacted_and_recallable(running) -> None:
    """Thirteen turns through a worker with a helper: every episode stored, recallable, the
    email redacted and counted in the redact stage's metrics, the stages fused."""
    helper = running.worker.services.helper
    assert helper is not None and multiprocessing.active_children()  # started with the worker
    async with running.client("acme", user="bo") as mem:
        for i in range(12):
            await mem.publish_turn([("user", distinct_note(i))], session="s1")
        await mem.publish_turn([("user", "my email is bo@example.com")], session="s1")
        await running.wait_for(running.drained, 30, "ingestion")
        assert len(await _episodes(running)) == 13
        hits = await mem.recall(TOKENS[3], top_k=3)
        assert any(TOKENS[3] in h.text for h in hits.hits)
    assert helper.prepared >= 1
    texts = [m.content for m in await running.pg.list_memories(OwnerFilter(tenant="acme"))]
    assert not any("bo@example.com" in t for t in texts)
    metrics = running.worker.deps.metrics
    assert metrics["redact"].redactions.get("EMAIL", 0) >= 1
    assert metrics["redact"].fused >= 13 and metrics["store"].fused >= 13
    body = generate_latest(running.worker.telemetry.registry).decode()
    assert f"memstream_helper_batches_total {float(helper.prepared)}" in body
    assert "memstream_helper_restarts_total 0.0" in body


async def test_a_helper_killed_during_ingest_loses_no_turn_and_is_replaced(running) -> None:
    """The helper process killed (SIGKILL) after the sixth of forty turns: the batch it held
    goes to singles in the worker, a new helper takes the next ones, and each turn is stored
    exactly once."""
    helper = running.worker.services.helper
    assert helper is not None
    (child,) = multiprocessing.active_children()
    async with running.client("acme", user="bo") as mem:
        for i in range(40):
            await mem.publish_turn([("user", distinct_note(i))], session="s1", event_id=f"t{i}")
            if i == 5:
                os.kill(child.pid or 0, signal.SIGKILL)
                await asyncio.sleep(0.2)
        await running.wait_for(running.drained, 60, "ingestion")
    episodes = await _episodes(running)
    sources = [e for m in episodes for e in m.source_event_ids]
    assert sorted(sources) == sorted(f"t{i}" for i in range(40))  # each turn once
    assert helper.restarts == 1
    body = generate_latest(running.worker.telemetry.registry).decode()
    assert "memstream_helper_restarts_total 1.0" in body
    assert [p.pid for p in multiprocessing.active_children()] != [child.pid]
    assert helper.prepared >= 1  # the new helper took the later batches


async def test_a_failing_helped_batch_goes_on_over_the_stage_subjects(running) -> None:
    """As for a fused batch without a helper (test_batches.py): five turns prepared by the
    helper, the memory of the second refused by Postgres at store: the batch goes to singles,
    the four good turns are stored, the refused memory is dead-lettered alone."""
    await refuse_inserts(running.pg)
    worker = running.worker
    texts = ["tea at noon", f"{REFUSED} here", "the deploy is on Friday", "blue vase", "cello"]
    msgs = await one_turn_batch(running, texts, "t")
    runner = BatchRunner("extract", worker.deps, batch_stage(STAGES, helped=True))
    prepared = worker.services.helper.prepared
    await runner.batch(msgs)
    assert worker.services.helper.prepared == prepared + 1  # the helper did prepare it
    assert (runner.metrics.acked, runner.metrics.dead_lettered) == (5, 0)
    await drain_with_new_loops(running)
    assert await one_refused_memory_dead_lettered(running) == {"t0", "t2", "t3", "t4"}


_OWNER = """
import asyncio, multiprocessing, sys, time
from memstream.consumers.helper import Helper
from memstream.schemas.settings import Settings

async def main():
    helper = Helper(Settings(), b"k" * 32)
    await helper.start()
    (child,) = multiprocessing.active_children()
    print(child.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"  # a zombie has exited


def test_a_helper_leaves_when_its_worker_is_killed_outright() -> None:
    """A process holding a started helper is killed with SIGKILL (it cannot stop the helper):
    the helper process exits by itself within seconds, instead of living on as an orphan."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        child = int(owner.stdout.readline())
        assert _alive(child)
        owner.kill()
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child)
    finally:
        owner.kill()


async def test_an_error_in_the_helper_fails_that_batch_only() -> None:
    """A batch the helper cannot prepare (here a value that is no turn) raises in the worker,
    where the batch goes to singles; the same helper process prepares the next batch, with
    no restart."""
    helper = Helper(Settings(), b"k" * 32)
    await helper.start()
    try:
        (child,) = multiprocessing.active_children()
        with pytest.raises(AttributeError):
            await helper.prepare(["not a turn"])  # type: ignore[list-item]
        turn = TurnEvent(
            tenant="acme",
            user="bo",
            session="s1",
            messages=[Message(role=Role.USER, content="I prefer tea.")],
        )
        done = await helper.prepare([turn])
        assert [c.content for c in done.candidates[0]][-1] == "I prefer tea."
        assert (helper.prepared, helper.restarts) == (1, 0)
        assert [p.pid for p in multiprocessing.active_children()] == [child.pid]
    finally:
        await helper.close()


async def test_a_helper_killed_in_the_middle_of_its_answer_fails_that_batch_at_once() -> None:
    """The child SIGKILLed while it writes a batch's answer (larger than the pipe holds, so
    it is stopped in the middle of it): the worker's read ends with ``HelperGone`` instead of
    waiting for the rest of the answer for ever, and the next batch gets a new child."""
    helper = Helper(Settings(), b"k" * 32)
    await helper.start()
    try:
        child = helper._child
        assert child is not None
        turns = [
            TurnEvent(
                tenant="acme",
                user="bo",
                session="s1",
                messages=[Message(role=Role.USER, content=f"note {i}: I prefer tea at {i}:30.")],
            )
            for i in range(200)
        ]
        # the batch handed to the child directly, and its answer left unread: the child fills
        # the pipe and blocks in the middle of its write
        child.work.send_bytes(pickle.dumps(turns))
        deadline = time.monotonic() + 60
        while not child.answers.poll(0.1):
            assert time.monotonic() < deadline, "the child never started its answer"
        await asyncio.sleep(0.5)
        assert child.proc.is_alive()  # still writing: the answer is larger than the pipe
        os.kill(child.proc.pid, signal.SIGKILL)
        with pytest.raises(HelperGone):
            await asyncio.wait_for(helper._receive(child), 10)
        helper._child = None  # as prepare does once the child is gone
        child.stop(0)
        done = await helper.prepare(turns[:1])
        assert done.candidates[0]
    finally:
        await helper.close()


async def test_a_near_duplicate_of_a_memory_still_being_indexed_is_folded(running) -> None:
    """A turn stored by one batch whose index write is still under way when the next batch,
    holding its near duplicate, is deduplicated (the batches overlap): the near duplicate is
    folded into it all the same (found among ``Deps.unindexed``, not by the index search),
    and the one episode, holding both turns, ends up indexed."""
    services = running.worker.services
    services.vectors = SlowUpserts(services.vectors, 2.0)
    first = "remember that the harbor bridge opens at nine every morning"
    async with running.client("acme", user="bo") as mem:
        await mem.publish_turn([("user", first)], session="s1", event_id="n0")

        async def written() -> bool:  # its row committed: the batch's head is done
            return bool(await _episodes(running))

        await running.wait_for(written, 30, "the first turn's row")
        (row,) = await _episodes(running)
        assert not row.indexed  # its index write is still under way
        await mem.publish_turn([("user", first + "!")], session="s1", event_id="n1")
        await running.wait_for(running.drained, 30, "ingestion")
    (episode,) = await _episodes(running)
    assert episode.source_event_ids == ["n0", "n1"] and episode.indexed


async def test_the_index_owner_dedupes_the_next_batch_while_one_is_still_indexed(
    nats_url: str, pg: PgStore, namespace: str, tmp_path: Path, embedder: Any
) -> None:
    """A worker of the roles dedupe, store and recall (the index owner beside extract/redact
    processes) overlaps its batches: a candidate whose index write is held for 3 s has its
    row written, and the next candidate's row is written while that write is still under
    way. Taken one batch at a time, the second would wait for the first to be indexed."""
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path,
        stages=["dedupe", "store", "recall"],
        stage=StageSettings(ack_wait_s=10),
    )
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    redactor = Redactor(key=b"test-key")
    services = Services(settings, pg, SlowUpserts(vectors, 3.0), embedder, redactor)
    worker = Worker(services, nats_url)
    await worker.start()
    flt = OwnerFilter(tenant="acme", user="bo")

    async def episodes() -> dict[str, Any]:
        found = await pg.list_memories(flt)
        return {m.source_event_ids[0]: m for m in found if m.type is MemoryType.EPISODE}

    async def publish(event_id: str, text: str) -> None:
        turn = TurnEvent(
            event_id=event_id,
            tenant="acme",
            user="bo",
            session="s1",
            messages=[Message(role=Role.USER, content=text)],
        )
        cands = [redact_candidate(redactor, c) for c in extract(turn)]  # as redact hands on
        await publish_to_stage(worker.deps, "dedupe", cands)

    async def wait_for(what: str, ok: Any) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while not ok(found := await episodes()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)
        return found

    try:
        await publish("o0", "remember that the library on the corner closes at six on fridays")
        first = await wait_for("the first row", lambda found: "o0" in found)
        assert not first["o0"].indexed  # its index write is held
        await publish("o1", "my cousin Teodora is flying in from Lisbon next tuesday morning")
        both = await wait_for("the second row", lambda found: "o1" in found)
        assert not both["o0"].indexed, "the second batch waited for the first's index write"
        done = await wait_for("both indexed", lambda f: all(m.indexed for m in f.values()))
        assert set(done) == {"o0", "o1"}
    finally:
        await worker.stop()
        await vectors.close()
        await _delete_streams(nats_url, settings)


class _AnswersAfterTheWrite:
    """Slow index writes (``SlowUpserts``); a batch search sent while one is under way runs
    at once, before the write lands, but its answer comes back only after the write has
    landed and the writer has moved on."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self.inner, self.slow = inner, SlowUpserts(inner, delay_s)
        self.writes: list[asyncio.Event] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def upsert(self, points: Any) -> None:
        landed = asyncio.Event()
        self.writes.append(landed)
        try:
            await self.slow.upsert(points)
        finally:
            landed.set()

    async def search_many(self, *args: Any, **kwargs: Any) -> Any:
        under_way = [w for w in self.writes if not w.is_set()]
        found = await self.inner.search_many(*args, **kwargs)
        for landed in under_way:
            await landed.wait()
        if under_way:
            await asyncio.sleep(0.3)  # the store tail's bookkeeping after its write
        return found


async def test_a_near_duplicate_whose_mate_lands_during_the_search_is_folded(running) -> None:
    """The next batch's search runs before the batch before has written its points, and its
    answer arrives after they are written: the near duplicate is folded all the same (the
    memories still being indexed are read before the search is sent, not after its answer,
    when that batch has already taken them off the list)."""
    services = running.worker.services
    services.vectors = _AnswersAfterTheWrite(services.vectors, 2.0)
    first = "remember that the ferry to the island leaves at seven every evening"
    async with running.client("acme", user="bo") as mem:
        await mem.publish_turn([("user", first)], session="s1", event_id="f0")

        async def written() -> bool:
            return bool(await _episodes(running))

        await running.wait_for(written, 30, "the first turn's row")
        await mem.publish_turn([("user", first + "!")], session="s1", event_id="f1")
        await running.wait_for(running.drained, 30, "ingestion")
    (episode,) = await _episodes(running)
    assert episode.source_event_ids == ["f0", "f1"] and episode.indexed

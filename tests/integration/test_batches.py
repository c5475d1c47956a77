"""Stage batches on a real worker: one poison message in a batch is dead-lettered alone on its
first delivery while the rest of the batch is stored and acked; turns of one session are
stored in the order they were published; a worker running every stage fuses them, a fused
batch that fails goes on over the stage subjects, and fused batches overlap without a helper
process too."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from workers import (
    REFUSED,
    SlowUpserts,
    acks_settled,
    consumer_when,
    drain_with_new_loops,
    one_refused_memory_dead_lettered,
    one_turn_batch,
    refuse_inserts,
)

from memstream.consumers.batch_dedupe import Merges
from memstream.consumers.batch_stages import BATCH_STAGES
from memstream.consumers.batch_store import store_begun, stored
from memstream.consumers.batching import BatchRunner
from memstream.consumers.chains import batch_stage
from memstream.consumers.dlq import dead_letters
from memstream.consumers.stages import _redact_candidate, carried, with_vectors
from memstream.consumers.topology import topology
from memstream.schemas.errors import TransientError
from memstream.schemas.memory import Candidate, MemoryType, Owner, dated
from memstream.schemas.subjects import DLQ_REASON_HEADER, MSG_ID_HEADER, STAGES, msg_id
from memstream.storage.ports import VectorFilter
from memstream.storage.postgres import OwnerFilter

pytestmark = pytest.mark.integration

AT = datetime(2026, 3, 1, tzinfo=UTC)
WORDS = ["apple", "bridge", "cello", "delta", "ember", "fossil", "garnet", "harbor", "ivy", "jade"]


# words made of two WORDS each: a hundred that no two notes below share more than a few of
TOKENS = [f"{WORDS[j % 10]}{WORDS[j // 10]}" for j in range(100)]


def distinct_note(i: int) -> str:
    """Note ``i`` of 40, whose words overlap any other's too little for a near-duplicate fold
    (which would write its audit row at dedupe, ahead of inserts written later at store)."""
    return f"{TOKENS[i]} {TOKENS[i + 40]} {TOKENS[99 - i]} entry {i}"


def candidate(i: int, content: str) -> Candidate:
    return Candidate(
        candidate_id=f"c{i}",
        owner=Owner(tenant="acme", user="bo"),
        session="s1",
        content=content,
        source_event_id=f"e{i}",
        occurred_at=AT + timedelta(seconds=i),
        redacted=True,
    )


async def nothing() -> None:
    return None


async def test_poison_message_is_isolated_from_its_batch(running) -> None:
    """Five candidates fetched as one store batch, the second refused by Postgres: the batch
    call fails, the singles path dead-letters that one on its first delivery with its reason,
    stores and acks the other four, and retries nothing."""
    await refuse_inserts(running.pg)
    worker = running.worker
    await worker.broker.pulls.stop()  # the test fetches the store stage's batch itself
    s, js = worker.deps.subjects, worker.deps.js
    texts = ["tea at noon", "quux-refuse here", "the deploy is on Friday", "blue vase", "cello"]
    for i, text in enumerate(texts):
        c = candidate(i, text)
        await js.publish(
            s.stage("store", "acme"),
            c.model_dump_json().encode(),
            headers={MSG_ID_HEADER: msg_id("acme", f"store:{c.candidate_id}")},
        )
    stream, durable = s.stream("stages"), s.durable("store")
    sub = await js.pull_subscribe_bind(durable=durable, stream=stream)
    msgs: list[Any] = []
    while len(msgs) < 5:
        msgs += await sub.fetch(5 - len(msgs), timeout=5)
    assert len(msgs) == 5  # one batch, as the stage loop would have fetched it

    runner = BatchRunner("store", worker.deps, BATCH_STAGES["store"])
    await runner.batch(msgs)

    dead = await dead_letters(js, s, "store", 5)
    assert len(dead) == 1
    reason = dead[0].headers[DLQ_REASON_HEADER]
    assert "SQLSTATE 22023" in reason and "gave up" not in reason
    assert await running.pg.count("acme") == 4
    m = runner.metrics
    assert (m.batches, m.processed, m.acked, m.dead_lettered, m.retried) == (1, 5, 4, 1, 0)
    info = await acks_settled(js, stream, durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_turns_of_a_session_are_stored_in_publish_order(running) -> None:
    """Forty turns of one session published back to back reach Postgres in publish order
    (the audit trail's sequence), whatever batches the stages cut them into."""
    async with running.client("acme", user="bo") as mem:
        ids = []
        for i in range(40):
            r = await mem.publish_turn(
                [("user", distinct_note(i))],
                session="s1",
                event_id=f"ev-{i:02d}",
            )
            assert r is not None
            ids.append(r.event_id)
        await running.wait_for(running.drained, 30, "ingestion")
    stored = [
        e["detail"]["source_event_id"]
        for e in await running.pg.events_for("acme")
        if e["kind"] == "stored" and e["detail"].get("type") == "episode"
    ]
    assert stored == ids


async def test_redact_carries_the_vector_that_dedupe_and_store_use(running) -> None:
    """The redact stage attaches the embedding of each candidate's dated, redacted text (one
    call for the batch); a carried vector of the embedder's size is used as is, one of another
    size (another model, a hostile message) is not, and the stored memory's index point is
    found by that vector."""
    deps = running.worker.deps
    raw = candidate(1, "call me at ana@example.com about the harbor bridge").model_copy(
        update={"redacted": False}
    )
    redacted = _redact_candidate(deps, raw)
    (c,) = with_vectors(deps, [redacted])
    assert "ana@example.com" not in c.content
    assert c.vector == deps.embedder.embed([dated(c.content, c.occurred_at)])[0]
    assert carried(deps, c) == c.vector
    assert carried(deps, c.model_copy(update={"vector": [0.5] * 3})) is None
    assert carried(deps, redacted) is None
    assert await BATCH_STAGES["dedupe"].work(deps, [c]) == 1
    await running.wait_for(running.drained, 30, "the store stage")
    assert c.vector is not None
    hits = await deps.vectors.search(c.vector, VectorFilter(tenant="acme", user="bo"), 1)
    assert hits and hits[0][1] == pytest.approx(1.0, abs=1e-4)


async def _delivered(running, stage: str) -> int:
    """Messages the stage's durable consumer has delivered so far."""
    stream, cfg = topology(running.settings).consumers[stage]
    info = await running.worker.deps.js.consumer_info(stream, cfg.durable_name or "")
    return int(info.delivered.consumer_seq)


async def test_a_worker_running_every_stage_fuses_them(running) -> None:
    """Turns published to a worker that runs every stage are stored and recallable, each turn
    acked at extract, with no message on the redact, dedupe or store subjects: their work is
    counted in their metrics as handed on in memory."""
    async with running.client("acme", user="bo") as mem:
        for i in range(12):
            await mem.publish_turn([("user", distinct_note(i))], session="s1")
        await running.wait_for(running.drained, 30, "ingestion")
        flt = OwnerFilter(tenant="acme", user="bo")
        episodes = [m for m in await running.pg.list_memories(flt) if m.type is MemoryType.EPISODE]
        assert len(episodes) == 12
        hits = await mem.recall(TOKENS[3], top_k=3)
        assert any(TOKENS[3] in h.text for h in hits.hits)
    metrics = running.worker.deps.metrics
    assert metrics["extract"].acked == 12
    for stage in ("redact", "dedupe", "store"):
        assert await _delivered(running, stage) == 0, stage
        assert metrics[stage].fused >= 12 and metrics[stage].acked == 0, stage


async def test_a_failing_fused_batch_goes_on_over_the_stage_subjects(running) -> None:
    """Five turns fetched as one fused batch, the memory of the second refused by Postgres:
    the batch call fails, each turn is extracted again alone and its candidates go over the
    stage subjects, so the four good turns are stored and the refused memory is dead-lettered
    alone by the store stage, with its reason, on its first delivery."""
    await refuse_inserts(running.pg)
    worker = running.worker
    texts = ["tea at noon", f"{REFUSED} here", "the deploy is on Friday", "blue vase", "cello"]
    msgs = await one_turn_batch(running, texts, "t")

    runner = BatchRunner("extract", worker.deps, batch_stage(STAGES))
    await runner.batch(msgs)
    assert (runner.metrics.acked, runner.metrics.dead_lettered) == (5, 0)
    metrics = worker.deps.metrics
    assert metrics["dedupe"].fused == 5 and metrics["store"].fused == 0  # failed at store
    stream_, cfg = topology(running.settings).consumers["redact"]
    info = await consumer_when(
        worker.deps.js, stream_, cfg.durable_name or "", lambda info: info.num_pending >= 5
    )
    assert info.num_pending == 5 and info.delivered.consumer_seq == 0  # the singles' output
    await drain_with_new_loops(running)
    assert await one_refused_memory_dead_lettered(running) == {"t0", "t2", "t3", "t4"}
    assert await _delivered(running, "redact") >= 5


async def test_near_duplicates_in_one_fused_batch_are_folded(running) -> None:
    """Two near-duplicate turns of one owner fetched as one fused batch end as one episode
    holding both turns, as they would in two batches (the second found by the index): the
    later one is folded into the earlier once it is written, the fold is recorded under its
    candidate and announced as ``merged``, and the index record lists both sources. A
    distinct turn of the batch is stored as usual."""
    worker = running.worker
    texts = [
        "remember that the harbor bridge opens at nine every morning",
        "remember that the harbor bridge opens at nine every morning!",
        distinct_note(7),
    ]
    msgs = await one_turn_batch(running, texts, "n")

    runner = BatchRunner("extract", worker.deps, batch_stage(STAGES))
    await runner.batch(msgs)
    assert (runner.metrics.acked, runner.metrics.dead_lettered) == (3, 0)
    flt = OwnerFilter(tenant="acme", user="bo")
    episodes = [m for m in await running.pg.list_memories(flt) if m.type is MemoryType.EPISODE]
    assert len(episodes) == 2
    twin = next(m for m in episodes if "opens at nine" in m.content)
    assert twin.source_event_ids == ["n0", "n1"] and twin.indexed
    record = (await worker.deps.vectors.fetch("acme", [twin.id]))[twin.id]
    assert record["source_event_ids"] == ["n0", "n1"]
    kinds = [
        (e["kind"], e["detail"].get("source_event_id"))
        for e in await running.pg.events_for("acme", twin.id)
    ]
    assert ("stored", "n0") in kinds and ("merged", "n1") in kinds
    await drain_with_new_loops(running)


async def test_near_folds_are_written_with_the_batch_or_stored_if_their_memory_went(
    running,
) -> None:
    """A store batch from a dedupe in the same call folds its near duplicates in its own
    transaction: into a live memory (its source added, the fold recorded, the memory indexed
    again and announced as merged), and a candidate whose memory went since the search is
    stored as a memory of its own, never dropped."""
    deps = running.worker.deps
    first = candidate(3, distinct_note(3))
    assert await stored(deps, [first]) == 1
    flt = OwnerFilter(tenant="acme", user="bo")
    (target,) = [m for m in await running.pg.list_memories(flt) if m.content == first.content]
    near, orphan = candidate(4, distinct_note(3) + " again"), candidate(5, distinct_note(5))
    sent: list[tuple[str, str]] = []
    publish = deps.publish_many

    async def recording(items: Any) -> None:
        sent.extend((msg.kind, msg.memory_id) for _, msg, _ in items)
        await publish(items)

    deps.publish_many = recording
    try:
        merges = Merges([], [], near=[(near, target.id), (orphan, str(uuid.uuid4()))])
        assert await stored(deps, [], merges) == 1  # the orphan, stored itself
    finally:
        deps.publish_many = publish
    folded = await running.pg.memories_by_id([("acme", target.id)])
    assert folded[target.id].source_event_ids == ["e3", "e4"] and folded[target.id].indexed
    assert await running.pg.folded_among([("acme", "c4"), ("acme", "c5")]) == {
        ("acme", "c4"): target.id
    }
    (alone,) = [m for m in await running.pg.list_memories(flt) if m.content == orphan.content]
    assert alone.source_event_ids == ["e5"]
    assert ("merged", target.id) in sent and ("stored", alone.id) in sent


async def test_a_memory_waits_for_its_point_as_the_dedupe_made_its_row(running) -> None:
    """The store stage hands on the unit row that dedupe made of a candidate's vector
    (``Merges.units``) to the memory that waits for its point, instead of making it again; a
    candidate that has no such row gets one of its own."""
    deps = running.worker.deps
    given, alone = candidate(6, distinct_note(6)), candidate(7, distinct_note(7))
    given, alone = (
        c.model_copy(update={"vector": deps.embedder.embed([c.content])[0]}) for c in (given, alone)
    )
    row = np.asarray(given.vector, dtype=np.float32)
    row /= np.linalg.norm(row)
    kept, tail = await store_begun(deps, [given, alone], Merges([], [], units={"c6": row}))
    waiting = {u.text: u.vector for u in deps.unindexed.values()}
    await tail(nothing)
    assert kept == 2
    assert waiting[given.content] is row
    assert isinstance(waiting[alone.content], np.ndarray)
    own = np.asarray(alone.vector, dtype=np.float32)
    assert np.allclose(waiting[alone.content], own / np.linalg.norm(own))


async def test_a_store_retried_after_its_events_failed_announces_stored(running) -> None:
    """A store try that wrote its memories but whose events did not go out (NATS away between
    the commit and the publish) is tried again: the retry announces the memory it created as
    ``stored``, as the first try would have, not as ``merged`` into itself."""
    deps = running.worker.deps
    c = candidate(1, distinct_note(1))
    sent: list[str] = []
    publish = deps.publish_many

    async def failing(items: Any) -> None:
        raise TimeoutError("nats did not answer")  # the first try's events

    deps.publish_many = failing
    with pytest.raises(TimeoutError):
        await stored(deps, [c])

    async def recording(items: Any) -> None:
        sent.extend(msg.kind for _, msg, _ in items)
        await publish(items)

    deps.publish_many = recording
    assert await stored(deps, [c]) == 1
    assert sent == ["stored"]
    deps.publish_many = publish


async def test_a_fold_whose_mate_was_not_written_stores_the_candidate(running) -> None:
    """A candidate to fold into a batch mate that is not there (the mate was not written: an
    earlier try had folded it elsewhere) is stored as a memory of its own, never dropped."""
    deps = running.worker.deps
    c = candidate(2, distinct_note(2))
    missing = str(uuid.uuid4())
    assert await stored(deps, [], Merges([], [], [(c, missing)])) == 1  # stored: counted as kept
    flt = OwnerFilter(tenant="acme", user="bo")
    kept = [m for m in await running.pg.list_memories(flt) if m.content == c.content]
    assert len(kept) == 1 and kept[0].source_event_ids == [c.source_event_id]
    assert await running.pg.folded_among([("acme", c.candidate_id)]) == {}


async def test_fused_batches_without_a_helper_overlap(running) -> None:
    """A worker running every stage with no helper process (as with the LLM extractor, or on
    one CPU) overlaps its fused batches: a turn whose index write is held for 3 s has its row
    written, and the next turn's row is written while that write is still under way. Taken
    one batch at a time, the second would wait for the first to be indexed."""
    assert running.worker.services.helper is None
    running.worker.services.vectors = SlowUpserts(running.worker.services.vectors, 3.0)
    flt = OwnerFilter(tenant="acme", user="bo")

    async def episodes() -> dict[str, Any]:
        found = await running.pg.list_memories(flt)
        return {m.source_event_ids[0]: m for m in found if m.type is MemoryType.EPISODE}

    async def arrived(event_id: str) -> bool:
        return event_id in await episodes()

    async with running.client("acme", user="bo") as mem:
        await mem.publish_turn([("user", distinct_note(0))], session="s1", event_id="w0")
        await running.wait_for(lambda: arrived("w0"), 30, "the first row")
        assert not (await episodes())["w0"].indexed  # its index write is held
        await mem.publish_turn([("user", distinct_note(1))], session="s1", event_id="w1")
        await running.wait_for(lambda: arrived("w1"), 30, "the second row")
        assert not (await episodes())["w0"].indexed, "the second batch waited for the first"
        await running.wait_for(running.drained, 30, "ingestion")
    assert all(m.indexed for m in (await episodes()).values())


async def test_a_memory_changed_after_its_batch_read_it_is_left_to_the_reconciler(
    running, clock
) -> None:
    """A memory whose row changes between the store stage's read and its mark (a command's
    update, another process's merge, each indexing the row itself) is left not indexed: the
    batch's point may have landed after the newer one, and the reconciler indexes the row as
    it is."""
    deps = running.worker.deps
    c = candidate(3, distinct_note(3))
    mark = running.pg.mark_indexed

    async def meanwhile(ids: Any, read: Any = None) -> None:
        clock.advance(seconds=1)
        for mid in ids:
            assert await running.pg.merge("acme", mid, "e-meanwhile")
        await mark(ids, read)

    running.pg.mark_indexed = meanwhile
    try:
        assert await stored(deps, [c]) == 1
    finally:
        del running.pg.mark_indexed
    left = [m for m in await running.pg.unindexed() if m.content == c.content]
    assert len(left) == 1 and "e-meanwhile" in left[0].source_event_ids


class AwayAfterOneUpsert:
    """A worker's real index that goes away after one upsert: a tail whose points went in,
    then could not write them again."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.upserts = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def upsert(self, points: Any) -> None:
        self.upserts += 1
        if self.upserts > 1:
            raise TransientError("index away")
        await self.inner.upsert(points)


@pytest.mark.parametrize("index_stays", [True, False])
async def test_a_batch_merging_into_a_memory_being_indexed_writes_its_point_after(
    running, clock, index_stays: bool
) -> None:
    """A batch that merges into a memory whose index write, begun by the batch before, is
    still under way (overlapped batches: ``store_begun``) writes its own point of that memory
    again after that write: the point the index keeps lists both sources. If the index went
    away meanwhile, the memory is left not indexed, for the maintenance loop."""
    deps = running.worker.deps
    index = running.worker.services.vectors
    first = candidate(4, distinct_note(4))
    again = candidate(5, distinct_note(4))  # the same note from another turn: an exact merge
    running.worker.services.vectors = SlowUpserts(index, 1.0)
    _, tail = await store_begun(deps, [first])
    earlier = asyncio.ensure_future(tail(nothing))
    await asyncio.sleep(0.2)  # the first batch's upsert is held back
    clock.advance(seconds=1)
    _, later = await store_begun(deps, [again])

    async def before() -> None:
        await earlier

    running.worker.services.vectors = index if index_stays else AwayAfterOneUpsert(index)
    await later(before)
    flt = OwnerFilter(tenant="acme", user="bo")
    (memory,) = [m for m in await running.pg.list_memories(flt) if m.content == first.content]
    assert set(memory.source_event_ids) == {"e4", "e5"}
    left = {m.id for m in await running.pg.unindexed()}
    assert (memory.id in left) is not index_stays
    running.worker.services.vectors = index  # back: the maintenance loop indexes what is left
    for _ in range(200):  # 10 s
        if memory.id not in {m.id for m in await running.pg.unindexed()}:
            break
        await asyncio.sleep(0.05)
    record = (await index.fetch("acme", [memory.id]))[memory.id]
    assert set(record["source_event_ids"]) == {"e4", "e5"}

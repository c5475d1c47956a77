"""The vector index going away and coming back (a fault flag file makes every index call fail):
memories kept unindexed are indexed soon after it returns or after the next worker starts, and
a redelivered near duplicate is not stored twice while it is away."""

from __future__ import annotations

from pathlib import Path

import pytest
from outages import _all_indexed, _count, _drop_streams, _turn, _until
from workers import start_worker

from memstream.consumers.app import Worker
from memstream.consumers.batch_store import dedupe_batch, store_batch
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.consumers.stages import _redact_candidate, dedupe_work, store_work
from memstream.pipeline import dedupe
from memstream.pipeline.extract import extract
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient
from memstream.schemas.memory import MemoryType
from memstream.schemas.settings import Settings, StageSettings
from memstream.storage.ports import Embedder
from memstream.storage.postgres import OwnerFilter, PgStore

pytestmark = pytest.mark.integration


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

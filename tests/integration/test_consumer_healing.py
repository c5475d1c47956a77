"""Stage consumers and streams that disappear come back without a restart
(consumers/healing.py), on a real JetStream: nothing lost, and processed turns not redone."""

from __future__ import annotations

import nats
import pytest
from nats.js.api import DeliverPolicy

from memstream.consumers import topology
from memstream.schemas.memory import MemoryType
from memstream.schemas.subjects import Subjects
from memstream.storage.postgres import OwnerFilter

pytestmark = pytest.mark.integration


async def _episodes(running, tenant: str) -> list[str]:
    rows = await running.pg.list_memories(OwnerFilter(tenant=tenant), limit=100)
    return sorted(m.content for m in rows if m.type is MemoryType.EPISODE)


async def test_a_deleted_extract_consumer_comes_back_after_the_last_ack_floor(running) -> None:
    """The extract consumer deleted under a running worker: it is re-created at the ack floor
    it had, so the turns published while it was gone are stored and the ones processed
    before are not delivered again; a worker starting later keeps that start (no refusal to
    start over a consumer JetStream cannot update in place)."""
    s = Subjects(running.settings.namespace)
    client = running.client("heal-a", user="u")
    for n in range(3):
        await client.publish_turn([("user", f"Before the deletion, note number {n} is kept.")])
    await running.wait_for(lambda: _count(running, "heal-a", 3), 20, "the first turns")
    healer = running.worker.healer
    assert healer is not None
    await healer.note_floors()  # what the worker's watch does every 10 s
    floor = healer.floors["extract"]
    assert floor >= 3
    nc = await nats.connect(running.nats_url)
    js = nc.jetstream()
    try:
        await js.delete_consumer(s.stream("turns"), s.durable("extract"))
        for n in range(2):
            await client.publish_turn([("user", f"While it was gone, note number {n} came.")])
        await running.wait_for(lambda: _count(running, "heal-a", 5), 30, "the later turns")
        info = await js.consumer_info(s.stream("turns"), s.durable("extract"))
        assert info.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
        assert info.config.opt_start_seq == floor + 1
        assert info.delivered.stream_seq > floor and info.num_redelivered == 0
        assert info.delivered.consumer_seq == 2  # the two new turns, none of the first three
        assert healer.healed == 1
        await topology.apply(js, running.settings)  # a worker (re)starting now
        again = await js.consumer_info(s.stream("turns"), s.durable("extract"))
        assert again.config.opt_start_seq == floor + 1
    finally:
        await nc.close()
        await client.close()
    texts = await _episodes(running, "heal-a")
    assert len(texts) == 5 and sum("While it was gone" in t for t in texts) == 2


async def test_a_lost_turns_stream_is_made_again_and_ingest_goes_on(running) -> None:
    """The turns stream gone (a NATS server that lost its JetStream state): the worker makes
    it and its extract consumer again, and turns published after that are stored."""
    s = Subjects(running.settings.namespace)
    client = running.client("heal-b", user="u")
    await client.publish_turn([("user", "The first note, before the stream went away.")])
    await running.wait_for(lambda: _count(running, "heal-b", 1), 20, "the first turn")
    nc = await nats.connect(running.nats_url)
    js = nc.jetstream()
    try:
        await js.delete_stream(s.stream("turns"))

        async def stream_back() -> bool:
            try:
                await js.consumer_info(s.stream("turns"), s.durable("extract"))
            except nats.js.errors.NotFoundError:
                return False
            return True

        await running.wait_for(stream_back, 20, "the stream and its consumer made again")
        await client.publish_turn([("user", "The second note, once the stream was back.")])
        await running.wait_for(lambda: _count(running, "heal-b", 2), 30, "the later turn")
    finally:
        await nc.close()
        await client.close()


async def _count(running, tenant: str, n: int) -> bool:
    return len(await _episodes(running, tenant)) >= n

"""Stage consumers and streams that disappear come back without a restart
(consumers/healing.py), on a real JetStream: nothing lost, and processed turns not redone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from workers import _delete_streams

from memstream.consumers import topology
from memstream.consumers.doctor.bus import check_bus
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.memory import MemoryType
from memstream.schemas.settings import Settings
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

    async def floor_read() -> bool:  # what the worker's watch does every 10 s
        await healer.note_floors()  # (the turns are acked just after their rows are written)
        return bool(healer.floors.get("extract", 0) >= 3)

    await running.wait_for(floor_read, 10, "the three turns acked")
    floor = healer.floors["extract"]
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
        found, doctor_nc = await check_bus(running.settings, running.nats_url)
        await doctor_nc.close()
        consumers = next(f for f in found if f.check == "consumers")
        assert consumers.ok, consumers.detail  # its start is no drift
    finally:
        await nc.close()
        await client.close()
    texts = await _episodes(running, "heal-a")
    assert len(texts) == 5 and sum("While it was gone" in t for t in texts) == 2


async def test_lost_streams_are_made_again_and_ingest_goes_on(running) -> None:
    """Every stream gone (a NATS server that lost its JetStream state): the worker makes them
    and its stage consumers again, the events stream the store stage announces on included,
    and turns published after that are stored."""
    s = Subjects(running.settings.namespace)
    client = running.client("heal-b", user="u")
    await client.publish_turn([("user", "The first note, before the stream went away.")])
    await running.wait_for(lambda: _count(running, "heal-b", 1), 20, "the first turn")
    nc = await nats.connect(running.nats_url)
    js = nc.jetstream()
    try:
        for kind in ("turns", "stages", "events", "dlq"):
            await js.delete_stream(s.stream(kind))

        async def stream_back() -> bool:
            try:
                await js.consumer_info(s.stream("turns"), s.durable("extract"))
            except nats.js.errors.NotFoundError:
                return False
            return True

        await running.wait_for(stream_back, 20, "the stream and its consumer made again")
        await client.publish_turn([("user", "The second note, once the stream was back.")])
        await running.wait_for(lambda: _count(running, "heal-b", 2), 30, "the later turn")

        async def announced() -> bool:  # the store stage announces on the events stream
            try:
                return bool((await js.stream_info(s.stream("events"))).state.messages)
            except nats.js.errors.NotFoundError:
                return False

        await running.wait_for(announced, 10, "the later turn's events")
    finally:
        await nc.close()
        await client.close()


async def _count(running, tenant: str, n: int) -> bool:
    return len(await _episodes(running, tenant)) >= n


@pytest.fixture
async def bare(nats_url: str, namespace: str, tmp_path) -> AsyncIterator[tuple[Any, Settings]]:
    """This test's streams and consumers on the real server, no worker running."""
    settings = Settings(nats_url=nats_url, namespace=namespace, state_dir=tmp_path)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await topology.apply(js, settings)
    yield js, settings
    await nc.close()
    await _delete_streams(nats_url, settings)


async def _older_extract(js: Any, s: Subjects, definitions: int | None) -> None:
    """The extract consumer as another release made it: acked all-up-to (which JetStream
    cannot change in place), with ``definitions`` in its metadata (None: none recorded)."""
    stream, durable = s.stream("turns"), s.durable("extract")
    await js.delete_consumer(stream, durable)
    meta = None if definitions is None else {topology.DEFINITIONS_KEY: str(definitions)}
    cfg = ConsumerConfig(
        durable_name=durable,
        ack_policy=AckPolicy.ALL,
        filter_subject=s.turns_filter(),
        metadata=meta,
    )
    await js.add_consumer(stream, cfg)


async def test_an_older_definition_is_replaced_after_its_ack_floor(bare) -> None:
    """A release whose consumer definition JetStream cannot apply in place, over a consumer
    of an older definition (none recorded): the start replaces it, starting after the old
    one's ack floor: the 2 turns it had not acked come, the 3 it had do not (before, the
    start stopped and asked the operator to delete the consumer)."""
    js, settings = bare
    s = Subjects(settings.namespace)
    stream, durable = s.stream("turns"), s.durable("extract")
    await _older_extract(js, s, None)
    for n in range(5):
        await js.publish(s.turns("acme", "u", "s1"), f"turn {n}".encode())
    sub = await js.pull_subscribe_bind(durable, stream)
    third = (await sub.fetch(3, timeout=5))[-1]
    await third.ack_sync()  # all up to the third
    await sub.unsubscribe()
    await topology.apply(js, settings)
    info = await js.consumer_info(stream, durable)
    assert info.config.ack_policy == AckPolicy.EXPLICIT
    assert topology.definitions_of(info.config) == topology.DEFINITIONS
    assert info.config.deliver_policy == DeliverPolicy.BY_START_SEQUENCE
    assert info.config.opt_start_seq == 4 and info.num_pending == 2


async def test_a_newer_definition_is_kept_and_the_same_one_refused(bare) -> None:
    """An older release starting beside a consumer of a newer definition leaves it as it is
    (a rolling upgrade); a consumer of this very definition that still refuses it in place
    (changed by hand) stops the start with a message saying which to delete."""
    js, settings = bare
    s = Subjects(settings.namespace)
    stream, durable = s.stream("turns"), s.durable("extract")
    await _older_extract(js, s, topology.DEFINITIONS + 1)
    await topology.apply(js, settings)
    kept = await js.consumer_info(stream, durable)
    assert kept.config.ack_policy == AckPolicy.ALL
    await _older_extract(js, s, topology.DEFINITIONS)
    with pytest.raises(ConfigurationError, match="'extract'"):
        await topology.apply(js, settings)

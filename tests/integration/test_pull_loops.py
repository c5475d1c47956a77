"""The pull loop's batch begun ahead (consumers/batching.py, ``PullLoops``): while the batch
before it is held through an outage for longer than ``ack_wait``, its messages have their
deadline renewed, so JetStream does not deliver them again behind it: both where it waits to
begin (``_behind``) and where its index write and events wait for the batch before to finish
(``Overlap.after_before``)."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from memstream.consumers.batching import Begun, One, Overlap, PullLoops

pytestmark = pytest.mark.integration

ACK_WAIT_S = 1.0


@pytest.mark.parametrize("where", ["to begin", "to announce"])
async def test_a_batch_begun_ahead_is_not_redelivered_while_the_one_before_is_held(
    nats_url: str, where: str
) -> None:
    """Three turns fetched and begun while the batch before is held for 3.5 x ``ack_wait``,
    waiting to begin or, once begun, to announce: none is delivered again meanwhile, and once
    acked none is pending. (With no renewal the fetch below gets them back.)"""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"AHEAD{uuid.uuid4().hex[:8].upper()}"
    try:
        await js.add_stream(name=stream, subjects=[f"{stream}.turns"])
        await js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name="extract",
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ACK_WAIT_S,
                max_deliver=5,
            ),
        )
        for i in range(3):
            await js.publish(f"{stream}.turns", f"turn {i}".encode())
        sub = await js.pull_subscribe_bind(durable="extract", stream=stream)
        msgs = await sub.fetch(3, timeout=2)
        begun = Begun([One(m) for m in msgs], [], [], None)
        # the batch before, held for three and a half deadlines
        held = asyncio.create_task(asyncio.sleep(3.5 * ACK_WAIT_S))
        if where == "to begin":
            await PullLoops._behind(held, asyncio.Event(), begun, ACK_WAIT_S / 3)
        else:
            await Overlap(asyncio.Event(), held, begun.msgs, ACK_WAIT_S / 3).after_before()
        assert held.done()
        # nothing came back meanwhile: the consumer has nothing to deliver
        with pytest.raises(TimeoutError):
            await sub.fetch(1, timeout=0.5)
        for m in msgs:
            await m.ack_sync()
        info = await js.consumer_info(stream, "extract")
        assert info.num_redelivered == 0
        assert info.num_ack_pending == 0
    finally:
        await js.delete_stream(stream)
        await nc.close()

"""A durable pull consumer's fetches on nats-py's public API (consumers/pull.py, ``Pull``), on a
real JetStream: a fetch returns at once with what is waiting, up to its batch; one that finds
nothing waits for the first message or its timeout, and leaves no request open; what a request
delivers after its fetch stopped waiting is in ``waiting`` and comes first next time; ``close``
hands back what no fetch returned; a request the server refuses (the consumer deleted) is
said, once, not spun on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from memstream.consumers.pull import Pull

pytestmark = pytest.mark.integration


@pytest.fixture
async def consumer(nats_url: str) -> AsyncIterator[tuple[Any, Any, str]]:
    """A connection, its JetStream context and a stream with a durable ``work`` consumer."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"PULL{uuid.uuid4().hex[:8].upper()}"
    await js.add_stream(name=stream, subjects=[f"{stream}.turns"])
    await js.add_consumer(
        stream, ConsumerConfig(durable_name="work", ack_policy=AckPolicy.EXPLICIT, ack_wait=30)
    )
    try:
        yield nc, js, stream
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def _publish(js: Any, stream: str, *bodies: str) -> None:
    for body in bodies:
        await js.publish(f"{stream}.turns", body.encode())


async def test_a_fetch_returns_what_is_waiting_at_once_up_to_its_batch(
    consumer: tuple[Any, Any, str],
) -> None:
    """Five turns waiting: a fetch of three returns the first three in stream order, the next
    the other two, each well before its timeout (it does not wait for a full batch)."""
    nc, js, stream = consumer
    await _publish(js, stream, *(f"turn {i}" for i in range(5)))
    pull = await Pull.bind(nc, stream, "work")
    start = time.monotonic()
    first = await pull.fetch(3, wait_s=5)
    second = await pull.fetch(3, wait_s=5)
    assert time.monotonic() - start < 2.5
    assert [m.data for m in first + second] == [f"turn {i}".encode() for i in range(5)]
    for m in first + second:
        await m.ack_sync()
    assert (await js.consumer_info(stream, "work")).num_ack_pending == 0
    await pull.close()


async def test_a_fetch_that_finds_nothing_times_out_and_leaves_no_request_open(
    consumer: tuple[Any, Any, str],
) -> None:
    """Nothing published: the fetch raises ``TimeoutError`` after about its timeout, and a turn
    published afterwards is delivered to no one (its request had expired), so it is still
    there for the next fetch, delivered once."""
    nc, js, stream = consumer
    pull = await Pull.bind(nc, stream, "work")
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        await pull.fetch(4, wait_s=0.6)
    assert 0.4 < time.monotonic() - start < 3
    await _publish(js, stream, "late")
    await asyncio.sleep(0.3)
    assert not pull.waiting
    assert (await js.consumer_info(stream, "work")).num_ack_pending == 0
    (late,) = await pull.fetch(4, wait_s=2)
    assert (late.data, late.metadata.num_delivered) == (b"late", 1)
    await late.ack_sync()
    await pull.close()


async def test_a_fetch_that_waited_returns_the_first_turns_and_leaves_no_request_open(
    consumer: tuple[Any, Any, str],
) -> None:
    """A fetch that found nothing returns with the first turn published, at once; its request
    ends there, so the two turns published next are delivered to no one until the next fetch,
    which returns them (delivered once)."""
    nc, js, stream = consumer
    pull = await Pull.bind(nc, stream, "work")
    fetching = asyncio.ensure_future(pull.fetch(3, wait_s=10))
    await asyncio.sleep(0.2)
    published = time.monotonic()
    await _publish(js, stream, "turn 0")
    (turn0,) = await fetching
    assert turn0.data == b"turn 0"
    assert time.monotonic() - published < 1.0  # not at the end of its 10 s
    await turn0.ack_sync()
    await _publish(js, stream, "turn 1", "turn 2")
    await asyncio.sleep(0.3)
    assert not pull.waiting
    assert (await js.consumer_info(stream, "work")).num_ack_pending == 0
    got = await pull.fetch(3, wait_s=2)
    assert [(m.data, m.metadata.num_delivered) for m in got] == [
        (b"turn 1", 1),
        (b"turn 2", 1),
    ]
    await pull.close()


async def _open_request(nc: Any, js: Any, stream: str, pull: Pull) -> None:
    """A request for three left open on the server (as one whose fetch stopped waiting is),
    and two turns it delivers into ``pull.waiting``."""
    request = {"batch": 3, "expires": int(30e9)}
    await nc.publish(
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.work",
        json.dumps(request).encode(),
        reply=f"{pull.inbox}.open",
    )
    await _publish(js, stream, "turn 1", "turn 2")
    for _ in range(100):
        if len(pull.waiting) == 2:
            break
        await asyncio.sleep(0.02)
    assert [m.data for m in pull.waiting] == [b"turn 1", b"turn 2"]


async def test_what_an_open_request_delivers_later_comes_first_next_time(
    consumer: tuple[Any, Any, str],
) -> None:
    """Two turns a request delivered after its fetch stopped waiting are in ``waiting``; the
    next fetch returns them, in order, before a turn published since."""
    nc, js, stream = consumer
    pull = await Pull.bind(nc, stream, "work")
    await _open_request(nc, js, stream, pull)
    await _publish(js, stream, "turn 3")
    got = await pull.fetch(3, wait_s=2)
    assert [m.data for m in got] == [b"turn 1", b"turn 2", b"turn 3"]
    await pull.close()


async def test_close_hands_back_what_no_fetch_returned(consumer: tuple[Any, Any, str]) -> None:
    """Two turns waiting in the puller when it closes are handed back at once (nak): another
    puller gets them now, not after the 30 s ack deadline."""
    nc, js, stream = consumer
    pull = await Pull.bind(nc, stream, "work")
    await _open_request(nc, js, stream, pull)
    await pull.close()
    other = await Pull.bind(nc, stream, "work")
    # the server takes each nak in on its own: a fetch may find one turn back before the
    # other, so fetch until both are here (without the naks, neither is for 30 s)
    got: list[Any] = []
    deadline = time.monotonic() + 3
    while len(got) < 2 and (left := deadline - time.monotonic()) > 0:
        with contextlib.suppress(TimeoutError):
            got += await other.fetch(3, wait_s=left)
    assert sorted(m.data for m in got) == [b"turn 1", b"turn 2"]
    for m in got:
        await m.ack_sync()
    await other.close()


async def test_a_consumer_deleted_under_the_puller_is_said_once_and_not_spun_on(
    consumer: tuple[Any, Any, str],
) -> None:
    """The consumer deleted: each fetch waits out its timeout (asking again at once would
    spin), both refusals are counted, and one warning names the stream, the consumer and the
    server's status, not one a fetch. (At debug level, as before, an operator heard nothing.)"""
    from structlog.testing import capture_logs

    nc, js, stream = consumer
    pull = await Pull.bind(nc, stream, "work")
    await js.delete_consumer(stream, "work")
    with capture_logs() as logs:
        for _ in range(2):
            start = time.monotonic()
            with pytest.raises(TimeoutError):
                await pull.fetch(1, wait_s=0.5)
            assert time.monotonic() - start >= 0.45
    await pull.close()
    assert pull.refused >= 2
    warned = [e for e in logs if e["event"] == "pull.request_refused"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning"
    assert (warned[0]["stream"], warned[0]["consumer"]) == (stream, "work")
    assert warned[0]["status"] in ("409", "503")

"""The pull loop's batch begun ahead (consumers/batching.py, ``PullLoops``): while the batch
before it is held through an outage for longer than ``ack_wait``, its messages have their
deadline renewed, so JetStream does not deliver them again behind it: both where it waits to
begin (``_behind``) and where its index write and events wait for the batch before to finish
(``Overlap.after_before``). And a batch whose own call runs longer than ``ack_wait`` (its
index write waiting behind an optimize) renews its deadline while it runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, cast

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from workers import acks_settled

from memstream.consumers.batching import BatchRunner, BatchStage, Begun, One, Overlap, PullLoops
from memstream.consumers.pull import Pull
from memstream.consumers.services import Services
from memstream.consumers.stages import Deps
from memstream.pipeline.redact import Redactor
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import Subjects
from memstream.storage.embedding import make_embedder
from memstream.storage.memory import MemoryStore

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


@pytest.mark.parametrize("waits", ["behind the batch before", "for its own batch"])
async def test_messages_no_fetch_returned_are_renewed_while_the_loop_waits(
    nats_url: str, waits: str
) -> None:
    """A pull request that outlives the fetch that sent it (the fetch stopped waiting before
    the server ended it) goes on delivering messages into ``Pull.waiting``, where no fetch
    has returned them and no batch renews them. While the loop waits 3.5 x ``ack_wait``
    (behind the batch before, or for its own batch, as a stage that does not begin ahead
    does), their deadline is renewed too: none is delivered again, and the next fetch returns
    each once. (Seen in a 30,000-turn ingest run, whose paced turns
    arrived while an optimize held the chain for 24 s: 250 turns handled twice.)"""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"QUEUED{uuid.uuid4().hex[:8].upper()}"
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
        sub = await Pull.bind(nc, stream, "extract")
        # a request for three left open on the server, as one whose fetch stopped waiting is
        request = {"batch": 3, "expires": int(30e9)}
        await nc.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.extract",
            json.dumps(request).encode(),
            reply=f"{sub.inbox}.open",
        )
        for i in range(3):
            await js.publish(f"{stream}.turns", f"turn {i}".encode())
        for _ in range(100):
            if len(sub.waiting) == 3:
                break
            await asyncio.sleep(0.02)
        assert len(sub.waiting) == 3  # delivered by the open request, returned by no fetch
        held = asyncio.create_task(asyncio.sleep(3.5 * ACK_WAIT_S))
        if waits == "behind the batch before":
            begun = Begun([], [], [], None)
            await PullLoops._behind(held, asyncio.Event(), begun, ACK_WAIT_S / 3, sub)
        else:
            await PullLoops._renewing_waiting(held, sub, ACK_WAIT_S / 3)
        assert held.done()
        info = await js.consumer_info(stream, "extract")
        assert info.num_redelivered == 0
        msgs = await sub.fetch(3, wait_s=2)
        assert [(m.data, m.metadata.num_delivered) for m in msgs] == [
            (f"turn {i}".encode(), 1) for i in range(3)
        ]
        for m in msgs:
            await m.ack_sync()
        info = await js.consumer_info(stream, "extract")
        assert info.num_redelivered == 0 and info.num_ack_pending == 0
    finally:
        await js.delete_stream(stream)
        await nc.close()


@pytest.mark.parametrize("hold_s", [120.0, 1.5 * ACK_WAIT_S], ids=["held", "past-the-budget"])
async def test_a_batch_whose_call_runs_long_is_not_redelivered_meanwhile(
    nats_url: str, tmp_path: Path, hold_s: float
) -> None:
    """A ``BatchRunner`` whose batch call takes 3.5 x ``ack_wait`` (no outage, just slow),
    while another puller of the same consumer asks for messages all along: the batch is
    handled once and acked, and nothing is delivered again meanwhile. (With no renewal during
    the call, the other puller gets the three turns.) The renewal lasts the hold budget
    (``outage_hold_s``) at most: past it, a try that still runs (hung) lets its messages go
    to the other puller."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"SLOW{uuid.uuid4().hex[:8].upper()}"
    calls: list[list[str]] = []

    async def work(deps: Deps, values: list[str]) -> int:
        calls.append(values)
        await asyncio.sleep(3.5 * ACK_WAIT_S)
        return len(values)

    async def single(deps: Deps, body: bytes, subject: str) -> int:
        raise AssertionError("the batch fell to singles")

    stage_settings = StageSettings(ack_wait_s=ACK_WAIT_S, outage_hold_s=hold_s)
    settings = Settings(state_dir=tmp_path, stage=stage_settings)
    services = Services(
        settings, MemoryStore(), cast(Any, None), make_embedder(None, None), Redactor(b"k")
    )
    deps = Deps(services, Subjects("t"), js)
    stage = BatchStage[str](lambda deps, body, subject: body.decode(), work, single)
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
        other = await js.pull_subscribe_bind(durable="extract", stream=stream)
        meanwhile = asyncio.ensure_future(other.fetch(3, timeout=3.5 * ACK_WAIT_S))
        await BatchRunner("extract", deps, stage).batch(msgs)
        assert calls == [["turn 0", "turn 1", "turn 2"]]
        if hold_s < 3.5 * ACK_WAIT_S:
            again = await meanwhile
            assert sorted(m.data for m in again) == [b"turn 0", b"turn 1", b"turn 2"]
            for m in again:
                await m.ack_sync()
            return
        with pytest.raises(TimeoutError):
            await meanwhile
        with pytest.raises(TimeoutError):
            await sub.fetch(1, timeout=0.5)
        info = await js.consumer_info(stream, "extract")
        assert info.num_redelivered == 0
        assert info.num_ack_pending == 0
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def test_a_stage_counts_the_messages_it_handles_again(nats_url: str, tmp_path: Path) -> None:
    """``StageMetrics.redelivered`` (``memstream_stage_redelivered``, the ingest bench's
    "messages redelivered"): a batch of one message delivered for the first time counts
    none; the same kind of batch of a message nacked once, and so delivered again, counts
    it, and both are handled and acked."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"AGAIN{uuid.uuid4().hex[:8].upper()}"

    async def work(deps: Deps, values: list[str]) -> int:
        return len(values)

    runner = _runner(js, tmp_path, work)
    try:
        await js.add_stream(name=stream, subjects=[f"{stream}.turns"])
        await js.add_consumer(
            stream, ConsumerConfig(durable_name="extract", ack_policy=AckPolicy.EXPLICIT)
        )
        sub = await js.pull_subscribe_bind(durable="extract", stream=stream)
        await js.publish(f"{stream}.turns", b"first")
        await runner.batch(await sub.fetch(1, timeout=2))
        assert (runner.metrics.processed, runner.metrics.redelivered) == (1, 0)
        await js.publish(f"{stream}.turns", b"second")
        (once,) = await sub.fetch(1, timeout=2)
        await once.nak()
        await runner.batch(await sub.fetch(1, timeout=2))
        assert (runner.metrics.processed, runner.metrics.redelivered) == (2, 1)
        assert runner.metrics.acked == 2
        assert (await acks_settled(js, stream, "extract")).num_ack_pending == 0
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def test_a_pull_loop_that_fails_is_logged_and_started_again(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A defect raised inside a stage's pull loop, outside the batch (where every failure is
    handled), ends that loop: it is logged with its stage (``stage.loop_failed``) and the loop
    starts again on a new subscription, so the turns are still handled, the batch it had in
    hand once its deadline passes. (Without the restart the stage stops for good while the
    worker runs on, and nothing is said.)"""
    from structlog.testing import capture_logs

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"FAILS{uuid.uuid4().hex[:8].upper()}"
    handled: list[str] = []

    async def work(deps: Deps, values: list[str]) -> int:
        handled.extend(values)
        return len(values)

    runner = _runner(js, tmp_path, work)
    real = PullLoops._renewing_waiting
    failures = [RuntimeError("a defect in the loop")]

    async def fails_once(work: Any, sub: Any, renew_s: float) -> None:
        if failures:
            work.close()  # the batch never runs: its messages wait for their deadline
            raise failures.pop()
        await real(work, sub, renew_s)

    monkeypatch.setattr(PullLoops, "_renewing_waiting", staticmethod(fails_once))
    loops = PullLoops(nc, {"extract": (stream, "extract", runner)}, 16, ACK_WAIT_S)
    try:
        await js.add_stream(name=stream, subjects=[f"{stream}.turns"])
        await js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name="extract", ack_policy=AckPolicy.EXPLICIT, ack_wait=ACK_WAIT_S
            ),
        )
        for i in range(3):
            await js.publish(f"{stream}.turns", f"turn {i}".encode())
        with capture_logs() as logs:
            await loops.start()
            for _ in range(200):
                if len(handled) == 3:
                    break
                await asyncio.sleep(0.05)
        assert sorted(handled) == ["turn 0", "turn 1", "turn 2"]
        failed = [e for e in logs if e["event"] == "stage.loop_failed"]
        assert [e["stage"] for e in failed] == ["extract"]
        assert (await acks_settled(js, stream, "extract")).num_ack_pending == 0
    finally:
        await loops.stop(grace_s=3)
        await js.delete_stream(stream)
        await nc.close()


def _runner(js: Any, tmp_path: Path, work: Any) -> BatchRunner:
    """An extract ``BatchRunner`` over in-memory stores whose batch call is ``work``; a batch
    that falls to singles fails the test."""

    async def single(deps: Deps, body: bytes, subject: str) -> int:
        raise AssertionError("the batch fell to singles")

    settings = Settings(state_dir=tmp_path)
    services = Services(
        settings, MemoryStore(), cast(Any, None), make_embedder(None, None), Redactor(b"k")
    )
    deps = Deps(services, Subjects("t"), js)
    return BatchRunner(
        "extract", deps, BatchStage[str](lambda deps, b, s: b.decode(), work, single)
    )


async def test_a_stage_whose_consumer_is_deleted_counts_the_refusals_and_says_why(
    nats_url: str, tmp_path: Path
) -> None:
    """The stage's consumer deleted under its running loop: the refused requests count in
    the stage's ``refused`` (``memstream_stage_refused_total``, the MemstreamStageRefused
    alert), and one ``pull.request_refused`` warning for each reason names the consumer.
    (Before, the stage took nothing and only a debug line said so.)"""
    from structlog.testing import capture_logs

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    stream = f"GONE{uuid.uuid4().hex[:8].upper()}"

    async def work(deps: Deps, values: list[str]) -> int:
        return len(values)

    runner = _runner(js, tmp_path, work)
    loops = PullLoops(nc, {"extract": (stream, "extract", runner)}, 16)
    try:
        await js.add_stream(name=stream, subjects=[f"{stream}.turns"])
        await js.add_consumer(
            stream, ConsumerConfig(durable_name="extract", ack_policy=AckPolicy.EXPLICIT)
        )
        with capture_logs() as logs:
            await loops.start()
            await js.delete_consumer(stream, "extract")
            for _ in range(100):
                if runner.metrics.refused >= 2:
                    break
                await asyncio.sleep(0.05)
        assert runner.metrics.refused >= 2
        warned = [e for e in logs if e["event"] == "pull.request_refused"]
        # one warning a reason (a request under way when it went ends by 409, Consumer
        # Deleted; the ones after find no consumer, 503), not one a fetch
        reasons = [(e["status"], e["reason"]) for e in warned]
        assert warned and len(reasons) == len(set(reasons))
        assert all(e["consumer"] == "extract" and e["stream"] == stream for e in warned)
    finally:
        await loops.stop(grace_s=3)
        await js.delete_stream(stream)
        await nc.close()

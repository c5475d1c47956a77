"""MemoryMiddleware when the memory service fails, around a fake model provider, against the
real stack (NATS, Postgres, Qdrant Edge, the worker): NATS unreachable, a stalled responder,
stopped workers, a rejected API key or a failing audit sink change nothing in the run, cost at
most the recall deadline, and are audited by category only. The model is the only fake: a
plain function."""

from __future__ import annotations

import time

import nats
import pytest
from agentturns import Audit, run_turn

from memstream.consumers.embedded import free_port
from memstream.producers import AuditEvent, MemoryClient, MemoryMiddleware
from memstream.producers.middleware import MEMORY_RULE
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


async def test_unreachable_service_changes_nothing(running) -> None:
    """With NATS unreachable the run's result is the one of a run without memories, within
    the recall deadline, the failures are audited by category only, and the failed add is
    not flushed."""
    async with running.client("acme", user="gus") as healthy:
        _, baseline = await run_turn(MemoryMiddleware(healthy), "o1", [], "plan my week")
    audit = Audit()
    down = MemoryClient(  # tries a background publish for 1 s (the default: a minute)
        "acme",
        user="gus",
        nats_url=f"nats://127.0.0.1:{free_port()}",
        connect_timeout=0.2,
        retry_for_s=1.0,
    )
    mw = MemoryMiddleware(down, audit=audit, deadline_s=0.5)
    started = time.monotonic()
    ctx, out = await run_turn(mw, "o1", [], "plan my week")
    assert time.monotonic() - started < 1.5
    assert out == baseline
    assert ctx.recalled == () and ctx.messages[0].content.endswith(MEMORY_RULE)
    (failed,) = audit.named("recall_failed")
    assert failed.metadata["category"] in {"unavailable", "deadline"}
    (add_failed,) = await audit.wait("add_failed")
    assert add_failed.metadata == {"operation": "add", "category": "unavailable", "kind": "turn"}
    await mw.drain()
    assert audit.named("flush_succeeded") == audit.named("flush_failed") == []  # add failed
    assert "127.0.0.1" not in repr(audit.events) and "plan my week" not in repr(audit.events)
    await down.close()


async def test_stalled_service_costs_at_most_the_deadline(running) -> None:
    """A recall responder that never answers costs the turn at most the deadline, and the
    result is the one of a run without memories."""
    # the client alone would wait 5 s for a reply: the middleware's deadline is what cuts it
    async with running.client("acme", user="hal", recall_timeout=5.0) as mem:
        _, baseline = await run_turn(MemoryMiddleware(mem), "w1", [], "summarise the report")
        stall = await nats.connect(running.nats_url)  # takes every request, answers none
        await stall.subscribe(Subjects(running.settings.namespace).recall)
        await running.worker.stop()  # only the silent subscriber is left on the subject
        audit = Audit()
        mw = MemoryMiddleware(mem, audit=audit, deadline_s=0.3)
        started = time.monotonic()
        _, out = await run_turn(mw, "w2", [], "summarise the report")
        elapsed = time.monotonic() - started
        await stall.close()
    assert out == baseline and elapsed < 0.3 + 1.0
    assert [e.metadata["category"] for e in audit.named("recall_failed")] == ["deadline"]


async def test_stopped_workers_change_nothing(running) -> None:
    """With the workers stopped (NATS up, nobody answering recall) the turn completes with
    the same result, the failure audited as `unavailable`, and the turn is still published."""
    async with running.client("acme", user="ian") as mem:
        _, baseline = await run_turn(MemoryMiddleware(mem), "v1", [], "summarise the report")
        await running.worker.stop()
        audit = Audit()
        _, out = await run_turn(
            MemoryMiddleware(mem, audit=audit), "v2", [], "summarise the report"
        )
        assert out == baseline
        assert [e.metadata["category"] for e in audit.named("recall_failed")] == ["unavailable"]
        await audit.wait("add_succeeded")  # JetStream keeps it for the workers' return


async def test_audit_holds_no_key_and_a_failing_sink_is_ignored(running) -> None:
    """A rejected key shows up as the category `unauthorized`, never the key; an audit
    callback that raises changes nothing in the run."""
    key = "msk_secret_value_1234567890"
    audit = Audit()
    async with running.client("acme", user="ida", api_key=key) as mem:
        mw = MemoryMiddleware(mem, audit=audit)
        await run_turn(mw, "k1", [], "what did we decide about caching?")
    (failed,) = audit.named("recall_failed")
    assert failed.metadata == {"operation": "recall", "category": "unauthorized"}
    assert key not in repr(audit.events) and key[4:12] not in repr(audit.events)

    def broken(event: AuditEvent) -> None:
        raise RuntimeError("audit sink down")

    async with running.client("acme", user="ida") as mem:
        _, plain = await run_turn(MemoryMiddleware(mem), "k2", [], "hello caching")
        _, out = await run_turn(MemoryMiddleware(mem, audit=broken), "k3", [], "hello caching")
    assert out == plain


async def test_a_flush_that_cannot_finish_never_fails_the_turn(running) -> None:
    """With the workers stopped the add succeeds and the flush after it is bounded: audited
    `pending` after `flush_s`; a client closed while a flush waits ends it as `closed`
    (noting the add succeeded), without opening a new connection; the turn returns at once
    with the result of a run without memory either way."""
    async with running.client("acme", user="jon") as mem:
        _, baseline = await run_turn(MemoryMiddleware(mem, flush_s=None), "q0", [], "plan it")
        await running.worker.stop()
        audit, closing = Audit(), Audit()
        mw = MemoryMiddleware(mem, audit=audit, flush_s=0.3)
        started = time.monotonic()
        _, out = await run_turn(mw, "q1", [], "plan it")
        assert time.monotonic() - started < 1.5 and out == baseline
        (pending,) = await audit.wait("flush_succeeded")
        assert pending.metadata == {"status": "pending"}
        late = MemoryMiddleware(mem, audit=closing, flush_s=60)
        _, out = await run_turn(late, "q2", [], "plan it")
        assert out == baseline
        await closing.wait("add_succeeded")
    # a progress read in flight when the connection closed ends at its request timeout (5 s)
    (failed,) = await closing.wait("flush_failed", seconds=10)
    assert failed.metadata == {"operation": "flush", "add_succeeded": True, "category": "closed"}
    assert mem.closed and mem._nc is None  # the flush did not connect again

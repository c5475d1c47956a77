"""Adversarial sizes: a ~1 MB message on every stage's subject is handled within a time bound
(the turn extracted and stored; a candidate over the size limit dead-lettered on its first
delivery), and recall keeps answering within 100 ms while it is processed (heavy pure work
runs in a thread: consumers/offload.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import nats
import pytest

from memstream.consumers.dlq import dead_letters
from memstream.schemas.memory import Candidate, Owner
from memstream.schemas.subjects import DLQ_BODY_HEADER, DLQ_REASON_HEADER, MSG_ID_HEADER
from memstream.storage.postgres import OwnerFilter

pytestmark = pytest.mark.integration

MB = 1_000_000  # NATS max_payload is 1 MiB (1,048,576 bytes): headers need the rest


def hostile_text(size: int) -> str:
    """Text that stresses every stage: sentences with cues, a long run of dots that is not
    followed by a space, repeated 'first' cues, and e-mail addresses for the redactor."""
    unit = (
        "I prefer window seats and my email is ann@example.org. My name is Ann. "
        + "." * 2_000
        + "x first first then "
    )
    return (unit * (size // len(unit) + 1))[:size]


async def recall_latencies(
    running, done: Callable[[], Awaitable[bool]], seconds: float
) -> list[float]:
    """Recall round trips (ms) from another owner, one after another, until ``done()``."""
    out: list[float] = []
    deadline = time.monotonic() + seconds
    async with running.client("acme", user="probe") as probe:
        await probe.recall("warm up", cache=False)
        while time.monotonic() < deadline:
            started = time.perf_counter()
            await probe.recall("where do I like to sit?", cache=False)
            out.append((time.perf_counter() - started) * 1000)
            if await done():
                return out
            await asyncio.sleep(0.01)
    raise AssertionError(f"not processed within {seconds:.0f} s")


async def publish_raw(running, subject: str, body: bytes, msg_id: str) -> None:
    nc = await nats.connect(running.nats_url)
    try:
        await nc.jetstream().publish(subject, body, headers={MSG_ID_HEADER: msg_id}, timeout=10)
    finally:
        await nc.close()


async def test_megabyte_turn_is_extracted_while_recall_answers(running) -> None:
    """A ~1 MB turn goes through extract, redact, dedupe and store within 60 s; meanwhile
    every recall answers within 100 ms."""
    s = running.worker.deps.subjects
    turn: dict[str, Any] = {
        "tenant": "acme",
        "user": "big",
        "event_id": "big-1",
        "messages": [{"role": "user", "content": ""}],
    }
    envelope = len(json.dumps(turn).encode())
    turn["messages"][0]["content"] = hostile_text(MB - envelope)
    body = json.dumps(turn).encode()
    assert MB - 100 <= len(body) <= MB
    flt = OwnerFilter(tenant="acme", user="big")

    async def stored() -> bool:
        return await running.drained() and bool(await running.pg.list_memories(flt))

    await publish_raw(running, s.turns("acme", "big", "default"), body, "big-1")
    latencies = await recall_latencies(running, stored, 60)
    rows = await running.pg.list_memories(flt)
    assert any(r.type.value == "episode" for r in rows)
    assert all("ann@example.org" not in r.content for r in rows)
    assert len(latencies) >= 3 and max(latencies) < 100, sorted(latencies)[-5:]


@pytest.mark.parametrize("stage", ["redact", "dedupe", "store"])
async def test_megabyte_candidate_is_dead_lettered_at_once(running, stage: str) -> None:
    """A ~1 MB candidate sent straight to a stage subject is dead-lettered on its first
    delivery, within 20 s, with the size limit as the reason; recall answers within 100 ms
    meanwhile."""
    s, js = running.worker.deps.subjects, running.worker.deps.js
    c = Candidate(
        candidate_id=f"huge-{stage}",
        owner=Owner(tenant="acme", user="huge"),
        session="s",
        content="x",
        source_event_id=f"huge-{stage}",
        occurred_at=datetime.now(UTC),
        redacted=stage != "redact",
    )
    data = json.loads(c.model_dump_json()) | {"content": ""}
    data["content"] = hostile_text(MB - len(json.dumps(data).encode()))
    body = json.dumps(data).encode()
    assert MB - 100 <= len(body) <= MB

    async def dead() -> bool:
        return bool(await dead_letters(js, s, stage, 1))

    await publish_raw(running, s.stage(stage, "acme"), body, f"huge-{stage}")
    latencies = await recall_latencies(running, dead, 20)
    (letter,) = await dead_letters(js, s, stage, 1)
    reason = letter.headers[DLQ_REASON_HEADER]
    assert "content" in reason and "50000" in reason and "gave up" not in reason
    assert len(letter.data) == len(body)  # the body is kept for inspection
    assert max(latencies) < 100, sorted(latencies)[-5:]
    assert await running.pg.count("acme") == 0


async def test_dead_letter_at_the_payload_limit_keeps_its_reason(running) -> None:
    """A body so close to max_payload that the dead-letter headers cannot travel with it is
    dead-lettered without its body (a header says so), never redelivered in a loop."""
    s, js = running.worker.deps.subjects, running.worker.deps.js
    limit = running.worker.deps.max_payload
    body = b'{"content": "' + b"x" * (limit - 150) + b'"}'

    async def dead() -> bool:
        return bool(await dead_letters(js, s, "store", 1))

    await publish_raw(running, s.stage("store", "acme"), body, "at-limit")
    await running.wait_for(dead, 20, "the dead letter")
    (letter,) = await dead_letters(js, s, "store", 1)
    assert letter.data == b"" and "over max_payload" in letter.headers[DLQ_BODY_HEADER]
    assert "invalid Candidate" in letter.headers[DLQ_REASON_HEADER]
    await running.wait_for(running.drained, 10, "the store stage to drain")

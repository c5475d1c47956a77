"""End to end through the SDK: publish -> extract -> redact -> dedupe -> store -> recall."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import nats
import pytest

from memstream.schemas.events import TurnEvent
from memstream.schemas.subjects import DLQ_REASON_HEADER, DLQ_STAGE_HEADER

pytestmark = pytest.mark.integration


@pytest.fixture(params=["fused", "batched", "single"])
def stage_mode(request: pytest.FixtureRequest) -> str:
    """Every end-to-end test runs on the three stage paths: fused batches (the default for a
    worker running every stage), batches handed on over the stage subjects (a deployment in
    several processes), and one message per handler call (what a batch falls back to)."""
    return str(request.param)


@pytest.fixture
def stage_batched(stage_mode: str) -> bool:
    return stage_mode != "single"


@pytest.fixture
def stage_fused(stage_mode: str) -> bool:
    return stage_mode == "fused"


# (fact a user states, a paraphrased question about it), with a per-tenant variant value.
FACTS = [
    (
        "My sister moved to {v} last spring and works as a nurse there.",
        "where did my sibling relocate to?",
        ("Porto", "Lyon"),
    ),
    (
        "I am allergic to {v}, so please never suggest recipes with it.",
        "which food allergy do I have?",
        ("peanuts", "shellfish"),
    ),
    (
        "Our team standup happens every weekday at {v} on the video call.",
        "when is the daily team meeting?",
        ("9:15", "10:30"),
    ),
    (
        "I drive an old {v} that keeps breaking down on the highway.",
        "which vehicle do I drive?",
        ("Volvo", "Saab"),
    ),
    (
        "My daughter's birthday party is planned at the {v} next Saturday.",
        "where is the kid's birthday celebration?",
        ("aquarium", "planetarium"),
    ),
]
FILLER_TOPICS = [
    "the weather",
    "a podcast",
    "lunch",
    "a movie",
    "the garden",
    "a board game",
    "running shoes",
    "a novel",
    "coffee beans",
    "the train schedule",
    "yoga",
    "a museum",
    "houseplants",
    "jazz records",
    "camping gear",
    "a chess opening",
]


def filler(rng: random.Random, i: int) -> str:
    a, b = rng.sample(FILLER_TOPICS, 2)
    return f"Turn {i}: thinking about {a} and maybe {b} later today."


def turns_for(client, tenant_index: int, rng: random.Random) -> list[TurnEvent]:
    events = []
    for i in range(100 - len(FACTS)):
        events.append(
            client.make_turn(
                [("user", filler(rng, i)), ("assistant", "Sounds good.")],
                session=f"s{i % 4}",
                event_id=f"t{tenant_index}-f{i}",
            )
        )
    for j, (fact, _, values) in enumerate(FACTS):
        events.append(
            client.make_turn(
                [("user", fact.format(v=values[tenant_index]))],
                session="s-facts",
                event_id=f"t{tenant_index}-fact{j}",
            )
        )
    rng.shuffle(events)
    return events


async def publish_all(client, events) -> list[Any]:
    return await asyncio.gather(*(client.publish(e) for e in events))


async def test_two_tenants_recall_dedupe_isolation(running) -> None:
    """200 turns for two tenants: planted facts come back in the top 5 for a paraphrased query,
    never the other tenant's; publishing everything again stores nothing twice."""
    rng = random.Random(7)
    clients = [running.client(f"tenant-{k}", user="alice") for k in (0, 1)]
    for c in clients:
        await c.connect()
    batches = [turns_for(c, k, rng) for k, c in enumerate(clients)]
    results = await asyncio.gather(
        *(publish_all(c, b) for c, b in zip(clients, batches, strict=True))
    )
    assert not any(r.duplicate for rs in results for r in rs)
    await running.wait_for(running.drained, 60, "ingestion to drain")
    counts = [await running.pg.count(f"tenant-{k}") for k in (0, 1)]
    assert all(n > 0 for n in counts)

    for k, client in enumerate(clients):
        other = 1 - k
        for _fact, question, values in FACTS:
            reply = await client.recall(question, top_k=5)
            texts = [h.text for h in reply.hits]
            assert any(values[k] in t for t in texts), (question, texts)
            assert not any(values[other] in t for t in texts)
            assert reply.degraded == []

    # Publish all 200 again: PubAcks say duplicate, stores do not grow.
    again = await asyncio.gather(
        *(publish_all(c, b) for c, b in zip(clients, batches, strict=True))
    )
    assert all(r.duplicate for rs in again for r in rs)
    await running.wait_for(running.drained, 30, "re-publish to drain")
    assert [await running.pg.count(f"tenant-{k}") for k in (0, 1)] == counts
    assert await running.worker.vectors.count() == sum(counts)  # one point per memory
    for c in clients:
        await c.close()


async def test_replay_after_duplicate_window_changes_nothing(running) -> None:
    """Re-delivering the same event past JetStream's duplicate check (new msg id) still stores
    one memory: writes are idempotent by deterministic ids."""
    client = running.client("tenant-r", user="bob")
    ev = client.make_turn(
        [("user", "I keep my bike in the basement storage room.")], event_id="same-event"
    )
    await client.publish(ev)
    await running.wait_for(running.drained, 20, "first ingestion")
    before = await running.pg.count("tenant-r")
    nc = await nats.connect(running.nats_url)
    js = nc.jetstream()
    subject = client.subjects.turns(ev.tenant, ev.owner, ev.session)
    await js.publish(subject, ev.model_dump_json().encode(), headers={"Nats-Msg-Id": "other-id"})
    await nc.close()
    await running.wait_for(running.drained, 20, "replay")
    assert await running.pg.count("tenant-r") == before == 1
    await client.close()


async def test_malformed_event_is_dead_lettered_and_pipeline_continues(running) -> None:
    """A malformed event lands on mem.dlq.extract with a reason; later events still flow."""
    s = running.worker.deps.subjects
    nc = await nats.connect(running.nats_url)
    js = nc.jetstream()
    dlq = await js.subscribe(s.dlq("extract"), stream=s.stream("dlq"))
    await js.publish(s.turns("tenant-x", "u", "s"), b'{"tenant": "tenant-x", "messages": "nope"}')
    await js.publish(s.turns("tenant-x", "u", "s"), b"\xff not json")
    reasons = []
    for _ in range(2):
        msg = await dlq.next_msg(timeout=15)
        assert msg.headers is not None and msg.headers[DLQ_STAGE_HEADER] == "extract"
        reasons.append(msg.headers[DLQ_REASON_HEADER])
    assert any("messages" in r for r in reasons), reasons
    assert all(r.startswith("invalid TurnEvent") for r in reasons)

    client = running.client("tenant-x", user="u")
    await client.publish_turn([("user", "The spare key is under the blue flowerpot.")])
    await running.wait_for(running.drained, 20, "good event after bad ones")
    reply = await client.recall("where is the spare key?", top_k=3)
    assert "flowerpot" in reply.hits[0].text
    info = running.worker.deps.metrics["extract"]
    assert info.dead_lettered == 2
    await client.close()
    await nc.close()


async def test_tool_and_system_messages_never_become_memories(running) -> None:
    """System prompts and tool calls/results are not stored and never recalled."""
    client = running.client("tenant-t", user="u")
    await client.publish_turn(
        [
            {"role": "system", "content": "SYSPROMPT zebra instructions"},
            {"role": "user", "content": "Book me a table for two"},
            {"role": "assistant", "content": "TOOLCALL zebra", "tool_calls": [{"name": "book"}]},
            {"role": "tool", "content": "TOOLRESULT zebra confirmed 19:00"},
            {"role": "assistant", "content": "Done, your table is booked."},
        ]
    )
    await running.wait_for(running.drained, 20, "ingestion")
    rows = await running.pg.list_memories(
        __import__("memstream.storage.postgres", fromlist=["OwnerFilter"]).OwnerFilter(
            tenant="tenant-t"
        )
    )
    assert len(rows) == 1
    assert "zebra" not in rows[0].content
    reply = await client.recall("zebra", top_k=10)
    assert all("zebra" not in h.text for h in reply.hits)
    await client.close()


async def test_email_is_never_stored_or_returned(running) -> None:
    """An email address in a turn is replaced before storage, in the episode and in the typed
    memory extracted from it, and never comes back in clear (not even a fragment)."""
    client = running.client("tenant-e", user="u")
    text = "You can reach me at jane.doe@example.com any time. My email is jane.doe@example.com."
    await client.publish_turn([("user", text)])
    await running.wait_for(running.drained, 20, "ingestion")
    reply = await client.recall("how can you reach me by email?", top_k=5)
    assert reply.hits
    dumped = reply.model_dump_json()
    assert "jane.doe@example.com" not in dumped
    assert "[EMAIL:" in reply.hits[0].text
    async with running.pg._pool.acquire() as con:
        rows = await con.fetch(
            "SELECT content, metadata::text AS m, redactions::text AS r FROM memories"
        )
    assert len(rows) == 2  # the episode and the "my email is" fact
    for row in rows:
        stored = row["content"] + row["m"] + row["r"]
        assert "jane.doe" not in stored and "example.com" not in stored
    assert sorted(json.loads(r["r"]).get("EMAIL") for r in rows) == [1, 2]
    await client.close()


async def test_recall_rejects_bad_requests_with_a_code(running) -> None:
    """A malformed recall request gets an error reply with a code, not a crash or silence."""
    from memstream.producers.client import RecallError, _decode_reply

    nc = await nats.connect(running.nats_url)
    msg = await nc.request(
        running.worker.deps.subjects.recall,
        b'{"tenant": "t", "query": "x", "api_key": "sk-SECRETVALUE"}',
        timeout=5,
    )
    await nc.close()
    with pytest.raises(RecallError) as err:
        _decode_reply(msg.data)
    assert err.value.code.value == "bad_request"
    assert "SECRETVALUE" not in str(err.value)

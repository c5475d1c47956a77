"""Hostile and malformed input against a running worker: data errors are permanent (dead
letter on the first delivery, bad_request for commands), bodies must match their subjects,
message ids are scoped by tenant, and replay only targets the project's own subjects."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import nats
import pytest
from workers import refuse_inserts

from memstream.consumers.dlq import dead_letters
from memstream.consumers.dlq import run as dlq_run
from memstream.schemas.errors import DataRejected
from memstream.schemas.memory import Candidate, Owner
from memstream.schemas.subjects import (
    DLQ_REASON_HEADER,
    DLQ_STAGE_HEADER,
    DLQ_SUBJECT_HEADER,
    MSG_ID_HEADER,
)
from memstream.storage.postgres import OwnerFilter

pytestmark = pytest.mark.integration


def turn(tenant: str, user: str, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "user": user,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


async def publish_raw(running, subject: str, body: dict[str, Any], msg_id: str) -> None:
    nc = await nats.connect(running.nats_url)
    try:
        await nc.jetstream().publish(
            subject, json.dumps(body).encode(), headers={MSG_ID_HEADER: msg_id}
        )
    finally:
        await nc.close()


async def one_dead_letter(running, stage: str):
    """The first dead letter of ``stage`` (waits for it)."""
    s, js = running.worker.deps.subjects, running.worker.deps.js

    async def arrived() -> bool:
        return bool(await dead_letters(js, s, stage, 1))

    await running.wait_for(arrived, 20, f"a dead letter from {stage}")
    return (await dead_letters(js, s, stage, 1))[0]


async def raw_command(running, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    nc = await nats.connect(running.nats_url)
    try:
        msg = await nc.request(
            running.worker.deps.subjects.cmd(verb), json.dumps(body).encode(), timeout=10
        )
    finally:
        await nc.close()
    return dict(json.loads(msg.data))


async def test_nul_in_free_text_is_removed_and_stored(running) -> None:
    """NUL characters in a message and in a metadata value are dropped at the edge: the turn
    is stored (it was retried for ~18 minutes before), without them."""
    async with running.client("acme", user="nul") as mem:
        await mem.publish_turn(
            [("user", "I prefer green\x00 tea in the morning.")], metadata={"note": "a\x00b"}
        )
    flt = OwnerFilter(tenant="acme", user="nul")

    async def stored() -> bool:
        return len(await running.pg.list_memories(flt)) >= 2

    await running.wait_for(stored, 20, "the turn to be stored")
    rows = await running.pg.list_memories(flt)
    assert all("\x00" not in r.content and r.metadata.get("note") == "ab" for r in rows)
    assert any("green tea" in r.content for r in rows)


async def test_control_characters_in_ids_dead_letter_at_once(running) -> None:
    """A turn whose user id holds a NUL is refused by the schema: dead-lettered on its first
    delivery, with the field named in the reason."""
    s = running.worker.deps.subjects
    body = turn("acme", "ev\x00il", "I prefer tea.")
    await publish_raw(running, s.turns("acme", "ev\x00il", "default"), body, "ctl-1")
    dead = await one_dead_letter(running, "extract")
    reason = dead.headers[DLQ_REASON_HEADER]
    assert "user" in reason and "gave up" not in reason
    assert "ev\x00il" not in reason  # values never reach a reason


async def test_postgres_data_errors_dead_letter_on_first_delivery(running) -> None:
    """A value Postgres refuses (here a trigger raising SQLSTATE 22023 for one text, as the
    server does for NUL or a malformed number) is permanent: the store stage dead-letters it
    on the first delivery, with the SQLSTATE, instead of retrying up to max_deliver."""
    await refuse_inserts(running.pg)
    async with running.client("acme", user="nan") as mem:
        await mem.publish_turn([("user", "The word quux-refuse is stored nowhere.")])
    dead = await one_dead_letter(running, "store")
    reason = dead.headers[DLQ_REASON_HEADER]
    assert "SQLSTATE 22023" in reason and "gave up" not in reason
    assert running.worker.deps.metrics["store"].retried == 0


async def test_pg_adapter_translates_data_errors(running) -> None:
    """At the adapter edge a NUL that bypassed the schemas becomes DataRejected (permanent)."""
    from datetime import UTC, datetime

    c = Candidate.model_construct(
        **Candidate(
            candidate_id="c1",
            owner=Owner(tenant="acme", user="u"),
            session="s",
            content="fine",
            source_event_id="e1",
            occurred_at=datetime.now(UTC),
        ).__dict__
        | {"content": "bad\x00text"}
    )
    with pytest.raises(DataRejected, match="22021"):
        await running.pg.upsert("00000000-0000-0000-0000-000000000001", "h", c)


async def test_commands_answer_bad_request_for_data_errors(running) -> None:
    """remember with NaN metadata and fact_put with a NUL in its key answer bad_request (they
    answered internal); a NUL in remembered content is dropped and the memory stored."""
    base = {"tenant": "acme", "user": "cmd"}
    nan = await raw_command(
        running, "remember", base | {"content": "x y z", "metadata": {"n": math.nan}}
    )
    assert nan["ok"] is False and nan["error"]["code"] == "bad_request"
    key = await raw_command(running, "fact_put", base | {"key": "ci\x00ty", "value": "Porto"})
    assert key["ok"] is False and key["error"]["code"] == "bad_request"
    ok = await raw_command(running, "remember", base | {"content": "my van is bl\x00ue"})
    assert ok["ok"] is True and ok["memory"]["content"] == "my van is blue"


async def test_turn_body_must_match_its_subject(running) -> None:
    """A turn naming tenant 'victim' published on tenant 'mallory''s subject is dead-lettered,
    and nothing is stored for either tenant."""
    s = running.worker.deps.subjects
    body = turn("victim", "alice", "My name is Alice and I prefer tea.")
    await publish_raw(running, s.turns("mallory", "alice", "default"), body, "spoof-1")
    dead = await one_dead_letter(running, "extract")
    assert "disagrees with its subject" in dead.headers[DLQ_REASON_HEADER]
    assert await running.pg.count("victim") == 0 and await running.pg.count("mallory") == 0


async def test_candidate_must_match_its_stage_subject(running) -> None:
    """A redacted-looking candidate of tenant 'victim' sent to the store subject of another
    tenant is dead-lettered, not stored."""
    from datetime import UTC, datetime

    s = running.worker.deps.subjects
    c = Candidate(
        candidate_id="c-spoof",
        owner=Owner(tenant="victim", user="alice"),
        session="s",
        content="planted memory",
        source_event_id="e-spoof",
        occurred_at=datetime.now(UTC),
        redacted=True,
    )
    await publish_raw(running, s.stage("store", "mallory"), json.loads(c.model_dump_json()), "x1")
    dead = await one_dead_letter(running, "store")
    assert "disagrees with its subject" in dead.headers[DLQ_REASON_HEADER]
    assert await running.pg.count("victim") == 0


async def test_same_event_id_in_two_tenants_is_stored_for_both(running) -> None:
    """Two tenants publishing the same event id inside the duplicate window both get their
    turn stored (the bare id made the second a duplicate, silently dropped)."""
    results = []
    for tenant in ("ten-a", "ten-b"):
        async with running.client(tenant, user="sam") as mem:
            results.append(
                await mem.publish_turn([("user", f"I prefer {tenant} coffee.")], event_id="same")
            )
    assert [r.duplicate for r in results] == [False, False]

    async def both() -> bool:
        return all([await running.pg.count(t) > 0 for t in ("ten-a", "ten-b")])

    await running.wait_for(both, 20, "both tenants' turns")


async def test_replay_only_targets_own_turn_and_stage_subjects(running) -> None:
    """A dead letter whose subject header names an events subject, or another namespace, is
    refused by `dlq replay` and stays; one naming a turn subject is replayed."""
    s = running.worker.deps.subjects
    js = running.worker.deps.js
    good = turn("acme", "rita", "I prefer oat milk.")
    targets = {
        "events": s.events("acme"),
        "foreign": "other.turns.acme.rita.default",
        "turns": s.turns("acme", "rita", "default"),
    }
    for name, subject in targets.items():
        await js.publish(
            s.dlq("extract"),
            json.dumps(good).encode(),
            headers={
                DLQ_SUBJECT_HEADER: subject,
                DLQ_STAGE_HEADER: "extract",
                DLQ_REASON_HEADER: "test",
                MSG_ID_HEADER: f"dl-{name}",
            },
        )
    args = argparse.Namespace(action="replay", stage="extract", limit=100)
    assert await dlq_run(args, running.settings, running.nats_url) == 0
    left = await dead_letters(js, s, "extract", 10)
    assert sorted(m.headers[DLQ_SUBJECT_HEADER] for m in left) == sorted(
        [targets["events"], targets["foreign"]]
    )

    async def replayed() -> bool:
        return bool(await running.pg.count("acme") > 0)

    await running.wait_for(replayed, 20, "the replayed turn")


@pytest.mark.parametrize("stage", ["dedupe", "store"])
async def test_a_candidate_redacted_with_another_key_is_dead_lettered(running, stage) -> None:
    """A candidate a process keyed otherwise redacted (its placeholders would not match this
    stack's, and its memory would be stored apart) is dead-lettered on its first delivery,
    the reason naming the setting and both key ids, never a key; the same candidate with
    this worker's key id is stored."""
    from datetime import UTC, datetime

    s = running.worker.deps.subjects
    mine = running.worker.deps.redactor.key_id

    def cand(cid: str, key_id: str) -> dict[str, Any]:
        c = Candidate(
            candidate_id=cid,
            owner=Owner(tenant="acme", user="keyed"),
            session="s",
            content=f"the {stage} stage takes this one",
            source_event_id=cid,
            occurred_at=datetime.now(UTC),
            redacted=True,
            key_id=key_id,
        )
        body: dict[str, Any] = json.loads(c.model_dump_json())
        return body

    await publish_raw(running, s.stage(stage, "acme"), cand("k-other", "0" * 12), "k-other")
    dead = await one_dead_letter(running, stage)
    reason = dead.headers[DLQ_REASON_HEADER]
    assert "MEMSTREAM_REDACTION_KEY" in reason and "gave up" not in reason
    assert "000000000000" in reason and mine in reason
    assert "test-key" not in reason  # the fixture's key (conftest.py)
    assert await running.pg.count("acme") == 0
    await publish_raw(running, s.stage(stage, "acme"), cand("k-mine", mine), "k-mine")

    async def stored() -> bool:
        return bool(await running.pg.count("acme") == 1)

    await running.wait_for(stored, 30, "the candidate with this worker's key id stored")

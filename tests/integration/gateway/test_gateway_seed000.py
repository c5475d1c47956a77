"""Seed 000: /memories/add, /memories/flush, /memories/search over real HTTP."""

from __future__ import annotations

from datetime import UTC, datetime

import nats
import pytest

from memstream.schemas.memory import Candidate, Owner
from memstream.schemas.subjects import MSG_ID_HEADER, msg_id

pytestmark = pytest.mark.integration


async def test_add_flush_search_returns_the_turn(gateway, tenant) -> None:
    """A turn added, then flushed, is found by search with seed 000's result fields."""
    key = await gateway.key(tenant, user="alice")
    r = await gateway.add(key, "alice", "c1", "I always drink oolong tea in the morning")
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "accepted"
    f = await gateway.flush(key, "alice", "c1")
    assert f.status_code == 200 and f.json()["status"] == "flushed", f.text
    s = await gateway.search(
        key, "alice", "what tea does alice drink?", conversation_id="c1", scope=["current_chat"]
    )
    assert s.status_code == 200, s.text
    results = s.json()["results"]
    assert results and "oolong" in results[0]["text"]
    first = results[0]
    assert first["source_scope"] == "current_chat" and first["session_id"] == "chat:c1"
    assert first["memory_type"] == "episode" and 0 <= first["score"] <= 1


BEAVER = {"app_id": "default", "project_id": "default"}


async def test_beaver_payloads_round_trip(gateway, tenant) -> None:
    """Seed 000's exact payloads: add the user prompt and the final answer, flush once, then
    search with scope current_chat+resources and top_k 8; results carry the fields Beaver
    keeps (id, session_id, text, score, source_scope, resource_uri)."""
    key = await gateway.key(tenant, user="gateway_test_user")
    add = {
        "user_id": "gateway_test_user",
        "user_key": key,
        "session_id": "chat:s-42",
        **BEAVER,
        "messages": [
            {
                "sender_id": "gateway_test_user",
                "role": "user",
                "timestamp": 1780000000000,
                "content": "Our staging database is called heron-db",
            },
            {
                "sender_id": "beaver",
                "role": "assistant",
                "timestamp": 1780000001000,
                "content": "Noted: staging runs on heron-db.",
            },
        ],
    }
    r = await gateway.http.post("/memories/add", json=add)
    assert r.status_code == 202, r.text
    flush = {k: add[k] for k in ("user_id", "user_key", "session_id", "app_id", "project_id")}
    r = await gateway.http.post("/memories/flush", json=flush)
    assert r.status_code == 200 and r.json()["status"] == "flushed"
    search = {
        "user_id": "gateway_test_user",
        "user_key": key,
        "conversation_id": "s-42",
        "query": "what is the staging database called?",
        "scope": ["current_chat", "resources"],
        "top_k": 8,
        **BEAVER,
    }
    r = await gateway.http.post("/memories/search", json=search)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results and "heron-db" in results[0]["text"]
    assert "beaver: Noted" in results[0]["text"]  # the final answer is part of the turn
    for res in results:
        assert {"id", "session_id", "text", "score", "source_scope", "resource_uri"} <= set(res)
        assert res["source_scope"] in ("current_chat", "resources")


async def test_retried_add_creates_one_memory(gateway, tenant) -> None:
    """The same add sent twice (a retry) is one turn and one memory; an Idempotency-Key makes
    a retry with a different timestamp one turn too, but not another turn sent with the same
    key, nor the same turn sent to another project."""
    key = await gateway.key(tenant, user="u")
    first = await gateway.add(key, "u", "r1", "the locker code is kept by facilities")
    again = await gateway.add(key, "u", "r1", "the locker code is kept by facilities")
    assert first.json()["event_id"] == again.json()["event_id"] and again.json()["duplicate"]
    h = {"Idempotency-Key": "turn-7"}
    msg = {"sender_id": "u", "role": "user", "content": "badge renewals happen in March"}
    body = {"user_id": "u", "user_key": key, "session_id": "chat:r1"}
    a = await gateway.http.post(
        "/memories/add", json={**body, "messages": [{**msg, "timestamp": 1}]}, headers=h
    )
    b = await gateway.http.post(
        "/memories/add", json={**body, "messages": [{**msg, "timestamp": 2}]}, headers=h
    )
    assert a.status_code == b.status_code == 202 and b.json()["duplicate"] is True
    # the header reused for another turn, and the turn sent again to another project: each
    # is stored (both were taken for retries and dropped)
    other = {**msg, "content": "parking permits renew in April", "timestamp": 3}
    c = await gateway.http.post("/memories/add", json={**body, "messages": [other]}, headers=h)
    d = await gateway.http.post(
        "/memories/add",
        json={**body, "project_id": "p2", "messages": [{**msg, "timestamp": 1}]},
        headers=h,
    )
    assert c.status_code == d.status_code == 202
    assert c.json()["duplicate"] is False and d.json()["duplicate"] is False
    assert (await gateway.flush(key, "u", "r1")).json()["status"] == "flushed"
    r = await gateway.search(key, "u", "locker code badge renewals parking", top_k=-1)
    episodes = [x for x in r.json()["results"] if x["memory_type"] == "episode"]
    assert len(episodes) == 3, episodes


async def test_empty_search_and_missing_turns(gateway, tenant) -> None:
    """A search that finds nothing is 200 with an empty list; a flush of a session with no
    turns returns flushed at once."""
    key = await gateway.key(tenant, user="u")
    r = await gateway.search(
        key, "u", "anything at all", conversation_id="none", scope=["current_chat"]
    )
    assert r.status_code == 200 and r.json()["results"] == []
    r = await gateway.flush(key, "u", "none")
    assert r.status_code == 200 and r.json()["status"] == "flushed"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"scope": []}, "scope"),
        ({"scope": ["everything"]}, "scope"),
        ({"scope": ["resources", "resources"]}, "twice"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 101}, "top_k"),
        ({"top_k": -2}, "top_k"),
        ({"query": ""}, "query"),
        ({"scope": ["current_chat"], "conversation_id": None}, "conversation_id"),
        ({"user_id": ""}, "user_id"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
async def test_search_validation(gateway, tenant, change, where) -> None:
    """Empty/unknown/repeated scopes, top_k outside -1|1..100, empty query, current_chat
    without a conversation, empty user_id, unknown fields: 422 naming the field."""
    key = await gateway.key(tenant, user="u")
    body = {"user_id": "u", "user_key": key, "query": "q", "conversation_id": "c", **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = await gateway.http.post("/memories/search", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "validation_error" and where in r.json()["message"]
    assert key not in r.text


@pytest.mark.parametrize(
    "change",
    [
        {"session_id": "s1"},
        {"messages": []},
        {"messages": [{"sender_id": "u", "role": "user", "timestamp": 0, "content": "x"}]},
        {"messages": [{"sender_id": "u", "role": "robot", "timestamp": 1, "content": "x"}]},
        {
            "messages": [
                {"sender_id": "u", "role": "user", "timestamp": 5, "content": "x"},
                {"sender_id": "a", "role": "assistant", "timestamp": 4, "content": "y"},
            ]
        },
        # control characters: accepted by a looser rule, they failed the turn's wire schema (500)
        {"messages": [{"sender_id": "u\x1f", "role": "user", "timestamp": 1, "content": "x"}]},
        {"session_id": "chat:s\x07"},
        {"app_id": "a\x85"},
    ],
)
async def test_add_validation(gateway, tenant, change) -> None:
    """session_id must be chat:<id>; messages non-empty with positive, non-decreasing ms
    timestamps and a known role; identifiers without control characters: else 422."""
    key = await gateway.key(tenant, user="u")
    body = {
        "user_id": "u",
        "user_key": key,
        "session_id": "chat:s1",
        "messages": [{"sender_id": "u", "role": "user", "timestamp": 1, "content": "x"}],
        **change,
    }
    r = await gateway.http.post("/memories/add", json=body)
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"code", "message"}


async def test_malformed_json_is_422(gateway) -> None:
    """A body that is not JSON gets the JSON error shape, not a crash."""
    for path in ("/memories/search", "/memories/add", "/memories/flush"):
        r = await gateway.http.post(
            path, content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 422 and r.json()["code"] == "validation_error"


async def test_unprocessed_turns_and_pending_flush(gateway, tenant) -> None:
    """With the stages stopped, an added turn is returned by current_chat search as
    unprocessed_message, and flush times out with 202 saying what is pending, by default
    within seed 000's client timeout."""
    key = await gateway.key(tenant, user="u")
    warm = await gateway.search(key, "u", "warm the key cache")  # resolves the key first
    assert warm.status_code == 200
    await gateway.running.worker.broker.stop()  # stages and commands stop; recall stays up
    r = await gateway.add(key, "u", "p1", "the printer on floor 3 jams on A3 paper")
    assert r.status_code == 202
    s = await gateway.search(
        key, "u", "printer", conversation_id="p1", scope=["current_chat", "all_user_memory"]
    )
    assert s.status_code == 200, s.text
    res = s.json()["results"]
    assert [x["memory_type"] for x in res] == ["unprocessed_message"]
    assert "A3 paper" in res[0]["text"] and res[0]["score"] is None
    f = await gateway.flush(key, "u", "p1", timeout_s=0.5)
    assert f.status_code == 202, f.text
    assert f.json()["status"] == "pending"
    assert f.json()["pending"]["turns_waiting_for_extract"] is True
    # seed 000's client sends no timeout_s and gives up after 10 s: it hears pending first
    # (the default was 30 s, so it timed out)
    body = {"user_id": "u", "user_key": key, "session_id": "chat:p1"}
    f = await gateway.http.post("/memories/flush", json=body, timeout=10)
    assert f.status_code == 202 and f.json()["status"] == "pending", f.text


async def test_unprocessed_turns_are_the_callers_own_and_count_in_top_k(gateway, tenant) -> None:
    """Unprocessed turns of one conversation by alice alone and by alice with the agent
    helper: each owner's current_chat search returns its own turn only (the turns share a
    subject; before, both searches returned both), and no more of them than top_k."""
    key = await gateway.key(tenant, user="alice")
    assert (await gateway.search(key, "alice", "warm the key cache")).status_code == 200
    await gateway.running.worker.broker.stop()  # stages and commands stop; recall stays up
    for agent, text in ((None, "alice alone: weather talk"), ("helper", "with helper: a plan")):
        extra = {"agent_id": agent} if agent else {}
        assert (await gateway.add(key, "alice", "c1", text, **extra)).status_code == 202
        assert (await gateway.add(key, "alice", "c1", f"{text}, again", **extra)).status_code == 202
    for agent, mine in ((None, "alice alone"), ("helper", "with helper")):
        extra = {"agent_id": agent} if agent else {}
        r = await gateway.search(
            key, "alice", "talk", conversation_id="c1", scope=["current_chat"], top_k=5, **extra
        )
        assert r.status_code == 200, r.text
        res = r.json()["results"]
        assert len(res) == 2 and all(mine in x["text"] for x in res), res
        assert {(x["user_id"], x["agent_id"]) for x in res} == {("alice", agent)}
        r = await gateway.search(
            key, "alice", "talk", conversation_id="c1", scope=["current_chat"], top_k=1, **extra
        )
        assert [mine in x["text"] for x in r.json()["results"]] == [True]


async def test_oversized_turns_are_413(gateway, tenant) -> None:
    """A turn larger than a NATS message is 413 `too_large`, and so is a body over 8 MiB:
    never a 5xx."""
    key = await gateway.key(tenant, user="u")
    r = await gateway.add(key, "u", "big", "x" * 600_000, "y" * 600_000)
    assert r.status_code == 413 and r.json()["code"] == "too_large", r.text
    r = await gateway.http.post(
        "/memories/add",
        content=b"{" + b" " * (9 * 1024 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and r.json()["code"] == "too_large"


async def test_agent_id_does_not_lift_the_user_binding(gateway, tenant) -> None:
    """With agent_id, a key bound to alice still cannot name user bob (403)."""
    key = await gateway.key(tenant, user="alice")
    r = await gateway.search(key, "bob", "q", agent_id="helper")
    assert r.status_code == 403 and r.json()["code"] == "forbidden"


async def test_flush_counts_only_the_callers_own_candidates_in_stages(gateway, tenant) -> None:
    """A candidate of bob held in the stages is not in alice's flush (200, 0 candidates: it
    counted the whole tenant, so alice waited for bob and learnt his backlog), nor in the
    flush of alice with the agent helper; bob's own flush counts it."""
    keys = {u: await gateway.key(tenant, user=u) for u in ("alice", "bob")}
    for u, k in keys.items():  # resolve the keys while the workers still answer
        assert (await gateway.search(k, u, "warm the key cache")).status_code == 200
    await gateway.running.worker.broker.stop()  # stages stop: what is in them stays there
    s = gateway.running.worker.deps.subjects
    held = Candidate(
        candidate_id="bob-held-1",
        owner=Owner(tenant=tenant, user="bob"),
        session="chat:b1",
        content="bob's candidate waiting for redact",
        source_event_id="bob-turn-1",
        occurred_at=datetime.now(UTC),
    )
    nc = await nats.connect(gateway.running.nats_url)
    try:
        await nc.jetstream().publish(
            s.stage("redact", tenant, held.owner.key),
            held.model_dump_json().encode(),
            headers={MSG_ID_HEADER: msg_id(tenant, "redact:bob-held-1")},
        )
    finally:
        await nc.close()
    for extra in ({}, {"agent_id": "helper"}):
        f = await gateway.flush(keys["alice"], "alice", "a1", timeout_s=0.5, **extra)
        assert f.status_code == 200 and f.json()["status"] == "flushed", f.text
        assert f.json()["pending"]["candidates_in_stages"] == 0
    f = await gateway.flush(keys["bob"], "bob", "b1", timeout_s=0.5)
    assert f.status_code == 202 and f.json()["pending"]["candidates_in_stages"] == 1, f.text

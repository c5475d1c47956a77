"""Seed 002: /api/v1/memory/* over real HTTP with Bearer keys."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from memstream.storage.postgres import OwnerFilter

pytestmark = pytest.mark.integration


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_remember_high_salience_is_stored_everywhere_and_promoted(gateway, tenant) -> None:
    """salience >= 0.7: 201, memory_id, stored_in postgres+qdrant, and a fact; recall finds
    both with source memory and fact, similarity_score, created_at; the repeat is cached."""
    key = await gateway.key(tenant)  # a tenant-wide service key serves every client_id
    body = {
        "content": "Client prefers meetings after 2pm on Tuesdays",
        "client_id": 1,
        "memory_type": "event",
        "memory_scope": "user",
        "salience_hint": 0.8,
        "metadata": {"channel": "email"},
    }
    r = await gateway.http.post("/api/v1/memory/remember", json=body, headers=auth(key))
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["memory_id"] and out["stored_in"] == ["postgres", "qdrant"] and out["fact_id"]
    params = {"query": "scheduling preferences meetings", "client_id": "1", "k": 10}
    r = await gateway.http.get("/api/v1/memory/recall", params=params, headers=auth(key))
    assert r.status_code == 200, r.text
    rec = r.json()
    assert rec["result_count"] == len(rec["results"]) >= 2 and rec["cached"] is False
    assert {x["source"] for x in rec["results"]} == {"memory", "fact"}
    for x in rec["results"]:
        assert 0 <= x["similarity_score"] <= 1 and datetime.fromisoformat(x["created_at"])
    ranked = [x["similarity_score"] for x in rec["results"]]
    assert ranked == sorted(ranked, reverse=True)
    r = await gateway.http.get("/api/v1/memory/recall", params=params, headers=auth(key))
    assert r.json()["cached"] is True and r.json()["results"] == rec["results"]


async def test_low_salience_is_not_promoted(gateway, tenant) -> None:
    """salience 0.5: stored, no fact; the scenarios' name for it, salience_score, is taken
    as well as the contract's salience_hint (it was refused as an extra field)."""
    key = await gateway.key(tenant, user="7")
    body = {"content": "Client mentioned the office plants", "client_id": 7, "salience_hint": 0.5}
    r = await gateway.http.post("/api/v1/memory/remember", json=body, headers=auth(key))
    assert r.status_code == 201 and r.json()["fact_id"] is None
    body = {"content": "Client signs every contract in blue ink", "client_id": 7}
    for salience, promoted in ((0.5, False), (0.9, True)):
        r = await gateway.http.post(
            "/api/v1/memory/remember", json={**body, "salience_score": salience}, headers=auth(key)
        )
        assert r.status_code == 201, r.text
        assert (r.json()["fact_id"] is not None) is promoted


async def test_index_down_reports_only_postgres(gateway, tenant) -> None:
    """With the vector index unreachable, remember still succeeds with stored_in ["postgres"]
    and recall answers from Postgres, marked degraded."""
    key = await gateway.key(tenant)
    async with gateway.running.index_away():
        body = {"content": "Client asked for invoices in PDF", "client_id": 3}
        r = await gateway.http.post("/api/v1/memory/remember", json=body, headers=auth(key))
        assert r.status_code == 201, r.text
        assert r.json()["stored_in"] == ["postgres"]
        # recall degrades to Postgres full-text search instead of failing
        r = await gateway.http.get(
            "/api/v1/memory/recall",
            params={"query": "invoices PDF", "client_id": "3"},
            headers=auth(key),
        )
        assert r.status_code == 200 and r.json()["degraded"] == ["vector_index"], r.text
        assert "PDF" in r.json()["results"][0]["content"]


async def test_facts_create_and_update_close_the_old_version(gateway, tenant) -> None:
    """POST /facts opens a version (valid_to null); /facts/{id}/update closes it and opens
    the next; recall returns the new one as a fact."""
    key = await gateway.key(tenant, user="1")
    fact = {
        "subject_type": "user",
        "subject_id": "1",
        "fact_type": "preference",
        "content": "prefers espresso",
        "salience_score": 0.8,
    }
    r = await gateway.http.post("/api/v1/memory/facts", json=fact, headers=auth(key))
    assert r.status_code == 201, r.text
    old = r.json()
    assert old["valid_to"] is None and old["valid_from"] and old["zep_fact_id"] is None
    r = await gateway.http.post(
        f"/api/v1/memory/facts/{old['fact_id']}/update",
        json={"content": "prefers flat white"},
        headers=auth(key),
    )
    assert r.status_code == 200, r.text
    new = r.json()
    assert new["fact_id"] != old["fact_id"] and new["previous_fact_id"] == old["fact_id"]
    assert new["valid_to"] is None and new["previous_valid_to"] is not None
    r = await gateway.http.post(
        f"/api/v1/memory/facts/{old['fact_id']}/update", json={"content": "x"}, headers=auth(key)
    )
    assert r.status_code in (404, 409) and set(r.json()) == {"code", "message"}
    r = await gateway.http.get(
        "/api/v1/memory/recall",
        params={"query": "coffee espresso flat white", "client_id": "1"},
        headers=auth(key),
    )
    texts = [x["content"] for x in r.json()["results"] if x["source"] == "fact"]
    assert any("flat white" in t for t in texts) and not any("espresso" in t for t in texts)


async def test_updates_of_one_version_side_by_side_make_one_new_version(gateway, tenant) -> None:
    """Four updates of the same version at once: one wins (200), the others are 409 conflict,
    and the fact's history is the old version and the winner's, not a fork of four."""
    key = await gateway.key(tenant, user="1")
    fact = {"subject_type": "user", "subject_id": "1", "fact_type": "preference"}
    r = await gateway.http.post(
        "/api/v1/memory/facts", json={**fact, "content": "sits by the window"}, headers=auth(key)
    )
    assert r.status_code == 201, r.text
    fid = r.json()["fact_id"]
    answers = await asyncio.gather(
        *(
            gateway.http.post(
                f"/api/v1/memory/facts/{fid}/update",
                json={"content": f"sits in row {n}"},
                headers=auth(key),
            )
            for n in range(4)
        )
    )
    assert sorted(a.status_code for a in answers) == [200, 409, 409, 409], [a.text for a in answers]
    won = next(a.json() for a in answers if a.status_code == 200)
    assert won["previous_fact_id"] == fid
    conflict = next(a.json() for a in answers if a.status_code == 409)
    assert conflict["code"] == "conflict" and set(conflict) == {"code", "message"}
    owner = OwnerFilter(tenant=tenant, user="1")
    history = await gateway.running.pg.fact_history(owner, won["key"])
    assert [m.id for m in history] == [fid, won["fact_id"]]


async def test_a_recall_is_in_the_events_table_cached_or_not(gateway, tenant) -> None:
    """Seed 002 logs every memory operation in the events table: a recall writes a
    memory_recall row with the caller and the ids it returned, never the query, and so does
    the same recall answered from the cache."""
    key = await gateway.key(tenant, user="3")
    body = {
        "client_id": "3",
        "content": "The weekly sync moved to Thursdays at ten",
        "memory_type": "decision",
        "salience_hint": 0.5,
    }
    r = await gateway.http.post("/api/v1/memory/remember", json=body, headers=auth(key))
    assert r.status_code == 201, r.text
    mid = r.json()["memory_id"]
    params = {"query": "when is the weekly sync QUERY-TEXT-31", "client_id": "3"}
    answers = []
    for _ in range(2):
        r = await gateway.http.get("/api/v1/memory/recall", params=params, headers=auth(key))
        assert r.status_code == 200, r.text
        answers.append(r.json())
    assert [a["cached"] for a in answers] == [False, True]
    rows: list[dict[str, Any]] = []
    for _ in range(100):  # the row is written after the answer went out
        rows = [
            e for e in await gateway.running.pg.events_for(tenant) if e["kind"] == "memory_recall"
        ]
        if len(rows) == 2:
            break
        await asyncio.sleep(0.05)
    assert [r["detail"] for r in rows] == [{"user": "3", "agent": None, "memory_ids": [mid]}] * 2
    assert "QUERY-TEXT" not in json.dumps(rows, default=str)


async def test_scopes_filter_and_lifecycles(gateway, tenant) -> None:
    """scopes=["user","global"] excludes run and session memories; session memories expire
    after 24 h; ending a run erases its memories."""
    key = await gateway.key(tenant, user="5")
    h = auth(key)
    mk = {"client_id": 5, "salience_hint": 0.3}
    for scope, extra in (("user", {}), ("global", {}), ("session", {}), ("run", {"run_id": "r1"})):
        body = {
            **mk,
            "content": f"quarterly budget note kept in {scope} scope",
            "memory_scope": scope,
            **extra,
        }
        r = await gateway.http.post("/api/v1/memory/remember", json=body, headers=h)
        assert r.status_code == 201, r.text
        if scope == "session":
            assert r.json()["expires_at"] is not None
            left = datetime.fromisoformat(r.json()["expires_at"]) - datetime.now().astimezone()
            assert timedelta(hours=23) < left <= timedelta(hours=24)
    q = {"query": "quarterly budget note", "client_id": "5"}
    r = await gateway.http.get(
        "/api/v1/memory/recall", params={**q, "scopes": '["user","global"]'}, headers=h
    )
    assert {x["scope"] for x in r.json()["results"]} == {"user", "global"}
    r = await gateway.http.get("/api/v1/memory/recall", params={**q, "scopes": "run"}, headers=h)
    assert [x["scope"] for x in r.json()["results"]] == ["run"]
    r = await gateway.http.post("/api/v1/memory/runs/r1/end", headers=h)
    assert r.status_code == 200 and r.json()["expired"] == 1
    r = await gateway.http.get("/api/v1/memory/recall", params={**q, "scopes": "run"}, headers=h)
    assert r.json()["results"] == []


async def test_promoted_facts_keep_their_memory_s_scope_and_lifecycle(gateway, tenant) -> None:
    """High-salience session and run memories are promoted to facts of the same scope, text
    and expiry: scopes=["user","global"] returns neither (before, both came back as user
    facts, their text behind a redacted key), the session's fact expires with its memory, and
    ending the run erases the run's fact too."""
    key = await gateway.key(tenant, user="6")
    h = auth(key)
    ids = {}
    for scope, extra in (("session", {}), ("run", {"run_id": "r6"})):
        body = {
            "client_id": 6,
            "salience_hint": 0.9,
            "content": f"the {scope} budget figure is 4242",
            "memory_scope": scope,
            **extra,
        }
        r = await gateway.http.post("/api/v1/memory/remember", json=body, headers=h)
        assert r.status_code == 201 and r.json()["fact_id"], r.text
        ids[scope] = r.json()
    q = {"query": "budget figure 4242", "client_id": "6"}
    r = await gateway.http.get(
        "/api/v1/memory/recall", params={**q, "scopes": '["user","global"]'}, headers=h
    )
    assert r.status_code == 200 and r.json()["results"] == [], r.text
    r = await gateway.http.get(
        "/api/v1/memory/recall", params={**q, "scopes": "session"}, headers=h
    )
    facts = [x for x in r.json()["results"] if x["source"] == "fact"]
    assert [(x["scope"], x["content"]) for x in facts] == [
        ("session", "the session budget figure is 4242")
    ]
    owner = OwnerFilter(tenant=tenant, user="6")
    fact = await gateway.running.pg.get(owner, ids["session"]["fact_id"])
    memory = await gateway.running.pg.get(owner, ids["session"]["memory_id"])
    assert fact.expires_at is not None and fact.expires_at == memory.expires_at
    assert fact.importance == pytest.approx(0.9)  # a float4 column
    r = await gateway.http.post("/api/v1/memory/runs/r6/end", headers=h)
    assert r.status_code == 200 and r.json()["expired"] == 2, r.text
    r = await gateway.http.get("/api/v1/memory/recall", params={**q, "scopes": "run"}, headers=h)
    assert r.json()["results"] == []


async def test_a_tenant_key_s_fact_about_a_user_is_that_client_s(gateway, tenant) -> None:
    """The seed's own body (no client_id) with a tenant-wide key: the fact about user 4 is
    client 4's, and client 4's recall finds it (before: 422, name a user or an agent); about
    a workflow, the key must still name the client."""
    key = await gateway.key(tenant)
    fact = {
        "subject_type": "user",
        "subject_id": "4",
        "fact_type": "constraint",
        "content": "never call before 9am",
        "salience_score": 0.8,
    }
    r = await gateway.http.post("/api/v1/memory/facts", json=fact, headers=auth(key))
    assert r.status_code == 201, r.text
    r = await gateway.http.get(
        "/api/v1/memory/recall",
        params={"query": "call before 9am", "client_id": "4"},
        headers=auth(key),
    )
    assert [x["content"] for x in r.json()["results"]] == ["never call before 9am"], r.text
    r = await gateway.http.post(
        "/api/v1/memory/facts", json={**fact, "subject_type": "workflow"}, headers=auth(key)
    )
    assert r.status_code == 422 and r.json()["code"] == "validation_error", r.text


async def test_a_fact_is_its_statement_with_its_salience(gateway, tenant) -> None:
    """POST /facts stores the statement as sent (not behind its key) with the salience
    given, and an update keeps that salience."""
    key = await gateway.key(tenant, user="2")
    fact = {
        "subject_type": "user",
        "subject_id": "2",
        "fact_type": "preference",
        "content": "prefers tea",
        "salience_score": 0.3,
    }
    r = await gateway.http.post("/api/v1/memory/facts", json=fact, headers=auth(key))
    assert r.status_code == 201 and r.json()["content"] == "prefers tea", r.text
    r = await gateway.http.post(
        f"/api/v1/memory/facts/{r.json()['fact_id']}/update",
        json={"content": "prefers green tea"},
        headers=auth(key),
    )
    assert r.status_code == 200 and r.json()["content"] == "prefers green tea", r.text
    owner = OwnerFilter(tenant=tenant, user="2")
    assert (await gateway.running.pg.get(owner, r.json()["fact_id"])).importance == pytest.approx(
        0.3
    )


@pytest.mark.parametrize(
    "body",
    [
        {"content": "x", "client_id": 1, "metadata": {f"k{i}": i for i in range(63)}},
        {"content": "x", "client_id": 1, "metadata": {"salience": "mine"}},
        {"content": "x", "client_id": 1, "metadata": {"client_id": 2}},
        {"content": "x", "client_id": 1, "salience_hint": 1.5},
        {"content": "x", "client_id": 1, "memory_scope": "forever"},
        {"content": "x", "client_id": 1, "memory_type": "gossip"},
        {"content": "", "client_id": 1},
        {"content": "x"},
        {"content": "x", "client_id": 1, "memory_scope": "run"},
        {"content": "x", "client_id": 1, "metadata": {"nested": {"no": 1}}},
    ],
)
async def test_remember_validation(gateway, tenant, body) -> None:
    """Out-of-range salience, unknown scope/type, empty content, missing client_id, a run
    memory without run_id, non-scalar metadata, more metadata keys than the gateway leaves
    room for (it was bad_request from the worker), a key the gateway sets (it was silently
    overwritten): 422 validation_error with the error shape."""
    key = await gateway.key(tenant)
    r = await gateway.http.post("/api/v1/memory/remember", json=body, headers=auth(key))
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"code", "message"} and r.json()["code"] == "validation_error"


@pytest.mark.parametrize(
    "params",
    [
        {"query": "q", "client_id": "1", "k": 0},
        {"query": "q", "client_id": "1", "k": 101},
        {"query": "", "client_id": "1"},
        {"query": "q"},
        {"query": "q", "client_id": "1", "scopes": "forever"},
        {"query": "q", "client_id": "1", "scopes": "[1,"},
    ],
)
async def test_recall_validation(gateway, tenant, params) -> None:
    """k outside 1..100, empty query, missing client_id, unknown or malformed scopes: 422."""
    key = await gateway.key(tenant)
    r = await gateway.http.get("/api/v1/memory/recall", params=params, headers=auth(key))
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "validation_error"


async def test_user_bound_key_serves_only_its_client(gateway, tenant) -> None:
    """A key bound to user 1 cannot remember or recall for client 2 (403)."""
    key = await gateway.key(tenant, user="1")
    r = await gateway.http.post(
        "/api/v1/memory/remember", json={"content": "x", "client_id": 2}, headers=auth(key)
    )
    assert r.status_code == 403
    r = await gateway.http.get(
        "/api/v1/memory/recall", params={"query": "x", "client_id": "2"}, headers=auth(key)
    )
    assert r.status_code == 403

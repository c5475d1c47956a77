"""Seed 000's security rules on the gateway: keys stay secret, wrong keys are 401, and no
read crosses a tenant or an owner."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.integration


def pieces(key: str) -> list[str]:
    """Every 8-character window of the key: no part of it may show."""
    return [key[i : i + 8] for i in range(0, len(key) - 7)]


async def test_key_never_in_responses_or_logs(gateway, tenant, caplog, capfd) -> None:
    """Right, wrong, malformed and over-long keys on every route, also sent as a field's name
    and a map's key: no response body, header, error or log line holds any 8-character piece
    of a key (a field's name was repeated in its 422)."""
    caplog.set_level(logging.DEBUG)
    # this test's own HTTP client logs each URL it requests, a key in a query string too
    # (the gateway logs no URL: uvicorn's access log is off)
    caplog.set_level(logging.WARNING, logger="httpx")
    key = await gateway.key(tenant, user="u")
    wrong = key[:-4] + "AAAA"
    long = key * 10
    seen: list[str] = []
    for k in (key, wrong, long, "msk_" + "x" * 40):
        r = await gateway.add(k, "u", "s", "hello there")
        seen.append(r.text + str(r.headers))
        r = await gateway.search(k, "u", "hello", conversation_id="s", scope=["current_chat"])
        seen.append(r.text + str(r.headers))
        r = await gateway.flush(k, "u", "s", timeout_s=5)
        seen.append(r.text + str(r.headers))
        r = await gateway.search(k, "u", "q", top_k=0)  # a validation error with the key in
        seen.append(r.text)
        r = await gateway.search(k, 123, "q")  # a type error next to the key
        seen.append(r.text)
        r = await gateway.search(k, "u", "q", **{k: 1})  # the key sent as a field's name
        seen.append(r.text)
        since = json.dumps({k: "not a time"})  # ... and as a map's key
        r = await gateway.http.get(
            "/api/agent-memory/pending-review",
            params={"since": since},
            headers={"Authorization": f"Bearer {k}"},
        )
        seen.append(r.text)
        h = {"Authorization": f"Bearer {k}"}
        for path, body in (
            (
                "/api/agent-memory/commit",
                {"agent_name": "a", "content": "x", "memory_type": "lesson_learned"},
            ),
            ("/api/agent-memory/query", {"agent_name": "a", "query": "x", "limit": 99}),
            ("/api/v1/memory/remember", {"content": "x", "client_id": "u"}),
        ):
            r = await gateway.http.post(path, json=body, headers=h)
            seen.append(r.text + str(r.headers))
    out, err = capfd.readouterr()
    logs = "\n".join(rec.getMessage() for rec in caplog.records) + out + err
    for k in (key, wrong):
        for p in pieces(k[4:]):  # the "msk_" prefix is public
            assert all(p not in s for s in seen), "a response holds part of a key"
            assert p not in logs, "a log line holds part of a key"


async def test_wrong_and_missing_keys_are_401(gateway, tenant) -> None:
    """A wrong, revoked, missing or non-Bearer key gets 401 with the JSON shape."""
    key = await gateway.key(tenant, user="u")
    revoked = await gateway.key(tenant, user="u")
    assert await gateway.running.pg.revoke_api_key(revoked)
    for k in (key + "x", "", None, revoked):
        body = {"user_id": "u", "query": "q", "scope": ["all_user_memory"]}
        if k is not None:
            body["user_key"] = k
        r = await gateway.http.post("/memories/search", json=body)
        assert r.status_code == 401, (k is None, r.text)
        assert r.json()["code"] == "unauthorized"
    for h in (
        {},
        {"Authorization": key},
        {"Authorization": "Bearer nope"},
        {"Authorization": "Basic abc"},
    ):
        r = await gateway.http.get(
            "/api/v1/memory/recall", params={"query": "q", "client_id": "u"}, headers=h
        )
        assert r.status_code == 401 and r.json()["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"


async def test_no_read_crosses_tenants_or_owners(gateway, tenant) -> None:
    """Tenant B's key cannot see tenant A's memories (same user name); a tenant-wide key of
    A searching user bob does not see alice's; alice's key cannot name bob (403)."""
    a_alice = await gateway.key(tenant, user="alice")
    await gateway.add(a_alice, "alice", "c", "the vault combination is in the blue binder")
    assert (await gateway.flush(a_alice, "alice", "c")).json()["status"] == "flushed"
    mine = await gateway.search(a_alice, "alice", "vault combination blue binder")
    assert mine.json()["results"], "the owner finds it"
    b_alice = await gateway.key(tenant + "-b", user="alice")
    r = await gateway.search(b_alice, "alice", "vault combination blue binder", top_k=-1)
    assert r.status_code == 200 and r.json()["results"] == []
    service = await gateway.key(tenant)
    r = await gateway.search(service, "bob", "vault combination blue binder", top_k=-1)
    assert r.status_code == 200 and r.json()["results"] == []
    r = await gateway.search(a_alice, "bob", "vault combination")
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = await gateway.flush(a_alice, "bob", "c")
    assert r.status_code == 403
    r = await gateway.http.get(
        "/api/v1/memory/recall",
        params={"query": "vault combination", "client_id": "alice"},
        headers={"Authorization": f"Bearer {b_alice}"},
    )
    assert r.status_code == 200 and r.json()["results"] == []


async def test_worker_refuses_another_owner_than_the_key(gateway, tenant) -> None:
    """The worker itself (not only the gateway) refuses a request that names another owner
    than its key's: an SDK client with alice's key asking as bob is unauthorized."""
    from memstream.producers.client import RecallError

    key = await gateway.key(tenant, user="alice")
    async with gateway.running.client(tenant, user="bob", api_key=key) as mem:
        with pytest.raises(RecallError) as info:
            await mem.recall("anything", cache=False)
    assert info.value.code.value == "unauthorized" and key not in str(info.value)
    async with gateway.running.client(tenant, user="alice", api_key=key) as mem:
        assert (await mem.recall("anything", cache=False)).hits == []


async def test_pipeline_down_is_503_and_healthz_names_it(gateway, tenant) -> None:
    """With no worker answering, the gateway stays up: routes give 503 `unavailable` and
    /healthz says the workers are missing."""
    r = await gateway.http.get("/healthz")
    assert r.status_code == 200 and r.json()["missing"] == []
    key = await gateway.key(tenant, user="u")
    await gateway.running.worker.stop()
    try:
        r = await gateway.http.get("/healthz")
        assert r.status_code == 503 and r.json()["missing"] == ["workers"]
        r = await gateway.search(key, "u", "q")
        assert r.status_code == 503 and r.json()["code"] == "unavailable"
        assert set(r.json()) == {"code", "message"}
    finally:
        await gateway.running.worker.start()


async def test_nats_unreachable_is_503_and_healthz_names_it(running) -> None:
    """A gateway whose NATS cannot be reached starts and answers: 503 on routes, /healthz
    names nats as missing."""
    import socket

    import httpx

    from memstream.gateway.cli import start_gateway

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = running.settings.model_copy(update={"nats_url": f"nats://127.0.0.1:{port}"})
    server = await start_gateway(settings, settings.nats_url, "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            r = await http.get("/healthz")
            assert r.status_code == 503 and r.json()["missing"] == ["nats"]
            r = await http.post(
                "/memories/search",
                json={"user_id": "u", "user_key": "k", "query": "q", "scope": ["resources"]},
            )
            assert r.status_code == 503 and r.json()["code"] == "unavailable"
    finally:
        await server.stop()


def _sent_in_pieces(url: str, head: bytes) -> bytes:
    """``head`` sent in 16 KB pieces with a pause between (as a slow or busy client's
    arrive); everything the server answers until it closes."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        for lo in range(0, len(head), 16 * 1024):
            s.sendall(head[lo : lo + 16 * 1024])
            time.sleep(0.02)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


async def test_a_long_query_string_gets_its_answer_however_it_arrives(gateway, tenant) -> None:
    """A query string within the routes' limits (``filters`` of 10,000 four-byte characters:
    120 KB percent-encoded) that reaches the gateway in pieces gets the route's answer in
    the error shape, not a plain-text 400 and a reset (uvicorn's default refuses a head once
    16 KB of it wait incomplete)."""
    key = await gateway.key(tenant, user="u")
    filters = quote("\U0002d0e5" * 10_000)
    head = (
        f"DELETE /v1/memories/?user_id=u&filters={filters} HTTP/1.1\r\n"
        f"Host: gateway\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    ).encode()
    assert len(head) > 120_000
    answer = await asyncio.to_thread(_sent_in_pieces, gateway.url, head)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 422"), answer[:300]
    assert set(json.loads(body)) == {"code", "message"}

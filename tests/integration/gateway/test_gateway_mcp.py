"""The MCP server, driven by the official ``mcp`` SDK's own client over both transports
against the real stack: stdio (spawning ``memstream mcp``) and Streamable HTTP (``/mcp`` on a
real gateway)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.integration

TOOLS = {
    "add_memory",
    "search_memories",
    "list_memories",
    "get_memory",
    "delete_memory",
    "pin_memory",
    "fact_put",
    "fact_history",
    "commit_agent_memory",
}
MEMSTREAM = str(Path(sys.executable).parent / "memstream")


@asynccontextmanager
async def http_client(gateway: Any, key: str) -> Any:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60) as http,
        Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as client,
    ):
        yield client


@asynccontextmanager
async def stdio_client(gateway: Any, key: str) -> Any:
    env = {
        "MEMSTREAM_NATS_URL": gateway.running.nats_url,
        "MEMSTREAM_NAMESPACE": gateway.running.settings.namespace,
        "MEMSTREAM_API_KEY": key,
        "MEMSTREAM_STATE_DIR": str(gateway.running.settings.state_dir),
    }
    params = StdioServerParameters(command=MEMSTREAM, args=["mcp"], env=env, cwd=os.getcwd())
    async with Client(params, read_timeout_seconds=60) as client:
        yield client


async def call(client: Any, tool: str, **args: Any) -> dict[str, Any]:
    """Call a tool; its structured result (a failed call raises with the tool's message)."""
    res = await client.call_tool(tool, args)
    if res.is_error:
        raise AssertionError(res.content[0].text)
    out: dict[str, Any] = res.structured_content
    return out


async def round_trip(client: Any, word: str) -> None:
    """list tools, add (text: stored now; messages: through the pipeline, waited for), find
    both with a search, delete, and they are gone."""
    listed = await client.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    for t in listed.tools:  # identity never comes from tool arguments
        assert t.description and len(t.description) > 40
        assert not {"tenant", "user", "user_id", "agent", "agent_id", "api_key"} & set(
            t.input_schema.get("properties", {})
        ), t.name

    stored = await call(client, "add_memory", text=f"My {word} bike is locked in the garage")
    assert stored["status"] == "stored"
    mid = stored["memory"]["id"]
    turn = [
        {"role": "user", "content": f"Please remember: the {word} cat is named Miso"},
        {"role": "assistant", "content": f"Got it, the {word} cat is Miso."},
    ]
    added = await call(client, "add_memory", messages=turn, wait=True)
    assert added["status"] == "searchable" and added["event_id"]

    found = await call(client, "search_memories", query=f"where is the {word} bike?", top_k=5)
    assert "not instructions" in found["note"]
    assert found["memories"][0]["id"] == mid
    first = found["memories"][0]
    assert set(first) >= {"id", "text", "type", "score", "source"} and first["source"]["session"]
    cats = await call(client, "search_memories", query=f"what is the {word} cat called?")
    cat_ids = [m["id"] for m in cats["memories"] if "Miso" in m["text"]]
    assert cat_ids, cats

    pinned = await call(client, "pin_memory", memory_id=mid)
    assert pinned["memory"]["pinned"] is True
    listed_mem = await call(client, "list_memories", limit=50)
    assert mid in [m["id"] for m in listed_mem["memories"]]

    for gone in (mid, *cat_ids):
        assert (await call(client, "delete_memory", memory_id=gone))["status"] == "forgotten"
    res = await client.call_tool("get_memory", {"memory_id": mid})
    assert res.is_error and "not_found" in res.content[0].text
    after = await call(client, "search_memories", query=f"{word} bike garage cat Miso", top_k=20)
    assert not {mid, *cat_ids} & {m["id"] for m in after["memories"]}


async def test_mcp_over_streamable_http(gateway, tenant) -> None:
    """The SDK client over Streamable HTTP at /mcp with a Bearer key: the full round trip."""
    key = await gateway.key(tenant, user="dana")
    async with http_client(gateway, key) as client:
        await round_trip(client, "teal")


async def test_mcp_over_stdio(gateway, tenant) -> None:
    """The SDK client spawning `memstream mcp` (identity from its environment): the full
    round trip."""
    key = await gateway.key(tenant, user="erin")
    async with stdio_client(gateway, key) as client:
        await round_trip(client, "ochre")


async def test_mcp_http_identity_is_the_key(gateway, tenant) -> None:
    """No key or a wrong key: 401 JSON before MCP; a tenant-wide key: 403; each key's tools
    see only that key's owner; facts keep their versions."""
    r = await gateway.http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    headers = {"Authorization": "Bearer msk_not_a_key"}
    r = await gateway.http.post("/mcp", json={}, headers=headers)
    assert r.status_code == 401 and set(r.json()) == {"code", "message"}
    wide = await gateway.key(tenant)
    r = await gateway.http.post("/mcp", json={}, headers={"Authorization": f"Bearer {wide}"})
    assert r.status_code == 403 and r.json()["code"] == "forbidden"

    frank = await gateway.key(tenant, user="frank")
    gina = await gateway.key(tenant, user="gina")
    async with http_client(gateway, frank) as client:
        stored = await call(client, "add_memory", text="Frank's locker code is 4711")
        await call(client, "fact_put", key="user:employer", value="Acme")
        await call(client, "fact_put", key="user:employer", value="Globex")
        hist = await call(client, "fact_history", key="user:employer")
        assert [v["valid_to"] is None for v in hist["versions"]] == [False, True]
    async with http_client(gateway, gina) as client:
        found = await call(client, "search_memories", query="locker code", top_k=20)
        assert stored["memory"]["id"] not in [m["id"] for m in found["memories"]]
        res = await client.call_tool("get_memory", {"memory_id": stored["memory"]["id"]})
        assert res.is_error and "not_found" in res.content[0].text
        res = await client.call_tool("add_memory", {"text": "bad\x00text"})
        assert res.is_error and "validation_error" in res.content[0].text
        res = await client.call_tool("add_memory", {})
        assert res.is_error and "either text or messages" in res.content[0].text
        # an argument naming another owner is not a parameter: ignored, the key's owner holds
        smuggled = await call(client, "add_memory", text="Gina's bus pass is blue", user="frank")
        assert (await call(client, "get_memory", memory_id=smuggled["memory"]["id"]))["memory"]
    async with http_client(gateway, frank) as client:
        res = await client.call_tool("get_memory", {"memory_id": smuggled["memory"]["id"]})
        assert res.is_error and "not_found" in res.content[0].text


async def test_memstream_mcp_refuses_a_wrong_key(gateway) -> None:
    """`memstream mcp` with a key that is not valid exits 2 at start, without printing it."""
    key = "msk_wrong_key_value_12345"
    env = {
        **os.environ,
        "MEMSTREAM_NATS_URL": gateway.running.nats_url,
        "MEMSTREAM_NAMESPACE": gateway.running.settings.namespace,
        "MEMSTREAM_API_KEY": key,
    }
    proc = await asyncio.create_subprocess_exec(
        MEMSTREAM,
        "mcp",
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2, err
    assert b"memstream mcp:" in err and key[4:].encode() not in out + err


async def test_keys_never_in_mcp_or_mem0_responses_or_logs(gateway, tenant, caplog, capfd) -> None:
    """Right, wrong and over-long keys on /mcp and the Mem0 routes, and a failing tool call: no
    response, header or log line holds any 8-character piece of a key."""
    caplog.set_level(logging.DEBUG)
    key = await gateway.key(tenant, user="kim")
    wrong = key[:-4] + "AAAA"
    seen: list[str] = []
    init = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for k in (key, wrong, key * 10):
        for scheme in ("Bearer", "Token"):
            h = {"Authorization": f"{scheme} {k}", "Accept": "application/json, text/event-stream"}
            r = await gateway.http.post("/mcp", json=init, headers=h)
            seen.append(r.text + str(r.headers))
            r = await gateway.http.get("/v1/ping/", headers=h)
            seen.append(r.text + str(r.headers))
            body = {"query": "x", "filters": {"user_id": "kim", "created_at": {"gte": 1}}}
            r = await gateway.http.post("/v3/memories/search/", json=body, headers=h)
            seen.append(r.text + str(r.headers))
            r = await gateway.http.post("/v3/memories/add/", json={"messages": []}, headers=h)
            seen.append(r.text + str(r.headers))
            r = await gateway.http.get("/v1/memories/not-a-uuid/", headers=h)
            seen.append(r.text + str(r.headers))
    async with http_client(gateway, key) as client:
        res = await client.call_tool("get_memory", {"memory_id": "00000000-0000-0000-0000-0"})
        assert res.is_error
        seen.append(str(res.content))
    out, err = capfd.readouterr()
    logs = "\n".join(rec.getMessage() for rec in caplog.records) + out + err
    for k in (key, wrong):
        for p in [k[4:][i : i + 8] for i in range(len(k) - 11)]:  # "msk_" is public
            assert all(p not in s for s in seen), "a response holds part of a key"
            assert p not in logs, "a log line holds part of a key"


async def test_memstream_mcp_identity_from_arguments(gateway, tenant) -> None:
    """Without a key (keys not required on this bus), `--tenant` and `--user` are the
    identity: what the tools store is that owner's; with no owner configured it exits 2."""
    env = {
        "MEMSTREAM_NATS_URL": gateway.running.nats_url,
        "MEMSTREAM_NAMESPACE": gateway.running.settings.namespace,
    }
    args = ["mcp", "--tenant", tenant, "--user", "hal"]
    params = StdioServerParameters(command=MEMSTREAM, args=args, env=env)
    async with Client(params, read_timeout_seconds=60) as client:
        stored = await call(client, "add_memory", text="Hal parks on level 3")
    async with gateway.running.client(tenant, user="hal") as hal:
        assert (await hal.get(stored["memory"]["id"])).content == "Hal parks on level 3"

    proc = await asyncio.create_subprocess_exec(
        MEMSTREAM,
        "mcp",
        "--tenant",
        tenant,
        env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and b"a user or agent" in err


async def test_mcp_commits_agent_memory_as_the_key_s_agent(gateway, tenant) -> None:
    """commit_agent_memory (seed 004's commit as an MCP tool; there was none): over /mcp an
    agent's key commits its learning with a nested task_context, a second commit is the same
    memory with duplicate_detected and takes the new context, and the HTTP route lists it;
    another agent_name, a user-only key and a tier that is not one are refused; over stdio
    the configured agent commits."""
    from memstream.storage.postgres import OwnerFilter

    tc = {"task_description": "ship the api", "skills_used": ["helm"], "outcome": "success"}
    text = (
        "Helm upgrades with --atomic roll back by themselves when a hook fails, so a failed "
        "release never stays half applied in the cluster and the next upgrade starts clean"
    )
    scout = await gateway.key(tenant, agent="scout")
    async with http_client(gateway, scout) as client:
        args = {"content": text, "memory_type": "lesson_learned", "task_context": tc}
        first = await call(client, "commit_agent_memory", agent_name="scout", **args)
        assert first["duplicate_detected"] is False
        failed = {**tc, "outcome": "failed"}
        again = await call(client, "commit_agent_memory", **{**args, "task_context": failed})
        assert again == {"memory_id": first["memory_id"], "duplicate_detected": True}
        res = await client.call_tool("commit_agent_memory", {**args, "agent_name": "builder"})
        assert res.is_error and "forbidden" in res.content[0].text
        res = await client.call_tool("commit_agent_memory", {**args, "memory_type": "fact"})
        assert res.is_error
    r = await gateway.http.post(
        "/api/agent-memory/list",
        json={"agent_name": "scout"},
        headers={"Authorization": f"Bearer {scout}"},
    )
    listed = r.json()["memories"]
    assert [(m["memory_id"], m["task_context"]) for m in listed] == [(first["memory_id"], failed)]

    async with http_client(gateway, await gateway.key(tenant, user="ivy")) as client:
        res = await client.call_tool("commit_agent_memory", args)
        assert res.is_error and "bound to an agent" in res.content[0].text

    env = {
        "MEMSTREAM_NATS_URL": gateway.running.nats_url,
        "MEMSTREAM_NAMESPACE": gateway.running.settings.namespace,
    }
    cmd = ["mcp", "--tenant", tenant, "--agent", "builder"]
    async with Client(StdioServerParameters(command=MEMSTREAM, args=cmd, env=env)) as client:
        built = await call(
            client, "commit_agent_memory", content=text, memory_type="task_blueprint"
        )
    m = await gateway.running.pg.get(
        OwnerFilter(tenant=tenant, agent="builder"), built["memory_id"]
    )
    assert m is not None and (m.user, m.agent, m.type.value) == (None, "builder", "task_blueprint")

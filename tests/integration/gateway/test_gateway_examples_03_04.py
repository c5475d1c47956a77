"""examples/03_mcp_config.json and examples/04_mem0_client.py stay green: run as a user
would, against a real gateway over the real stack."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PLACEHOLDER = "msk_REPLACE_WITH_YOUR_KEY"


async def test_04_mem0_client_example(gateway, tenant) -> None:
    """04_mem0_client.py: add, search (polled until processed), update, history, delete."""
    key = await gateway.key(tenant, user="alice")
    env = {
        **os.environ,
        "MEMSTREAM_GATEWAY_URL": gateway.url,
        "MEM0_API_KEY": key,
        "MEM0_TELEMETRY": "False",
        "MEM0_DIR": tempfile.mkdtemp(prefix="mem0-example-"),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / "04_mem0_client.py"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert "add: PENDING" in text
    # the preference memory or the turn's episode ("user: ..."): both hold the text, and
    # their scores are close enough that either may rank first
    (search,) = [line for line in text.splitlines() if line.startswith("search: ")]
    assert "I prefer window seats on long flights'" in search
    assert "get after update: 'I prefer aisle seats on long flights'" in text
    assert "history: ['ADD', 'UPDATE']" in text and "after delete: True" in text
    assert key[4:] not in text + err.decode()


async def test_03_mcp_config_example(gateway, tenant) -> None:
    """03_mcp_config.json: both entries, with the key and addresses filled in, serve the tools
    to the SDK's client (stdio spawns `memstream mcp`; http talks to /mcp)."""
    key = await gateway.key(tenant, user="ivy")
    config: dict[str, Any] = json.loads((EXAMPLES / "03_mcp_config.json").read_text())
    servers = config["mcpServers"]

    local = servers["memstream"]
    env = {k: v.replace(PLACEHOLDER, key) for k, v in local["env"].items()}
    env["MEMSTREAM_NATS_URL"] = gateway.running.nats_url
    env["MEMSTREAM_NAMESPACE"] = gateway.running.settings.namespace  # the test's own streams
    command = str(Path(sys.executable).parent / local["command"])
    params = StdioServerParameters(command=command, args=local["args"], env=env)
    async with Client(params, read_timeout_seconds=60) as client:
        stored = await client.call_tool("add_memory", {"text": "Ivy's desk is by the window"})
        assert not stored.is_error
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"add_memory", "search_memories", "delete_memory"} <= names

    remote = servers["memstream-http"]
    assert remote["type"] == "http" and remote["url"].endswith("/mcp")
    headers = {k: v.replace(PLACEHOLDER, key) for k, v in remote["headers"].items()}
    url = remote["url"].replace("http://127.0.0.1:8010", gateway.url)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        found = await client.call_tool("search_memories", {"query": "where is Ivy's desk?"})
        assert not found.is_error
        assert found.structured_content["memories"][0]["text"] == "Ivy's desk is by the window"

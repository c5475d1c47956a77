"""`memstream gateway` as its own process, against a running worker."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


async def test_gateway_verb_serves_and_stops(running, tenant, tmp_path) -> None:
    """`memstream gateway --port 0` prints its URL, answers /healthz and a keyed search over
    the running worker, and exits 0 on SIGTERM."""
    exe = Path(sys.executable).parent / "memstream"
    env = {
        **os.environ,
        "MEMSTREAM_NATS_URL": running.nats_url,
        "MEMSTREAM_NAMESPACE": running.settings.namespace,
    }
    proc = await asyncio.create_subprocess_exec(
        str(exe),
        "gateway",
        "--port",
        "0",
        "--state-dir",
        str(tmp_path),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = re.search(r"http://\S+:\d+", line)
        assert url, line
        key = await running.pg.create_api_key(tenant, "t", "u", None)
        async with httpx.AsyncClient(base_url=url.group(0), timeout=30) as http:
            r = await http.get("/healthz")
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            body = {"user_id": "u", "user_key": key, "query": "q", "scope": ["all_user_memory"]}
            r = await http.post("/memories/search", json=body)
            assert r.status_code == 200 and r.json()["results"] == []
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

"""The operator console mounted by the gateway at /console (the same app the worker serves),
present only when an operator token is configured."""

from __future__ import annotations

import json
from typing import Any

import httpx
import nats
from pydantic import SecretStr

from memstream.gateway.cli import start_gateway
from memstream.schemas.subjects import Subjects

TOKEN = "operator-token-for-gateway-tests"


async def test_console_is_served_with_a_token_and_redacts_through_the_workers(
    running: Any,
) -> None:
    """With MEMSTREAM_CONSOLE_TOKEN the gateway serves /console: the token is required, the
    overview hears the worker, and a dead letter's body is shown redacted by the worker (the
    gateway holds no redaction key)."""
    settings = running.settings.model_copy(update={"console_token": SecretStr(TOKEN)})
    server = await start_gateway(settings, running.nats_url, "127.0.0.1", 0)
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            refused = await http.get("/console/", follow_redirects=False)
            assert refused.status_code in (302, 303, 401) and TOKEN not in refused.text
            wrong = await http.get(
                "/console/overview/panel",
                headers={"Authorization": "Bearer " + "x" * 32},
                follow_redirects=False,
            )
            assert wrong.status_code in (302, 303, 401) and 'id="workers"' not in wrong.text
            panel = await http.get("/console/overview/panel", headers=bearer)
            assert panel.status_code == 200 and 'id="workers"' in panel.text
            assert ">1<" in panel.text.split('id="workers"', 1)[1][:40]  # one worker answers
            s = Subjects(settings.namespace)
            nc = await nats.connect(running.nats_url)
            bad = {"tenant": "acme", "messages": [], "note": "mail eve@example.com"}
            await nc.jetstream().publish(s.turns("acme", "eve", "s1"), json.dumps(bad).encode())
            await nc.close()
            await running.wait_for(running.drained, 20, "the dead letter")
            listing = await http.get("/console/dlq", headers=bearer)
            assert listing.status_code == 200
            seq = listing.text.split('<tr data-seq="', 1)[1].split('"', 1)[0]
            one = await http.get(f"/console/dlq/{seq}", headers=bearer)
            assert one.status_code == 200
            assert "[EMAIL:" in one.text and "eve@example.com" not in one.text
    finally:
        await server.stop()


async def test_no_console_without_a_token(running: Any) -> None:
    """Without an operator token the gateway has no /console (a JSON 404 like any unknown
    route)."""
    server = await start_gateway(running.settings, running.nats_url, "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            r = await http.get("/console/")
            assert r.status_code == 404 and r.json()["code"] == "not_found"
    finally:
        await server.stop()

"""The web console when NATS or a worker is slow or away: stopped while NATS is away, at once,
without an error, and closed rather than left reconnecting; a worker that answers slowly still
counted on the overview."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest

from memstream.console import ConsoleBackend, serve, standalone
from memstream.consumers.embedded import EmbeddedNats
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


async def test_console_stops_at_once_while_nats_is_away(tmp_path: Path) -> None:
    """A console serving pages when its nats-server dies: stopping it (as `memstream dev`
    and `memstream console` do on a signal) takes well under the 30 s a drain would wait,
    raises nothing, and leaves its connection closed, not reconnecting forever."""
    server_nats = EmbeddedNats.start(tmp_path / "nats")
    try:
        settings = Settings(state_dir=tmp_path / "state")
        backend = await ConsoleBackend.connect(settings, server_nats.url)
        server = await serve(standalone(backend, "operator-token-for-tests"), "127.0.0.1", 0)
        page = await asyncio.to_thread(urllib.request.urlopen, str(server.url), timeout=10)
        assert page.status == 200  # serving: the login page
        server_nats.halt()
        await asyncio.sleep(2)  # the connection notices, and reconnects in vain
        assert backend.nc.is_reconnecting or not backend.nc.is_connected
        started = time.monotonic()
        await asyncio.wait_for(server.stop(), 10)
        await asyncio.wait_for(backend.close(), 10)
        took = time.monotonic() - started
        assert backend.nc.is_closed
        assert took < 3, f"the stop took {took:.1f} s"
    finally:
        server_nats.stop()


async def test_the_overview_counts_a_worker_that_answers_slowly(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    """A worker answers the stats request once its store probes have (each bounded at 1 s),
    which takes a loaded worker hundreds of milliseconds: one answering after 0.7 s is still
    counted, not shown as absent."""
    nc = await nats.connect(nats_url)

    async def slow(msg: Any) -> None:
        await asyncio.sleep(0.7)
        await msg.respond(b'{"worker": "busy:1"}')

    await nc.subscribe(Subjects(namespace).ops("stats"), cb=slow)
    await nc.flush()
    backend = await ConsoleBackend.connect(
        Settings(state_dir=tmp_path / "state", namespace=namespace), nats_url
    )
    try:
        assert await backend.worker_stats() == [{"worker": "busy:1"}]
    finally:
        await backend.close()
        await nc.close()

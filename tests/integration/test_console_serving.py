"""The web console without a browser, against a running worker on real NATS, Postgres and
Qdrant Edge: `memstream dev` and `memstream console` serve it, and its backend's requests to the
workers over NATS (redaction by the workers, hidden when none answers; replies on inboxes
only)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import nats
import pytest
from consoles import TOKEN

from memstream.console import ConsoleBackend
from memstream.console.backend import HIDDEN
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


MEMSTREAM = str(Path(sys.executable).parent / "memstream")


def test_dev_prints_and_records_the_console_url(tmp_path: Path) -> None:
    """`memstream dev` serves the console, prints its URL and records it as console_url in
    stack.json; the token it made is in a file only its owner reads, and the console asks
    for it."""
    state = tmp_path / "state"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(state),
        "MEMSTREAM_OPS_PORT": "0",
        "MEMSTREAM_CONSOLE_PORT": "0",
    }
    log = (tmp_path / "dev.log").open("w")
    proc = subprocess.Popen(
        [MEMSTREAM, "dev"], env=env, stdout=subprocess.PIPE, stderr=log, text=True
    )
    log.close()
    assert proc.stdout is not None
    said: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not said or "Ctrl-C stops everything." not in said[-1]:
            why = f"dev did not start: {said} {(tmp_path / 'dev.log').read_text()[-2000:]}"
            assert time.monotonic() < deadline and proc.poll() is None, why
            said.append(proc.stdout.readline())
        line = next(ln for ln in said if ln.strip().startswith("console"))
        url = re.search(r"http://\S+/console/", line)
        assert url is not None, line
        recorded = json.loads((state / "stack.json").read_text())
        assert recorded["console_url"] == url.group(0)
        token_file = state / "console-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token_file.read_text().strip() not in "".join(said)
        with urllib.request.urlopen(url.group(0), timeout=10) as resp:
            assert "Operator login" in resp.read().decode()  # redirected: no token, no console
        req = urllib.request.Request(
            url.group(0) + "overview/panel",
            headers={"Authorization": f"Bearer {token_file.read_text().strip()}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert "Workers answering" in resp.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0


async def test_memstream_console_serves_alone(running: Any, tmp_path: Path) -> None:
    """`memstream console` serves the console as a NATS client of a worker running elsewhere:
    it needs only NATS and the token, sees that worker, and stops cleanly on SIGTERM; without
    a token it refuses to start."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_NATS_URL": running.nats_url,
        "MEMSTREAM_NAMESPACE": running.settings.namespace,
        "MEMSTREAM_STATE_DIR": str(tmp_path),
        "MEMSTREAM_CONSOLE_PORT": "0",
    }
    refused = await asyncio.create_subprocess_exec(
        MEMSTREAM, "console", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    assert await asyncio.wait_for(refused.wait(), 60) == 2
    proc = await asyncio.create_subprocess_exec(
        MEMSTREAM,
        "console",
        env={**env, "MEMSTREAM_CONSOLE_TOKEN": TOKEN},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = re.search(r"http://\S+/console/", line)
        assert url is not None, line

        def panel() -> str:
            req = urllib.request.Request(
                url.group(0) + "overview/panel", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            with urllib.request.urlopen(req, timeout=10) as resp:
                return str(resp.read().decode())

        html = await asyncio.to_thread(panel)
        assert re.search(r'id="workers">1<', html), "the worker is not seen"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
    assert code == 0


async def test_without_a_worker_dead_letters_stay_hidden(
    running: Any, nats_url: str, namespace: str
) -> None:
    """A console without a redactor of its own asks the workers to redact; the worker's answer
    is redacted with its key, and when no worker answers the text is hidden, never shown (and
    the overview says no worker answered)."""
    backend = await ConsoleBackend.connect(running.settings, running.nats_url)
    try:
        ((text, counts),) = await backend.redact([("acme", "mail bob@example.com")])
        assert "bob@example.com" not in text and "[EMAIL:" in text and counts == {"EMAIL": 1}
        local = running.worker.redactor.redact("mail bob@example.com", "acme").text
        assert text == local  # the same key and policies: placeholders match stored memories'
    finally:
        await backend.close()
    alone = running.settings.model_copy(update={"namespace": f"{namespace}x"})
    backend = await ConsoleBackend.connect(alone, nats_url)  # a namespace no worker serves
    try:
        assert await backend.redact([("acme", "mail bob@example.com")]) == [(HIDDEN, {})]
        o = await backend.overview()  # nothing there: said so, not an error page
        assert o["workers"] == 0 and ("workers", False, "no worker answered") in o["health"]
        assert o["streams"]["turns"] is None and o["stages"]["store"]["consumer"] is None
    finally:
        await backend.close()


async def test_console_requests_are_answered_on_inboxes_only(running: Any) -> None:
    """A stats or redaction request whose reply subject lies in the namespace (a stream's
    subject) gets no answer: the worker never writes its reply into a stream."""
    s = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        forged = s.turns("acme", "mallory", "s1")
        await nc.publish(s.ops("stats"), b"", reply=forged)
        redact = json.dumps({"items": [{"tenant": "acme", "text": "x"}]}).encode()
        await nc.publish(s.ops("redact"), redact, reply=forged)
        # answered in order after the forged ones: once these come back, those were handled
        await nc.request(s.ops("stats"), b"", timeout=5)
        await nc.request(s.ops("redact"), redact, timeout=5)
        state = (await nc.jetstream().stream_info(s.stream("turns"))).state
        assert state.messages == 0
    finally:
        await nc.close()

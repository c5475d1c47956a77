"""NATS credentials never leave the process: `memstream worker` and the agent CLI run against
real nats-servers that demand them (a password, a .creds file), and neither their output,
their logs (at DEBUG) nor stack.json holds the password, the seed or the JWT."""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from natsservers import NS, nats_server, operator_mode_server

from memstream.consumers import creds

pytestmark = pytest.mark.integration

MEMSTREAM = str(Path(sys.executable).parent / "memstream")


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


class WorkerProcess:
    """`memstream worker` with ``env``; everything it writes is kept."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [MEMSTREAM, "worker"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.readers = [
            threading.Thread(target=_lines, args=(s, self.lines), daemon=True)
            for s in (self.proc.stdout, self.proc.stderr)
        ]
        for r in self.readers:
            r.start()
        self.seen: list[str] = []

    def wait_started(self, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise AssertionError(f"worker exited: {''.join(self.seen)[-2000:]}") from None
                continue
            self.seen.append(line)
            if '"worker.started"' in line:
                return
        raise AssertionError("the worker did not start")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        for r in self.readers:
            r.join(10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)


def _stack_file(state: Path, timeout_s: float = 30) -> str:
    """stack.json, written just after the worker starts serving."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return (state / "stack.json").read_text()
        except FileNotFoundError:
            time.sleep(0.05)
    raise AssertionError("no stack.json")


def _env(tmp_path: Path, database_url: str, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(tmp_path / "state"),
        "MEMSTREAM_DATABASE_URL": database_url,
        "MEMSTREAM_REDACTION_KEY": secrets.token_hex(16),
        "MEMSTREAM_OPS_PORT": "0",
        "MEMSTREAM_LOG_LEVEL": "DEBUG",
        **extra,
    }


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [MEMSTREAM, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    password = "pw-" + secrets.token_hex(12)
    auth = f'authorization {{ user: memstream, password: "{password}" }}'
    (tmp_path / "srv").mkdir()
    with nats_server(tmp_path / "srv", auth) as (url, _, _):
        yield url, password


@pytest.mark.parametrize("where", ["variables", "url"])
def test_a_nats_password_is_never_logged_printed_or_written(
    tmp_path: Path, database_url: str, password_server: tuple[str, str], where: str
) -> None:
    """Given apart (MEMSTREAM_NATS_USER/PASSWORD) or, the old way, inside the URL: the worker
    connects, and its log and stack.json show the URL without the password."""
    url, password = password_server
    host = url.removeprefix("nats://")
    if where == "variables":
        given = {
            "MEMSTREAM_NATS_URL": url,
            "MEMSTREAM_NATS_USER": "memstream",
            "MEMSTREAM_NATS_PASSWORD": password,
        }
    else:
        given = {"MEMSTREAM_NATS_URL": f"nats://memstream:{password}@{host}"}
    env = _env(tmp_path, database_url, MEMSTREAM_NAMESPACE=f"s{uuid.uuid4().hex[:8]}", **given)
    worker = WorkerProcess(env)
    try:
        worker.wait_started()
        stack = _stack_file(tmp_path / "state")
        assert json.loads(stack)["nats_url"] == url
        out = _cli(env, "publish", "--user", "alice", "I prefer green tea")
        assert out.returncode == 0, out.stderr
    finally:
        logs = worker.stop()
    assert '"worker.started"' in logs and url in logs
    assert password not in logs + stack + out.stdout + out.stderr
    assert worker.proc.returncode == 0


def test_a_creds_file_is_never_logged_printed_or_written(tmp_path: Path, database_url: str) -> None:
    """A worker with MEMSTREAM_NATS_CREDS and an agent CLI with --nats-creds work on an
    operator-mode server; no seed or JWT of either appears in any output or in stack.json."""
    with operator_mode_server(tmp_path / "bus") as bus:
        worker_creds = bus.authority / creds.WORKER_CREDS
        tenant = f"t{uuid.uuid4().hex[:6]}"
        agent_creds = bus.tenant(tenant)
        secrets_ = [
            line.strip()
            for f in (worker_creds, agent_creds)
            for line in f.read_text().splitlines()
            if line.startswith(("SU", "eyJ"))  # the seed and the JWT
        ]
        assert len(secrets_) == 4
        env = _env(
            tmp_path,
            database_url,
            MEMSTREAM_NATS_URL=bus.url,
            MEMSTREAM_NATS_CREDS=str(worker_creds),
            MEMSTREAM_NAMESPACE=NS,
        )
        worker = WorkerProcess(env)
        try:
            worker.wait_started()
            stack = _stack_file(tmp_path / "state")
            agent_env = {k: v for k, v in env.items() if k != "MEMSTREAM_NATS_CREDS"}
            agent_env["MEMSTREAM_API_KEY"] = "msk_not-a-key"  # keys are required on this bus
            pub = _cli(
                agent_env,
                "publish",
                "--tenant",
                tenant,
                "--nats-creds",
                str(agent_creds),
                "hello there",
            )
            rec = _cli(
                agent_env, "recall", "--tenant", tenant, "--nats-creds", str(agent_creds), "hello"
            )
        finally:
            logs = worker.stop()
    assert pub.returncode == 0, pub.stderr
    assert rec.returncode == 1 and "unauthorized" in rec.stderr  # answered, via its inbox
    everything = logs + stack + pub.stdout + pub.stderr + rec.stdout + rec.stderr
    assert not [s for s in secrets_ if s in everything]

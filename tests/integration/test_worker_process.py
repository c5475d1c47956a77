"""`memstream dev` as a process: it starts its own stack and the HTTP gateway, applies the
host settings it is given (memory locking, the CPU wake-up latency), and stops cleanly on
SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import pytest
from hostcaps import may_lock_memory

from memstream.consumers import cpulatency
from memstream.consumers.embedded import EmbeddedNats, EmbeddedPostgres
from memstream.schemas.stack import stack_path

pytestmark = pytest.mark.integration

MEMSTREAM = str(Path(sys.executable).parent / "memstream")
HOST_EVENTS = {
    "worker.memory_locked",
    "worker.memory_lock_failed",
    "worker.cpu_latency_held",
    "worker.cpu_latency_failed",
}


def _lines(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _events(lines: queue.Queue[str], wanted: int, timeout_s: float) -> dict[str, dict[str, Any]]:
    """The first ``wanted`` host-setting events of the worker's JSON log."""
    found: dict[str, dict[str, Any]] = {}
    while len(found) < wanted:
        line = lines.get(timeout=timeout_s)
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") in HOST_EVENTS:
                found[event["event"]] = event
    return found


def test_dev_applies_host_settings_and_stops_cleanly(tmp_path: Path) -> None:
    """memstream dev as a process locks its memory and holds the CPU latency when asked, and
    releases both and exits 0 on SIGTERM."""
    before = cpulatency.current_cpu_latency()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(tmp_path / "state"),
        "MEMSTREAM_OPS_PORT": "0",
        "MEMSTREAM_GATEWAY_PORT": "0",
        "MEMSTREAM_LOCK_MEMORY": "true",
        "MEMSTREAM_CPU_LATENCY_US": "0",
    }
    proc = subprocess.Popen(
        [MEMSTREAM, "dev"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    said: queue.Queue[str] = queue.Queue()
    assert proc.stderr is not None and proc.stdout is not None
    readers = [
        threading.Thread(target=_lines, args=(proc.stderr, lines), daemon=True),
        threading.Thread(target=_lines, args=(proc.stdout, said), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        events = _events(lines, 2, timeout_s=120)
        while "Ctrl-C stops everything." not in said.get(timeout=120):
            pass  # the announcement: the worker is serving
        # dev also serves the HTTP gateway and records where
        gateway = json.loads((tmp_path / "state" / "stack.json").read_text())["gateway_url"]
        with urllib.request.urlopen(f"{gateway}/healthz", timeout=30) as health:
            assert json.loads(health.read())["status"] == "ok"
        may_lock = may_lock_memory()
        key_file = tmp_path / "state" / "redaction.key"  # dev mode: a private random key
        assert key_file.stat().st_mode & 0o777 == 0o600
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        locked_kb = int(next(ln for ln in status if ln.startswith("VmLck:")).split()[1])
        if may_lock:
            assert "worker.memory_locked" in events and locked_kb > 0
        else:
            assert "RLIMIT_MEMLOCK" in events["worker.memory_lock_failed"]["reason"]
            assert locked_kb == 0
        if os.access(cpulatency.DEVICE, os.W_OK):
            assert events["worker.cpu_latency_held"]["us"] == 0
            assert cpulatency.current_cpu_latency() == 0  # held by the worker process
        else:
            assert "cannot open" in events["worker.cpu_latency_failed"]["reason"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        for reader in readers:
            reader.join(timeout=10)  # to the end of the pipes
    out = []
    while not said.empty():
        out.append(said.get())
    assert proc.returncode == 0 and "stopped.\n" in out
    if before is not None:
        assert cpulatency.current_cpu_latency() == before  # released with the process


def test_ctrl_c_stops_dev_and_everything_it_started(tmp_path: Path) -> None:
    """Ctrl-C in a terminal signals the whole process group: memstream dev, its helper
    process and the servers it started. The worker still drains its connections (the
    embedded nats-server is not in that group and is stopped last), says it stopped, exits 0
    with no traceback, and leaves no process of its own behind."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(tmp_path / "state"),
        "MEMSTREAM_OPS_PORT": "0",
        "MEMSTREAM_GATEWAY_PORT": "0",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [MEMSTREAM, "dev"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    said: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None and proc.stderr is not None
    reader = threading.Thread(target=_lines, args=(proc.stdout, said), daemon=True)
    reader.start()
    try:
        while "Ctrl-C stops everything." not in said.get(timeout=120):
            pass
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    out = []
    while not said.empty():
        out.append(said.get())
    errors = proc.stderr.read()
    assert proc.returncode == 0 and "stopped.\n" in out, errors[-2000:]
    assert "Traceback" not in errors
    state = str(tmp_path / "state")
    left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and state in _cmdline(p)]
    assert not left  # nats-server and PostgreSQL stopped with it


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_sigterm_with_nats_away_stops_the_worker_cleanly(tmp_path: Path) -> None:
    """`memstream worker` told to stop (SIGTERM) while its nats-server is down, on the event
    loop it runs in production (uvloop): it closes its connections instead of draining them
    and exits 0 within seconds, with no traceback."""
    nats_server = EmbeddedNats.start(tmp_path / "nats")
    pg = EmbeddedPostgres.start(tmp_path / "pg")
    env = {
        **os.environ,
        "MEMSTREAM_NATS_URL": nats_server.url,
        "MEMSTREAM_DATABASE_URL": pg.dsn,
        "MEMSTREAM_STATE_DIR": str(tmp_path / "state"),
        "MEMSTREAM_REDACTION_KEY": "k" * 40,
    }
    proc = subprocess.Popen(
        [MEMSTREAM, "worker"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        # ready: the signal handlers are in place once the stack file is written
        while not stack_path(tmp_path / "state").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.1)
        nats_server.halt()
        time.sleep(3)  # the worker's connections reconnecting, in vain
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
        nats_server.resume()
        nats_server.stop()
        pg.stop()
    while not lines.empty():
        seen.append(lines.get())
    out = "".join(seen)
    assert code == 0 and "Traceback" not in out, out[-3000:]
    assert took < 15, f"the stop took {took:.1f} s"


@pytest.mark.parametrize("server", ["nats", "postgres"])
def test_sigterm_during_start_up_stops_what_already_started(tmp_path: Path, server: str) -> None:
    """A stop (a supervisor's SIGTERM) that lands while memstream dev is still starting, once
    its embedded nats-server or PostgreSQL is up and before it serves: it stops what had
    started, says so, and exits 0, leaving no server running (they run in sessions of their
    own, out of reach of the signal)."""
    state = tmp_path / "state"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
        "MEMSTREAM_STATE_DIR": str(state),
        "MEMSTREAM_OPS_PORT": "0",
        "MEMSTREAM_GATEWAY_PORT": "0",
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [MEMSTREAM, "dev"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not any(str(state / server) in _cmdline(p) for p in _processes()):
            assert proc.poll() is None and time.monotonic() < deadline, "no server started"
            time.sleep(0.02)
        assert not stack_path(state).exists()  # still starting
        proc.send_signal(signal.SIGTERM)
        out, errors = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = [int(p.name) for p in _processes() if str(state) in _cmdline(p)]
        for pid in left:  # a failing run leaves no server behind on the machine
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0 and out.endswith("stopped.\n"), (out + errors)[-2000:]
    assert "memstream is running" not in out  # the signal did land during start-up
    assert "Traceback" not in errors
    assert not left  # nats-server and PostgreSQL stopped with it


def _processes() -> list[Path]:
    return [p for p in Path("/proc").iterdir() if p.name.isdigit()]

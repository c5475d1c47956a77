"""The processes the fault benchmark starts, kills and starts again: ``memstream worker`` as
a child process, configured by environment variables only, as a supervisor would run it; and
the faults themselves (``Services.inject``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memstream.consumers.embedded import EmbeddedNats, EmbeddedPostgres
from memstream.schemas.errors import ConfigurationError


def memstream_command() -> list[str]:
    """The ``memstream`` console script next to this interpreter (a venv's bin/), else the
    module behind it run by this interpreter."""
    script = Path(sys.executable).parent / "memstream"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from memstream.producers.cli import main; main()"]


RUN_KEY = secrets.token_hex(32)  # this benchmark run's redaction key


class WorkerProcess:
    """``memstream worker`` on the given services; its log (JSON lines) goes to ``log``;
    ``args`` go after ``worker`` (``--stages extract,redact``)."""

    def __init__(
        self, env: dict[str, str], state_dir: Path, log: Path, args: Sequence[str] = ()
    ) -> None:
        self.state_dir, self.log, self.args = state_dir, log, list(args)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
            # one fresh secret per run, the same for every process of it: a value redacted
            # by an extract/redact process gets the placeholder the owner would give it
            "MEMSTREAM_REDACTION_KEY": RUN_KEY,
            "MEMSTREAM_STATE_DIR": str(state_dir),
            "MEMSTREAM_OPS_PORT": "0",
            "MEMSTREAM_LOG_LEVEL": "WARNING",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.pids: list[int] = []  # of every start, in order

    @property
    def ready_file(self) -> Path:
        return self.state_dir / "stack.json"  # written once the worker serves

    def start(self, timeout_s: float = 180.0) -> float:
        """Start it and wait until it serves; returns the seconds that took."""
        started = time.monotonic()
        self.ready_file.unlink(missing_ok=True)  # a killed worker leaves its own behind
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*memstream_command(), "worker", *self.args], env=self.env, stdout=out, stderr=out
            )
        self.starts += 1
        self.pids.append(self.proc.pid)
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise ConfigurationError(
                    f"memstream worker exited with code {self.proc.returncode} during start-up "
                    f"(log: {self.log})"
                )
            if time.monotonic() - started > timeout_s:
                raise ConfigurationError(f"memstream worker not serving after {timeout_s:.0f} s")
            time.sleep(0.05)
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL: no shutdown, no drain, unacked messages left to their ack deadline."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def live_pids(self) -> list[int]:
        """The worker process, then its helper and index processes (none once it has
        exited)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return [self.proc.pid, *self.helper_pids(), *self.index_pids()]

    def helper_pids(self) -> list[int]:
        """The worker's helper processes (consumers/helper.py)."""
        return self._spawned(index=False)

    def index_pids(self) -> list[int]:
        """The worker's index process (consumers/indexproc.py), if it has one."""
        return self._spawned(index=True)

    def _spawned(self, index: bool) -> list[int]:
        """The worker's children started by multiprocessing's spawn: the index process
        (named ``memstream-index``) or the others."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        found = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                for pid in (task / "children").read_text().split():
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    named = Path(f"/proc/{pid}/comm").read_text().strip() == "memstream-index"
                    if b"multiprocessing.spawn" in cmdline and named == index:
                        found.append(int(pid))
        return found

    def kill_helper(self) -> None:
        """SIGKILL the worker's helper process; the worker goes on and starts another."""
        _kill_all(
            self.helper_pids(),
            "the worker has no helper process to kill (MEMSTREAM_STAGE__HELPER is off, or the "
            "machine has one CPU)",
        )

    def kill_index(self) -> None:
        """SIGKILL the worker's index process; the worker goes on and starts another."""
        _kill_all(
            self.index_pids(),
            "the worker has no index process to kill (MEMSTREAM_STAGE__INDEX_PROCESS is off, a "
            "Qdrant server is configured, or the machine has one CPU)",
        )

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@dataclass
class Services:
    """The servers and the worker of one run, the vector index's offline switch, and the
    extra extract/redact worker processes beside the worker (``--extra-workers``)."""

    nats: EmbeddedNats
    pg: EmbeddedPostgres
    worker: WorkerProcess
    offline_flag: Path
    outage_s: float
    index_outage_s: float
    extras: list[WorkerProcess] = field(default_factory=list)

    async def inject(self, fault: str) -> float:
        """Make ``fault`` happen and end; returns how long the service was away (s)."""
        started = time.monotonic()
        if fault == "worker_kill":
            await asyncio.to_thread(self.worker.kill)
            await asyncio.to_thread(self.worker.start)
        elif fault == "extra_kill":  # the first extra process: the others keep working
            await asyncio.to_thread(self.extras[0].kill)
            await asyncio.to_thread(self.extras[0].start)
        elif fault == "helper_kill":  # the worker's helper process only
            await asyncio.to_thread(self.worker.kill_helper)
        elif fault == "index_kill":  # the worker's index process only
            await asyncio.to_thread(self.worker.kill_index)
        elif fault == "nats_kill":
            await asyncio.to_thread(self.nats.halt)
            await asyncio.sleep(self.outage_s)
            await asyncio.to_thread(self.nats.resume)
        elif fault == "postgres_kill":
            await asyncio.to_thread(self.pg.halt, "kill")
            await asyncio.sleep(self.outage_s)
            await asyncio.to_thread(self.pg.resume)
        elif fault == "index_offline":
            self.offline_flag.touch()
            await asyncio.sleep(self.index_outage_s)
            self.offline_flag.unlink()
        else:
            raise ValueError(f"unknown fault {fault!r}")
        return time.monotonic() - started


def _kill_all(pids: list[int], none: str) -> None:
    """SIGKILL ``pids``; ``ConfigurationError(none)`` when there are none."""
    if not pids:
        raise ConfigurationError(none)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

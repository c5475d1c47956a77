"""CPU time of the processes a benchmark runs, by role, read from /proc (Linux).

On a 2-core machine, where a process waits tells more than its busy time: a stage that is
"busy" 75% of the time may use half a core and wait on the others. The ingest benchmark
prints, per phase, the cores each role used (``Roles.cores``): the worker that owns the index,
its helper process, extract/redact processes, PostgreSQL (the postmaster and its backends),
nats-server, and the benchmark itself (its clients)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_seconds(pid: int, reaped: bool = False) -> float:
    """User and system CPU seconds of ``pid`` (0 when it is gone or there is no /proc);
    ``reaped``: with its waited-for children's (a postmaster's ended backends)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # fields[0] is the state (field 3 of stat)
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICK


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (every thread's)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def tree_seconds(pid: int) -> float:
    """``pid`` and its live children, with what it reaped (a postmaster and its backends)."""
    return process_seconds(pid, reaped=True) + sum(process_seconds(c) for c in children(pid))


@dataclass
class Roles:
    """How to read each role's CPU seconds now; ``cores`` between two readings."""

    readers: dict[str, Callable[[], float]] = field(default_factory=dict)

    def add(self, role: str, read: Callable[[], float]) -> None:
        self.readers[role] = read

    def add_pids(self, role: str, pids: Callable[[], Iterable[int]]) -> None:
        self.readers[role] = lambda: sum(process_seconds(p) for p in pids())

    def read(self) -> dict[str, float]:
        return {role: read() for role, read in self.readers.items()}

    @staticmethod
    def cores(start: dict[str, float], end: dict[str, float], seconds: float) -> dict[str, float]:
        """Cores each role used over ``seconds`` (CPU seconds per wall second)."""
        if seconds <= 0:
            return {}
        return {r: round((end[r] - start.get(r, 0.0)) / seconds, 2) for r in end}


def own_seconds() -> float:
    t = os.times()
    return t.user + t.system

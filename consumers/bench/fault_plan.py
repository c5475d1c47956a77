"""The fault suite's plan (consumers/bench/faults.py): which faults there are, when each is
made (at its share of the turns stored), and the gate that holds the publisher until it is:
without it, a fault the pipeline works through (the index away: memories go on being stored
in Postgres) would let it store nearly every turn before the next fault, which would then
meet no work."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from memstream.consumers.bench import fleet
from memstream.consumers.bench.processes import Services
from memstream.consumers.bench.publisher import Progress, Publisher

PLAN = ["worker_kill", "nats_kill", "postgres_kill", "index_offline", "worker_kill"]
KINDS = (
    "worker_kill",
    "nats_kill",
    "postgres_kill",
    "index_offline",
    "extra_kill",
    "helper_kill",
    "index_kill",
)


def due_share(k: int, faults: int) -> float:
    """The share of the turns stored at which fault ``k`` (from 0) of ``faults`` is made."""
    return (k + 1) / (faults + 1.5)


@dataclass
class Gate:
    """How many turns the publisher may have published: ``ahead`` past the turn at which the
    next fault is due, until that fault is made; every turn once the plan is done."""

    turns: int
    faults: int
    ahead: int
    made: int = 0
    # turns let past the due fault's limit: it came due with none in flight (``in_hand``)
    extra: int = 0

    def limit(self) -> int:
        if self.made >= self.faults:
            return self.turns
        due = int(due_share(self.made, self.faults) * self.turns)
        return min(self.turns, due + self.ahead + self.extra)


Stored = Callable[[], Awaitable[int | None]]  # turns stored, read now (None: cannot tell)


async def in_hand(
    stored_now: Stored, publisher: Publisher, gate: Gate, wait_s: float = 5.0
) -> tuple[int, int]:
    """(turns stored, turns published and not stored yet), read afresh just before a fault.
    The monitor reads what is stored every 0.2 s, and in that time the pipeline can store
    every turn the gate let out: a fault made then would meet an idle pipeline, and test
    recovery, not work in hand. So while fewer than a quarter of ``ahead`` are in flight (a
    pull batch or so), the gate lets ``ahead`` more out and this waits for them, up to
    ``wait_s``; fewer are in flight only when no more came (every turn published, or the
    publisher held by NATS)."""
    deadline = time.monotonic() + wait_s
    wanted = max(1, gate.ahead // 4)
    while True:
        read = await stored_now()
        stored = publisher.progress.events if read is None else read
        in_flight = len(publisher.acked) - stored
        if in_flight >= wanted or len(publisher.acked) >= gate.turns or time.monotonic() > deadline:
            return stored, max(0, in_flight)
        gate.extra = gate.ahead
        publisher.progress.changed.set()  # the publisher reads the new limit now
        await asyncio.sleep(0.01)


async def inject_plan(
    services: Services,
    plan: list[str],
    progress: Progress,
    publisher: Publisher,
    gate: Gate,
    stall_limit_s: float,
    t0: float,
    watch: fleet.StatsWatch,
    stored_now: Stored,
) -> list[dict[str, Any]]:
    """Each fault of the plan once, in order, when its share of the turns is stored (an extra
    process is killed once it holds work: it has handled work of its stages); the gate opens
    to the next fault's share once one is made, and all the way when the plan ends, however
    it ends (a stall, a fault that fails): the publisher then finishes, and the report
    counts what was lost. ``stored_now``: for ``in_hand``."""
    log: list[dict[str, Any]] = []
    try:
        n = gate.turns
        for k, fault in enumerate(plan):
            while progress.events < due_share(k, len(plan)) * n:
                if time.monotonic() - progress.seen_at > stall_limit_s:
                    print(
                        f"  no turn stored for {stall_limit_s:.0f} s: plan stopped", file=sys.stderr
                    )
                    return log
                progress.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(progress.changed.wait(), 1.0)
            if fault == "extra_kill" and not await watch.working(services.extras[0]):
                print("  the extra process to kill did no work within 30 s", file=sys.stderr)
            at, in_flight = await in_hand(stored_now, publisher, gate)
            print(f"  fault {k + 1}/{len(plan)}: {fault} at {at}/{n} stored", file=sys.stderr)
            down = await services.inject(fault)
            gate.made += 1
            gate.extra = 0
            ended = time.monotonic()
            log.append(
                {
                    "fault": fault,
                    "at_stored": at,
                    "in_flight": in_flight,
                    "started_s": round(ended - down - t0, 1),
                    "down_s": round(down, 1),
                    "ended_at": ended,
                }
            )
    finally:
        gate.made = gate.faults
    return log

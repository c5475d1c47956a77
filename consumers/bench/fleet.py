"""The worker processes of a fault benchmark run: extra ``memstream worker --stages
extract,redact`` processes beside the one that owns the Qdrant Edge shard, and what each
process has done, as its ``<ns>.ops.stats`` answers show (read every half second, so the
counts of a process killed later are kept); after the run, the index the owner left and the
warnings in a worker's log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import nats

from memstream.consumers.bench.processes import WorkerProcess
from memstream.consumers.opsstats import answers
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import Subjects
from memstream.storage.embedding import make_embedder
from memstream.storage.qdrant_edge import EdgeVectorIndex

EXTRA_STAGES = "extract,redact"


def extras(env: dict[str, str], base: Path, n: int) -> list[WorkerProcess]:
    """``n`` extract/redact processes on the owner's services (``env``), each with a state
    directory and a log of its own."""
    return [
        WorkerProcess(env, base / f"extra-{i}", base / f"extra-{i}.log", ["--stages", EXTRA_STAGES])
        for i in range(n)
    ]


class StatsWatch:
    """What each worker process (by pid) has handled per stage, as last seen: messages acked,
    plus batches handed on to the stage in memory (a fused chain, consumers/chains.py)."""

    def __init__(self, nc: Any, namespace: str, every_s: float = 0.5) -> None:
        self.nc, self.every_s = nc, every_s
        self.subject = Subjects(namespace).ops("stats")
        self.handled: dict[int, dict[str, int]] = {}

    async def poll(self) -> None:
        for answer in await answers(self.nc, self.subject, 0.3):
            pid = str(answer.get("worker", "")).rpartition(":")[2]
            if pid.isdigit():
                stages = answer.get("stages") or {}
                self.handled[int(pid)] = {
                    k: int(v.get("acked", 0)) + int(v.get("fused", 0)) for k, v in stages.items()
                }

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # NATS away (its own fault) or a worker between lives: read again next round
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)

    async def working(self, proc: WorkerProcess, limit_s: float = 30.0) -> bool:
        """Wait until the current life of ``proc`` has handled work of each of its stages
        (read afresh), so that a kill lands on a process that holds work; False if it has
        not after ``limit_s``."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                await self.poll()
            counts = self.handled.get(proc.pids[-1]) or {}
            if all(counts.get(stage, 0) > 0 for stage in EXTRA_STAGES.split(",")):
                return True
            await asyncio.sleep(0.1)
        return False

    def report(self, owner: WorkerProcess, extra: Sequence[WorkerProcess]) -> list[dict[str, Any]]:
        """One row per process started: its role, pid and handled counts (None: never seen)."""
        rows = [("owner", owner)] + [(f"extra-{i}", x) for i, x in enumerate(extra)]
        return [
            {"process": name, "pid": pid, "handled": self.handled.get(pid)}
            for name, proc in rows
            for pid in proc.pids
        ]


async def count_index(state_dir: Path, pg_dsn: str) -> dict[str, int]:
    """Points in the worker's Qdrant Edge shard (the worker stopped), and Postgres's live
    memories missing from it."""
    embedder = make_embedder(None, None)
    index = EdgeVectorIndex(state_dir / "qdrant" / Settings().collection)
    await index.ensure(embedder.dim)
    con = await asyncpg.connect(pg_dsn)
    try:
        rows = await con.fetch(
            "SELECT tenant, id::text AS id FROM memories WHERE deleted_at IS NULL"
        )
        by_tenant: dict[str, list[str]] = {}
        for r in rows:
            by_tenant.setdefault(r["tenant"], []).append(r["id"])
        missing = 0
        for tenant, ids in by_tenant.items():
            for i in range(0, len(ids), 500):
                found = await index.fetch(tenant, ids[i : i + 500])
                missing += len(ids[i : i + 500]) - len(found)
        return {"points": await index.count(), "missing": missing, "live": len(rows)}
    finally:
        await con.close()
        await index.close()


def log_events(path: Path) -> dict[str, int]:
    """How often each warning or error event appears in the worker's log."""
    seen: Counter[str] = Counter()
    with contextlib.suppress(OSError), path.open(errors="replace") as lines:
        for line in lines:
            with contextlib.suppress(ValueError, AttributeError):
                entry = json.loads(line)
                seen[f"{entry.get('level', '?')} {entry.get('event', '?')}"] += 1
    return dict(seen.most_common(12))


_STAGE_COLUMNS = (("extract", 9), ("redact", 8), ("dedupe", 8), ("store", 8))


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """``StatsWatch.report`` as printed lines: one per process life, handled per stage."""
    lines = [f"  {'process':<10}{'pid':>9}{'extract':>9}{'redact':>8}{'dedupe':>8}{'store':>8}"]
    for p in rows:
        handled = p["handled"] or {}
        counts = "".join(f"{handled.get(s, '-')!s:>{w}}" for s, w in _STAGE_COLUMNS)
        lines.append(f"  {p['process']:<10}{p['pid']:>9}{counts}")
    return lines

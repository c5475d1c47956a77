"""The pipeline an ingest benchmark runs against, and how it reads the stages' counters.

- ``in_process``: the workers in the benchmark's own process, on the embedded stack or the
  configured services (``bench_stack``); the counters are read from the worker itself. The
  benchmark's clients then share an event loop with the stages, so a client's latency also
  holds the time the loop spent on a stage batch.
- ``in_processes``: as deployed: its own NATS and PostgreSQL, one ``memstream worker``
  process that owns the Qdrant Edge shard (all roles), and ``extra`` processes running only
  extract and redact (``--stages extract,redact``); the benchmark is only a client. The
  counters are the sum of every process's ``<ns>.ops.stats`` answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import nats

from memstream.consumers.bench import fleet
from memstream.consumers.bench.cpu import Roles, own_seconds, process_seconds, tree_seconds
from memstream.consumers.bench.harness import bench_stack, until_drained
from memstream.consumers.bench.processes import WorkerProcess
from memstream.consumers.embedded import EmbeddedNats, EmbeddedPostgres
from memstream.consumers.natsconn import nats_options
from memstream.consumers.opsstats import answers
from memstream.consumers.topology import drained
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import STAGES, Subjects

# per stage: wall time with a batch in hand (s), messages, batches, outputs
# by stage: (busy seconds, messages, batches, outputs); under OPTIMIZE, the index's
# optimizations that built something: (their seconds in all, how many, 0, 0); under
# REDELIVERED, the messages every stage handled again: (0, how many, 0, 0)
Counts = dict[str, tuple[float, int, int, int]]
OPTIMIZE = "index optimize"
REDELIVERED = "redelivered"
STEP = "step:"  # the key of a batch step's (seconds, batches): ``STEP + name``
DEADLOCKS = "postgres deadlocks"  # (0, deadlocks PostgreSQL broke in the database so far, 0, 0)


async def _deadlocks(dsn: str) -> tuple[float, int, int, int]:
    """The deadlocks PostgreSQL has broken in the database of ``dsn``. Each one stalls the
    statements in it for ``deadlock_timeout`` (1 s) before one of them is cancelled and
    retried, so a run that has any shows it in its tail."""
    con = await asyncpg.connect(dsn)
    try:
        n = await con.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await con.close()
    return (0.0, int(n or 0), 0, 0)


@dataclass
class Pipeline:
    """What the benchmark needs of the pipeline under test."""

    settings: Settings
    nats_url: str
    processes: int  # worker processes (0: the workers run in the benchmark's process)
    database_url: str
    counts: Callable[[], Awaitable[Counts]]
    is_drained: Callable[[], Awaitable[bool]]
    cpu: Roles = field(default_factory=Roles)  # CPU seconds of each process, by role

    async def wait_drained(self, limit_s: float) -> float:
        return await until_drained(self.is_drained, limit_s)


@contextlib.asynccontextmanager
async def in_process() -> AsyncIterator[Pipeline]:
    async with bench_stack() as bench:
        metrics = bench.worker.deps.metrics

        async def counts() -> Counts:
            out: Counts = {
                s: (
                    metrics[s].active_until_now(),
                    metrics[s].processed,
                    metrics[s].batches,
                    metrics[s].outputs,
                )
                if s in metrics
                else (0.0, 0, 0, 0)
                for s in STAGES
            }
            out[OPTIMIZE] = (bench.worker.optimized_s, bench.worker.optimizations, 0, 0)
            for step, (seconds, count) in bench.worker.deps.steps.items():
                out[STEP + step] = (seconds, int(count), 0, 0)
            again = sum(m.redelivered for m in metrics.values())
            out[REDELIVERED] = (0.0, again, 0, 0)
            out[DEADLOCKS] = await _deadlocks(bench.stack.database_url)
            return out

        cpu = Roles()
        cpu.add("benchmark and workers", own_seconds)
        yield Pipeline(
            bench.settings,
            bench.stack.nats_url,
            0,
            bench.stack.database_url,
            counts,
            bench.drained,
            cpu,
        )


@contextlib.asynccontextmanager
async def in_processes(extra: int) -> AsyncIterator[Pipeline]:
    """Servers of its own and ``1 + extra`` worker processes; everything stopped after."""
    namespace = f"bench{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="memstream-ingest-") as tmp:
        base = Path(tmp)
        with contextlib.ExitStack() as started:
            nats_server = await asyncio.to_thread(EmbeddedNats.start, base / "nats")
            started.callback(nats_server.stop)
            # pg_stat_statements preloaded, for --pg-statements (counting only when asked)
            pg_server = await asyncio.to_thread(EmbeddedPostgres.start, base / "postgres", True)
            started.callback(pg_server.stop)
            env = {
                "MEMSTREAM_NATS_URL": nats_server.url,
                "MEMSTREAM_DATABASE_URL": pg_server.dsn,
                "MEMSTREAM_NAMESPACE": namespace,
                # one key for every process: placeholders must match whichever one redacts
                "MEMSTREAM_REDACTION_KEY": secrets.token_hex(32),
                # the settings under test (MEMSTREAM_STAGE__BATCHED ..., the index's segments),
                # as given here
                **{
                    k: v
                    for k, v in os.environ.items()
                    if k.startswith("MEMSTREAM_STAGE__") or k.startswith("MEMSTREAM_INDEX_SEGMENT")
                },
            }
            workers = [WorkerProcess(env, base / "owner", base / "owner.log")]
            workers += fleet.extras(env, base, extra)
            for w in workers:
                started.callback(w.stop)
                await asyncio.to_thread(w.start)
            settings = Settings(nats_url=nats_server.url, namespace=namespace)
            nc = await nats.connect(nats_server.url, **nats_options(settings))
            try:
                yield Pipeline(
                    settings,
                    nats_server.url,
                    len(workers),
                    pg_server.dsn,
                    lambda: _summed(
                        nc, Subjects(namespace).ops("stats"), len(workers), pg_server.dsn
                    ),
                    lambda: drained(nc.jetstream(), settings),
                    _roles(workers, nats_server, pg_server),
                )
            finally:
                await nc.close()


def _roles(workers: list[WorkerProcess], bus: EmbeddedNats, db: EmbeddedPostgres) -> Roles:
    """Each process's CPU seconds: the owner, its helper, the extract/redact processes (with
    their helpers), PostgreSQL's postmaster with its backends, nats-server, the benchmark."""
    owner, extras = workers[0], workers[1:]
    postmaster = int((db.data_dir / "postmaster.pid").read_text().split()[0])
    cpu = Roles()
    cpu.add_pids("worker (owns the index)", lambda: owner.live_pids()[:1])
    cpu.add_pids("its helper process", owner.helper_pids)
    cpu.add_pids("its index process", owner.index_pids)
    if extras:
        cpu.add_pids("extract/redact processes", lambda: [p for w in extras for p in w.live_pids()])
    cpu.add("postgres", lambda: tree_seconds(postmaster))
    cpu.add("nats-server", lambda: process_seconds(bus.proc.pid))
    cpu.add("benchmark (clients)", own_seconds)
    return cpu


async def _summed(nc: Any, subject: str, processes: int, dsn: str) -> Counts:
    """Every process's stage counters, summed (asked again until all ``processes`` answer),
    and the deadlocks of the database at ``dsn``."""
    found: list[dict[str, Any]] = []
    for _ in range(10):
        found = await answers(nc, subject, 2.0, None)
        if len({a.get("worker") for a in found}) >= processes:
            break
    else:
        raise TimeoutError(f"{len(found)} of {processes} worker processes answered ops.stats")
    out: Counts = {}
    for s in STAGES:
        rows = [a.get("stages", {}).get(s) or {} for a in found]
        out[s] = (
            sum(float(r.get("active_s", 0.0)) for r in rows),
            sum(int(r.get("processed", 0)) for r in rows),
            sum(int(r.get("batches", 0)) for r in rows),
            sum(int(r.get("outputs", 0)) for r in rows),
        )
    built = [a.get("index_optimizations") or {} for a in found]
    out[OPTIMIZE] = (
        sum(float(b.get("seconds", 0.0)) for b in built),
        sum(int(b.get("count", 0)) for b in built),
        0,
        0,
    )
    again = sum(int(r.get("redelivered", 0)) for a in found for r in a.get("stages", {}).values())
    out[REDELIVERED] = (0.0, again, 0, 0)
    for a in found:
        for step, t in (a.get("steps") or {}).items():
            seconds, count, *_ = out.get(STEP + step, (0.0, 0, 0, 0))
            out[STEP + step] = (seconds + float(t["seconds"]), count + int(t["count"]), 0, 0)
    out[DEADLOCKS] = await _deadlocks(dsn)
    return out

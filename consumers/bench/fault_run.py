"""One run of the fault suite (``memstream bench faults``, consumers/bench/faults.py): start
nats-server, PostgreSQL and the worker processes, publish the turns while the plan's faults are
made (consumers/bench/fault_plan.py), wait for the pipeline to drain, and count what was stored,
indexed and dead-lettered.

Separate from ``faults.py``, which is the command (its arguments, the targets and the printed
report), because this is the part that starts, kills and reads processes and servers; the
report is read from the dictionary it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats

from memstream.consumers.bench import fleet
from memstream.consumers.bench import publisher as feed
from memstream.consumers.bench.conversations import sessions, turns
from memstream.consumers.bench.fault_plan import Gate, inject_plan
from memstream.consumers.bench.processes import Services, WorkerProcess
from memstream.consumers.bench.publisher import EPISODE_EVENTS, Probe, Progress, Publisher
from memstream.consumers.dlq import dead_letters
from memstream.consumers.embedded import EmbeddedNats, EmbeddedPostgres
from memstream.consumers.topology import drained
from memstream.producers.client import MemoryClient
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import DLQ_REASON_HEADER, DLQ_STAGE_HEADER, Subjects

NAMESPACE = "mem"

DUPLICATED_TURNS = """
SELECT d.e, d.ids, array(
    SELECT v.event_key FROM memory_events v WHERE v.memory_id = ANY(d.mids) ORDER BY v.seq
) AS audit
FROM (SELECT e, array_agg(m.id::text) AS ids, array_agg(m.id) AS mids
      FROM memories m, unnest(m.source_event_ids) e
      WHERE m.type = 'episode' AND m.deleted_at IS NULL
      GROUP BY e HAVING count(*) > 1 LIMIT 5) d"""


async def _until(check: Callable[[], Awaitable[bool]], limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):  # NATS coming back
            if await check():
                return True
        await asyncio.sleep(0.25)
    return False


async def run(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    """Start the servers, run the ingest with its faults, stop everything it started."""
    with contextlib.ExitStack() as started:
        nats_server = await asyncio.to_thread(EmbeddedNats.start, base / "nats")
        started.callback(nats_server.stop)
        pg_server = await asyncio.to_thread(EmbeddedPostgres.start, base / "postgres")
        started.callback(pg_server.stop)
        return await _ingest(args, base, nats_server, pg_server, started)


async def _ingest(
    args: argparse.Namespace,
    base: Path,
    nats_server: EmbeddedNats,
    pg_server: EmbeddedPostgres,
    started: contextlib.ExitStack,
) -> dict[str, Any]:
    t0 = time.monotonic()
    flag = base / "index-offline"
    env = {
        "MEMSTREAM_NATS_URL": nats_server.url,
        "MEMSTREAM_DATABASE_URL": pg_server.dsn,
        "MEMSTREAM_NAMESPACE": NAMESPACE,
        "MEMSTREAM_LOG_LEVEL": "INFO",  # the maintenance rounds (reconcile.indexed ...)
        # one key for every process: a turn redacted again elsewhere must read the same
        "MEMSTREAM_REDACTION_KEY": secrets.token_hex(32),
        # the stage settings under test (MEMSTREAM_STAGE__BATCHED ...), as this process has them
        **{k: v for k, v in os.environ.items() if k.startswith("MEMSTREAM_STAGE__")},
    }
    worker = WorkerProcess(
        {**env, "MEMSTREAM_FAULT_VECTOR_OFFLINE_FILE": str(flag)},
        base / "worker",
        base / "worker.log",
    )
    started.callback(worker.kill)
    extras = fleet.extras(env, base, args.extra_workers)
    for extra in extras:
        started.callback(extra.kill)
    services = Services(
        nats_server, pg_server, worker, flag, args.outage_s, args.index_outage_s, extras
    )
    settings = Settings(nats_url=nats_server.url, namespace=NAMESPACE)
    probe = Probe(pg_server.dsn)
    checks = Probe(pg_server.dsn)  # the fault plan's reads, beside the monitor's

    async def stored_now() -> int | None:
        row = await checks.fetchrow(EPISODE_EVENTS)
        return None if row is None else int(row["events"])

    stop = asyncio.Event()
    nc = None
    try:
        startup_s = await asyncio.to_thread(worker.start)
        for extra in extras:
            await asyncio.to_thread(extra.start)
        nc = await nats.connect(
            nats_server.url,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=_quiet,  # the outage is the point: no traceback per reconnect attempt
        )
        watch = fleet.StatsWatch(nc, NAMESPACE)
        watching = asyncio.create_task(watch.run(stop))
        js = nc.jetstream()
        plan = turns(args.turns, sessions(args.tenants, args.users))
        clients = {
            t: MemoryClient(t, nats_url=nats_server.url, namespace=NAMESPACE)
            for t in {t.tenant for t in plan}
        }
        for c in clients.values():
            await c.connect()
        to_publish = feed.events(clients, plan)
        progress = Progress()
        # more than a killed worker may hold unacked (a stage pulls 64 at a time): those come
        # back only after the ack deadline, and the publisher must not wait for them
        ahead = args.ahead or max(100, args.turns // 10)
        gate = Gate(args.turns, len(args.faults), ahead)
        publisher = Publisher(clients, progress, ahead, gate.limit)
        monitoring = asyncio.create_task(feed.monitor(probe, progress, stop))
        publishing = asyncio.create_task(publisher.run(to_publish))
        faults = await inject_plan(
            services,
            args.faults,
            progress,
            publisher,
            gate,
            args.stall_limit_s,
            t0,
            watch,
            stored_now,
        )
        with contextlib.suppress(TimeoutError):  # a stalled pipeline holds the publisher
            await asyncio.wait_for(asyncio.shield(publishing), args.drain_limit_s)
        last_fault = faults[-1]["ended_at"] if faults else time.monotonic()
        acked = sorted(publisher.acked)

        waiting: dict[str, Any] = {}

        async def done() -> bool:
            """Every acked turn has its episode, every stage is empty, every memory indexed."""
            row = await probe.fetchrow(
                "SELECT count(DISTINCT e) AS n FROM memories m, unnest(m.source_event_ids) e "
                "WHERE m.type = 'episode' AND e = ANY($1::text[])",
                acked,
            )
            unindexed = await probe.fetchrow(
                "SELECT count(*) AS n FROM memories WHERE NOT indexed AND deleted_at IS NULL"
            )
            empty = await drained(js, settings)
            waiting.update(
                episodes=None if row is None else row["n"],
                unindexed=None if unindexed is None else unindexed["n"],
                stages_empty=empty,
            )
            if time.monotonic() - waiting.get("said", 0.0) > 10:
                waiting["said"] = time.monotonic()
                print(
                    f"  draining: episodes {waiting['episodes']}/{len(acked)}, unindexed "
                    f"{waiting['unindexed']}, stages empty: {empty}",
                    file=sys.stderr,
                )
            return bool(
                row and unindexed and row["n"] == len(acked) and not unindexed["n"] and empty
            )

        finished = await _until(done, args.drain_limit_s)
        drain_s = time.monotonic() - last_fault if finished else None
        await watch.poll()  # the last counts, before the processes stop
        stop.set()
        await asyncio.gather(monitoring, watching)
        publishing.cancel()
        dead = await dead_letters(js, Subjects(NAMESPACE), None, 10_000)
        for c in clients.values():
            await c.close()
        extra_codes = [await asyncio.to_thread(x.stop) for x in extras]
        exit_code = await asyncio.to_thread(worker.stop)
        index = await fleet.count_index(worker.state_dir, pg_server.dsn)
        row = await probe.fetchrow(EPISODE_EVENTS)
        stored_ids = await probe.fetch(
            "SELECT DISTINCT e FROM memories m, unnest(m.source_event_ids) e "
            "WHERE m.type = 'episode' AND m.deleted_at IS NULL"
        )
        if stored_ids is None:
            raise RuntimeError("PostgreSQL did not answer the final count")
        stored = {r["e"] for r in stored_ids}
        memories = await probe.fetchrow("SELECT count(*) AS n FROM memories")
        # a duplicated turn, explained: the episodes that hold it and what the audit says
        twice = await probe.fetch(DUPLICATED_TURNS) or []
        reasons: Counter[str] = Counter(
            f"{(m.headers or {}).get(DLQ_STAGE_HEADER)}: {(m.headers or {}).get(DLQ_REASON_HEADER)}"
            for m in dead
        )
        return {
            "turns": args.turns,
            "plan": args.faults,
            "tenants": len(clients),
            "published": len(acked),
            "publish_retries": publisher.retries,
            "publish_errors": dict(publisher.errors),
            "acked_as_duplicate": publisher.duplicate_acks,
            "publish_s": round(publisher.took_s, 1) if publisher.took_s else None,
            "ahead": ahead,
            "episodes_stored": len(stored & set(acked)),
            "lost": len(set(acked) - stored),
            "unexpected": len(stored - set(acked)),
            "duplicated": int(row["refs"] - row["events"]) if row else None,
            "duplicated_turns": [
                {"event": r["e"], "memories": list(r["ids"]), "audit": list(r["audit"])}
                for r in twice
            ],
            "memories_postgres": int(memories["n"]) if memories else None,
            "memories_live": index["live"],
            "points_index": index["points"],
            "missing_in_index": index["missing"],
            "dead_letters": len(dead),
            "dead_letter_reasons": dict(reasons),
            "drain_after_last_fault_s": round(drain_s, 1) if drain_s is not None else None,
            "worker_startup_s": round(startup_s, 1),
            "worker_starts": worker.starts,
            "worker_exit_code": exit_code,
            "extra_workers": len(extras),
            "extra_starts": sum(x.starts for x in extras),
            "extra_exit_codes": extra_codes,
            "processes": watch.report(worker, extras),
            "faults": [
                {
                    **{k: v for k, v in f.items() if k != "ended_at"},
                    "next_stored_after_s": _round(progress.next_growth(f["ended_at"])),
                }
                for f in faults
            ],
            "total_s": round(time.monotonic() - t0, 1),
            "worker_log_events": fleet.log_events(worker.log),
        }
    finally:
        stop.set()
        await probe.close()
        await checks.close()
        if nc is not None:
            await nc.close()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


async def _quiet(exc: Exception) -> None:
    return None

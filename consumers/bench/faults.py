"""Faults during ingest: worker, nats-server and PostgreSQL killed, the vector index taken away.

Starts its own nats-server and PostgreSQL (from the wheels, free ports, a temp directory) and
``memstream worker`` as a child process, publishes N turns with the SDK (several tenants;
preferences, facts, personal data, filler), and while the pipeline works through them makes
each fault of the plan happen once, at a share of the turns stored: the worker SIGKILLed and
started again, nats-server SIGKILLed and started again on its port and store, PostgreSQL
SIGKILLed (every process) and started again, the vector index made unavailable (the worker's
offline switch, ``fault_vector_offline_file``) and brought back, the worker SIGKILLed again.
With ``--extra-workers N``, N ``memstream worker --stages extract,redact`` processes share
those stages with the worker (which owns the Qdrant Edge shard), and ``extra_kill`` SIGKILLs
the first of them and starts it again. ``helper_kill`` SIGKILLs the worker's helper process
(consumers/helper.py), which the worker replaces by itself; ``index_kill`` its index process
(consumers/indexproc.py), which the worker replaces at its next index call.

The publisher keeps at most ``--ahead`` turns beyond what is stored, so publishing lasts the
whole ingest and meets the NATS outage too; a publish that fails is retried with the same
event id (``Nats-Msg-Id``), so a turn whose PubAck was lost is stored once. Until a fault is
made, it publishes no more than ``--ahead`` turns past the one at which that fault is due
(``Gate``, consumers/bench/fault_plan.py). Each fault's row says how many turns were in
flight when it was made.

Targets: no turn lost or duplicated, the index holding exactly the memories Postgres holds,
no dead letter, everything processed within 60 s of the end of the last fault, and every
extra process extracted and redacted turns. The exit code is 1 when a target is missed.
The workers take the stage settings of the environment (MEMSTREAM_STAGE__*: batches on or off,
the ack deadline ...).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats

from memstream.consumers.bench import fleet
from memstream.consumers.bench import publisher as feed
from memstream.consumers.bench.conversations import sessions, turns
from memstream.consumers.bench.fault_plan import KINDS, PLAN, Gate, inject_plan
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
DRAIN_TARGET_S = 60.0


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


def targets(r: dict[str, Any]) -> dict[str, bool]:
    """Each target, met or not."""
    drain = r["drain_after_last_fault_s"]
    extras: dict[str, bool] = {}
    for row in r["processes"]:
        if row["process"] != "owner":
            did = all((row["handled"] or {}).get(stage, 0) > 0 for stage in ("extract", "redact"))
            extras[row["process"]] = extras.get(row["process"], False) or did
    return {
        "every fault injected": [f["fault"] for f in r["faults"]] == r["plan"],
        "0 lost": r["lost"] == 0 and r["published"] == r["turns"],
        "0 duplicated": r["duplicated"] == 0 and r["unexpected"] == 0,
        "index == Postgres": r["points_index"] == r["memories_live"] == r["memories_postgres"]
        and r["missing_in_index"] == 0,
        "0 dead letters": r["dead_letters"] == 0,
        f"drained within {DRAIN_TARGET_S:.0f} s of the last fault": drain is not None
        and drain <= DRAIN_TARGET_S,
        "every extra process extracted and redacted": all(extras.values()),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=3000)
    p.add_argument(
        "--faults",
        type=_plan,
        default=PLAN,
        help=f"the faults, in order, comma-separated, from {', '.join(KINDS)} "
        f"(default: {','.join(PLAN)})",
    )
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--users", type=int, default=4, help="users per tenant")
    p.add_argument(
        "--ahead",
        type=int,
        default=None,
        help="turns published beyond those stored (default: a tenth of --turns, at least 100)",
    )
    p.add_argument("--outage-s", type=float, default=2.0, help="NATS and Postgres stay down")
    p.add_argument("--index-outage-s", type=float, default=5.0, help="the index stays away")
    p.add_argument("--drain-limit-s", type=float, default=300.0, help="give up waiting after")
    p.add_argument("--stall-limit-s", type=float, default=180.0, help="no progress: give up")
    p.add_argument(
        "--extra-workers",
        type=int,
        default=0,
        help="extra `memstream worker --stages extract,redact` processes beside the worker",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp directory (logs, data)")


def _plan(text: str) -> list[str]:
    plan = [f.strip() for f in text.split(",") if f.strip()]
    if not plan or any(f not in KINDS for f in plan):
        raise argparse.ArgumentTypeError(f"faults are from {', '.join(KINDS)}")
    return plan


def main(args: argparse.Namespace) -> int:
    if "extra_kill" in args.faults and args.extra_workers < 1:
        print("memstream: the extra_kill fault needs --extra-workers 1 or more", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="memstream-faults-")
    try:
        r = asyncio.run(run(args, Path(tmp)))
    finally:
        if args.keep:
            print(f"  kept {tmp}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    met = targets(r)
    print(
        f"\nfaults during ingest: {r['turns']:,} turns, {r['tenants']} tenants, "
        f"{r['total_s']} s in all (worker start-up {r['worker_startup_s']} s)"
    )
    print(
        f"  {'fault':<15}{'at stored':>12}{'in flight':>11}{'started':>10}{'away':>8}"
        f"{'next stored':>13}"
    )
    for f in r["faults"]:
        nxt = "-" if f["next_stored_after_s"] is None else f"+{f['next_stored_after_s']} s"
        print(
            f"  {f['fault']:<15}{f['at_stored']:>12,}{f['in_flight']:>11,}{f['started_s']:>9} s"
            f"{f['down_s']:>6} s{nxt:>13}"
        )
    drain = r["drain_after_last_fault_s"]
    rows = [
        (
            "turns published (acked)",
            r["published"],
            f"in {r['publish_s']} s, {r['publish_retries']} publishes retried "
            f"({r['acked_as_duplicate']} acked as duplicates), at most {r['ahead']} ahead",
        ),
        ("episodes stored", r["episodes_stored"], f"lost {r['lost']}"),
        ("duplicated", r["duplicated"], f"stored but never acked {r['unexpected']}"),
        ("memories in Postgres", r["memories_postgres"], f"live {r['memories_live']}"),
        ("points in the index", r["points_index"], f"missing {r['missing_in_index']}"),
        ("dead letters", r["dead_letters"], "; ".join(r["dead_letter_reasons"]) or "-"),
        ("drained after last fault", "never" if drain is None else f"{drain} s", ""),
    ]
    for label, value, note in rows:
        print(f"  {label:<26}{value!s:>10}   {note}")
    if r["extra_workers"]:
        print("\n".join(fleet.table(r["processes"])))
    for turn in r["duplicated_turns"]:
        print(f"  duplicated turn {turn['event']}: episodes {', '.join(turn['memories'])}")
        print(f"    audit: {'; '.join(turn['audit'])}")
    for name, ok in met.items():
        print(f"  target {name}: {'met' if ok else 'MISSED'}")
    if args.json:
        print(json.dumps({**r, "targets": met}))
    return 0 if all(met.values()) else 1

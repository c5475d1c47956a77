"""Ingest throughput and latency, end to end: publish turns, wait until each is recallable.

In one run, on one server:
1. the bare JetStream hop: N messages published (pipelined), then pulled and acked: the
   ceiling any stage of the pipeline is measured against;
2. throughput: N turns (a user message of ~300 characters with PII, preferences, decisions
   or filler, and an assistant reply) over several tenants, owners and sessions, published as
   fast as PubAcks allow (each session in order); the clock stops when the last turn's
   episode is announced on ``mem.events`` (``stored``, or ``merged`` for an exact repeat):
   its Postgres row and index point are written by then, so it is recallable;
3. latency: turns paced at a fixed rate, publish-to-``stored`` per turn, while one client
   sends recall requests back to back (a mixed workload), or at most ``--recall-rate`` a
   second. Back to back, the recall load grows as recall gets faster and takes CPU from the
   workers' ingest; a fixed rate keeps the two figures apart. The recall client is a process
   of its own, as an agent's client is (consumers/bench/recaller.py); each reply's own
   ``timings_ms.total`` (the index's search) is reported beside the client's time.
Per-stage busy time and batch sizes come from the workers' stage metrics. ``--processes``
picks where the workers run (consumers/bench/pipelines.py): in worker processes beside the
benchmark, as deployed (the default: one that owns the index, the rest extract/redact
only), or in the benchmark's own process (0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import nats

from memstream.consumers.bench import pgstatements
from memstream.consumers.bench.conversations import long_text, sessions, turns
from memstream.consumers.bench.cpu import process_seconds
from memstream.consumers.bench.harness import cpu_gauge, percentile, progress
from memstream.consumers.bench.ingest_report import (
    deadlocks,
    optimizations,
    print_report,
    redelivered,
    stage_report,
    step_report,
)
from memstream.consumers.bench.pipelines import in_process, in_processes
from memstream.consumers.bench.recaller import RecallClient, RecallLoad
from memstream.consumers.natsconn import nats_options
from memstream.producers.client import MemoryClient
from memstream.schemas.subjects import Subjects


@dataclass
class Watch:
    """Arrival times of episode events on ``mem.events``, by source event id."""

    arrived: dict[str, float] = field(default_factory=dict)
    events: int = 0
    duplicates: int = 0
    waiters: dict[str, asyncio.Future[float]] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # what ``all_of`` waits for
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_event(self, msg: Any) -> None:
        now = time.perf_counter()
        self.events += 1
        body = json.loads(msg.data)
        if body.get("type") != "episode" or body.get("kind") not in ("stored", "merged"):
            return
        source = body.get("source_event_id") or ""
        if source in self.arrived:
            self.duplicates += 1
            return
        self.arrived[source] = now
        self.pending.discard(source)
        if not self.pending:
            self.done.set()
        if (fut := self.waiters.pop(source, None)) is not None and not fut.done():
            fut.set_result(now)

    async def all_of(self, ids: list[str], limit_s: float) -> int:
        """Wait until every id arrived or ``limit_s`` passed; returns how many are missing."""
        self.pending = {e for e in ids if e not in self.arrived}
        self.done.clear()
        if self.pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), limit_s)
        return sum(1 for e in ids if e not in self.arrived)


async def bare_hop(nc: Any, prefix: str, n: int, size: int) -> dict[str, float]:
    """Publish ``n`` messages of ``size`` bytes to a fresh file stream (PubAcks awaited in
    windows of 256), then pull and ack them in batches of 256: msgs/s of the whole hop."""
    js = nc.jetstream()
    stream, subject = f"{prefix}_HOP", f"{prefix}.hop.x"
    await js.add_stream(name=stream, subjects=[f"{prefix}.hop.>"])
    payload = b"x" * size
    try:
        started = time.perf_counter()
        for lo in range(0, n, 256):
            await asyncio.gather(
                *(js.publish(subject, payload) for _ in range(lo, min(n, lo + 256)))
            )
        published = time.perf_counter()
        sub = await js.pull_subscribe(subject, durable=f"{prefix}_hop")
        got = 0
        while got < n:
            msgs = await sub.fetch(256, timeout=5.0)
            for m in msgs:
                await m.ack()
            got += len(msgs)
        done = time.perf_counter()
    finally:
        await js.delete_stream(stream)
    return {
        "msgs_per_s": round(n / (done - started), 1),
        "publish_per_s": round(n / (published - started), 1),
        "pull_ack_per_s": round(n / (done - published), 1),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    gauge = cpu_gauge()  # before any worker runs: how fast this machine is now
    pipeline = in_process() if args.processes == 0 else in_processes(args.processes - 1)
    async with pipeline as pipe:
        namespace = pipe.settings.namespace
        nc = await nats.connect(pipe.nats_url, **nats_options(pipe.settings))
        watch = Watch()
        subjects = Subjects(namespace)
        await nc.subscribe(subjects.events(), cb=watch.on_event, pending_msgs_limit=1_000_000)
        clients: dict[str, MemoryClient] = {}
        pool = sessions(args.tenants, args.users, args.sessions)
        for tenant in {s.tenant for s in pool}:
            clients[tenant] = await MemoryClient(
                tenant, nats_url=pipe.nats_url, namespace=namespace
            ).connect()
        try:
            hop = await bare_hop(nc, f"{namespace}hop", args.hop_messages, 600)
            print(f"  bare JetStream hop: {hop['msgs_per_s']:,.0f} msgs/s", flush=True)
            run_id = uuid.uuid4().hex[:6]

            # --- throughput -------------------------------------------------------------
            ids = [f"ing-{run_id}-{i}" for i in range(args.turns)]
            per_session: dict[int, list[int]] = {}
            for i in range(args.turns):
                per_session.setdefault(i % len(pool), []).append(i)
            plan = turns(args.turns, pool, args.seed, text=long_text, replies=1.0)
            # the statement counts, if asked for, cover this run alone
            async with pgstatements.Counting(pipe.database_url, args.pg_statements) as pg:
                before = await pipe.counts()
                cpu_before = pipe.cpu.read()
                started = time.perf_counter()
                published = 0

                async def publish_session(order: list[int]) -> None:
                    nonlocal published
                    for i in order:  # one session's turns, in order
                        t = plan[i]
                        await clients[t.tenant].publish_turn(
                            t.messages, user=t.user, session=t.session, event_id=ids[i]
                        )
                        published += 1
                        if published % 1000 == 0 or published == args.turns:
                            progress("published", published, args.turns, started)

                await asyncio.gather(*(publish_session(o) for o in per_session.values()))
                publish_s = time.perf_counter() - started
                missing = await watch.all_of(ids, args.timeout)
                cpu_wall = time.perf_counter() - started
                cpu_cores = pipe.cpu.cores(cpu_before, pipe.cpu.read(), cpu_wall)
                # what a turn costs each process in CPU: the cap on turns/s that the cores set
                cpu_ms = {
                    k: round(1000 * c * cpu_wall / args.turns, 3) for k, c in cpu_cores.items()
                }
                last = max((watch.arrived[e] for e in ids if e in watch.arrived), default=started)
                elapsed = last - started
                await pipe.wait_drained(args.timeout)
                after = await pipe.counts()
                statements = await pg.report()
            turns_per_s = (args.turns - missing) / elapsed if elapsed > 0 else 0.0
            print(
                f"  throughput: {args.turns - missing} turns recallable in {elapsed:.1f} s "
                f"({turns_per_s:,.0f} turns/s)",
                flush=True,
            )

            # --- latency at a paced rate, with recall running -----------------------------
            paced_ids = [f"ing-{run_id}-p{i}" for i in range(args.paced_turns)]
            paced = turns(
                args.paced_turns, pool, args.seed + 2, text=long_text, replies=1.0, first=args.turns
            )
            latencies: list[float] = []
            recaller = RecallClient(
                RecallLoad(pipe.nats_url, namespace, pool, args.seed + 1, args.recall_rate)
            )
            await recaller.start()
            pipe.cpu.add("recall client", lambda: process_seconds(recaller.pid or 0))

            async def one(i: int) -> None:
                t = paced[i]
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[float] = loop.create_future()
                watch.waiters[paced_ids[i]] = fut
                t0 = time.perf_counter()
                await clients[t.tenant].publish_turn(
                    t.messages, user=t.user, session=t.session, event_id=paced_ids[i]
                )
                try:
                    arrived = await asyncio.wait_for(fut, args.timeout)
                except TimeoutError:
                    return
                latencies.append((arrived - t0) * 1000)

            paced_before = await pipe.counts()
            paced_cpu = pipe.cpu.read()
            paced_started = time.perf_counter()
            tasks = []
            for i in range(args.paced_turns):
                due = paced_started + i / args.rate
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(one(i)))
            paced_publish_s = time.perf_counter() - paced_started
            await asyncio.gather(*tasks)
            paced_s = time.perf_counter() - paced_started
            paced_cores = pipe.cpu.cores(paced_cpu, pipe.cpu.read(), paced_s)
            recalled = await recaller.finish()
            paced_after = await pipe.counts()
            paced_stages = stage_report(paced_before, paced_after, paced_s)
            paced_missing = args.paced_turns - len(latencies)
        finally:
            for c in clients.values():
                await c.close()
            await nc.close()

    def pcts(xs: list[float], qs: tuple[int, ...]) -> dict[str, float | None]:
        return {f"p{q}": (round(percentile(xs, q), 2) if xs else None) for q in qs}

    return {
        "turns": args.turns,
        "tenants": args.tenants,
        "sessions": len(pool),
        "bare_hop": hop,
        "cpu_gauge_s": gauge,
        "throughput": {
            "turns_per_s": round(turns_per_s, 1),
            "seconds": round(elapsed, 2),
            "publish_per_s": round(args.turns / publish_s, 1),
            # six places: at a few hundred turns/s against a fast hop, four left a 1 % error
            "ratio_to_bare_hop": round(turns_per_s / hop["msgs_per_s"], 6),
            "missing": missing,
            "cores": cpu_cores,
            "cpu_ms_per_turn": cpu_ms,
        },
        "stages": stage_report(before, after, elapsed),
        "steps": step_report(before, after),
        "processes": pipe.processes,
        "candidates_per_turn": round((after["extract"][3] - before["extract"][3]) / args.turns, 2),
        "paced": {
            "rate": args.rate,
            "turns": args.paced_turns,
            "achieved_rate": round(args.paced_turns / paced_publish_s, 1),
            "latency_ms": pcts(latencies, (50, 95, 99)),
            "missing": paced_missing,
            "stages": paced_stages,
            "steps": step_report(paced_before, paced_after),
            "cores": paced_cores,
        },
        "recall_during_ingest": {
            "rate": args.recall_rate or None,  # None: back to back
            "requests": len(recalled.latency_ms),
            "errors": recalled.errors,
            "latency_ms": pcts(recalled.latency_ms, (50, 95, 99)),
            "server_ms": pcts(recalled.server_ms, (50, 95, 99)),
        },
        "lost": missing + paced_missing,
        "duplicate_events": watch.duplicates,
        "redelivered": {
            "throughput": redelivered(before, after),
            "paced": redelivered(paced_before, paced_after),
        },
        "postgres_deadlocks": {
            "throughput": deadlocks(before, after),
            "paced": deadlocks(paced_before, paced_after),
        },
        # each pauses the process that holds the index (recall included) for its seconds
        "index_optimizations": {
            "throughput": optimizations(before, after),
            "paced": optimizations(paced_before, paced_after),
        },
        "pg_statements": statements,
    }


def _per_second(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more per second, not {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=5000, help="turns for the throughput run")
    p.add_argument("--paced-turns", type=int, default=2500, help="turns for the latency run")
    p.add_argument("--rate", type=float, default=500.0, help="paced publish rate, turns/s")
    p.add_argument(
        "--recall-rate",
        type=_per_second,
        default=0.0,
        help="recall requests per second during the paced run (0: back to back)",
    )
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--users", type=int, default=4, help="owners per tenant")
    p.add_argument("--sessions", type=int, default=4, help="sessions per owner")
    p.add_argument("--hop-messages", type=int, default=20000, help="messages for the bare hop")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for turns")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes, on a NATS and PostgreSQL the benchmark starts: one owns the "
        "index, the others run extract and redact; 0: the workers run inside the benchmark's "
        "process, on the embedded stack or the configured services",
    )
    p.add_argument(
        "--pg-statements",
        type=_count,
        default=0,
        metavar="N",
        help="also report the N statements PostgreSQL spent the most execution time on in the "
        "throughput run (pg_stat_statements: the server the benchmark starts preloads it; "
        "with --processes 0 the server must, and the role be a superuser)",
    )


def main(args: argparse.Namespace) -> int:
    r = asyncio.run(run(args))
    print_report(r)
    if args.json:
        print(json.dumps(r))
    return 0 if r["lost"] == 0 else 1

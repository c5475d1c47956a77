"""Recall latency over NATS at the client, with N memories in the queried tenant.

Loads N synthetic memories into one tenant plus noise tenants straight into the stores
(Postgres rows and vector points, as the store stage writes them), then measures recall
round trips through the SDK: one client at a time, then several concurrent clients.
The memories and their loader are in ``recall_corpus.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from typing import Any

from memstream.consumers.bench.harness import bench_stack, cpu_gauge, percentile
from memstream.consumers.bench.recall_corpus import WORDS, load
from memstream.consumers.run import cpu_latency, locked


async def client_run(spec: dict[str, Any]) -> dict[str, Any]:
    """The agent side of the measurement (run in its own process): ``clients`` SDK clients,
    each sending its share of the queries one after the other."""
    from memstream.producers.client import MemoryClient

    clients = [
        await MemoryClient(
            spec["tenant"],
            user=spec["user"],
            nats_url=spec["nats_url"],
            namespace=spec["namespace"],
        ).connect()
        for _ in range(spec["clients"])
    ]
    latencies: list[float] = []
    server: list[float] = []  # the worker's own time per request (reply.timings_ms)
    parts: list[dict[str, float]] = []  # and its parts

    async def one(c: Any, qs: list[str]) -> None:
        for q in qs:
            t0 = time.perf_counter()
            reply = await c.recall(q, top_k=spec["top_k"], cache=False)  # not the cache
            latencies.append((time.perf_counter() - t0) * 1000)
            server.append(reply.timings_ms.get("total", 0.0))
            parts.append(reply.timings_ms)

    queries: list[str] = spec["queries"]
    await one(clients[0], queries[: min(50, len(queries))])  # warm-up
    latencies.clear()
    server.clear()
    parts.clear()
    share = len(queries) // len(clients)
    t0 = time.perf_counter()
    await asyncio.gather(
        *(one(c, queries[i * share : (i + 1) * share]) for i, c in enumerate(clients))
    )
    wall = time.perf_counter() - t0
    for c in clients:
        await c.close()
    return {"latencies": latencies, "server": server, "parts": parts, "wall_s": wall}


async def measure(bench: Any, queries: list[str], clients: int, top_k: int) -> dict[str, float]:
    """Latency at the client, measured by a separate process (as an agent would be), so the
    client's work does not share the worker's event loop."""
    spec = {
        "tenant": "bench-main",
        "user": "u0",
        "nats_url": bench.stack.nats_url,
        "namespace": bench.settings.namespace,
        "clients": clients,
        "top_k": top_k,
        "queries": queries,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "memstream.consumers.bench.recall",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate(json.dumps(spec).encode())
    if proc.returncode != 0:
        raise RuntimeError(f"the client process failed with code {proc.returncode}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    return {
        **stats(result["latencies"], result["server"], result["wall_s"]),
        "_latencies": result["latencies"],
        "_server": result["server"],
        "_parts": result["parts"],
    }


def stats(latencies: list[float], server: list[float], wall_s: float) -> dict[str, Any]:
    return {
        "wall_s": round(wall_s, 3),
        "p50": round(percentile(latencies, 50), 3),
        "p95": round(percentile(latencies, 95), 3),
        "p99": round(percentile(latencies, 99), 3),
        "qps": round(len(latencies) / wall_s, 1),
        "server_p50": round(percentile(server, 50), 3),
        "server_p95": round(percentile(server, 95), 3),
    }


def part_stats(parts: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """p50 / p95 of each part of the worker's time (``RecallReply.timings_ms``)."""
    names = sorted({k for p in parts for k in p} - {"total", "search"})
    return {
        k: {
            "p50": round(percentile(v, 50), 3),
            "p95": round(percentile(v, 95), 3),
        }
        for k in names
        if (v := [p[k] for p in parts if k in p])
    }


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The percentiles of all rounds' requests together."""
    lat = [x for r in rounds for x in r.pop("_latencies")]
    server = [x for r in rounds for x in r.pop("_server")]
    parts = [x for r in rounds for x in r.pop("_parts")]
    return {
        **stats(lat, server, sum(r["wall_s"] for r in rounds)),
        "server_parts": part_stats(parts),
    }


async def run(
    n: int,
    noise: int,
    queries: int,
    concurrency: int,
    top_k: int,
    rounds_n: int = 3,
    lock: bool = False,
    latency_us: int | None = None,
) -> dict[str, Any]:
    rng = random.Random(42)
    async with bench_stack() as bench:
        memory_locked = locked(lock or bench.settings.lock_memory)  # the worker is this process
        us = bench.settings.cpu_latency_us if latency_us is None else latency_us
        latency_hold = cpu_latency(us)  # held by this process for the whole run
        try:
            load_start = time.perf_counter()
            await load(bench, "bench-main", n, rng, "memories (queried tenant)")
            for t in range(noise):
                await load(bench, f"bench-noise-{t}", max(1, n // 10), rng, f"noise tenant {t}")
            load_s = time.perf_counter() - load_start
            # what an operator does after a bulk load (else autovacuum runs in the first round),
            # and what the worker's maintenance loop does after bulk writes: the engine's indexes
            print("  VACUUM ANALYZE, optimizing the vector index ...", file=sys.stderr, flush=True)
            opt_start = time.perf_counter()
            await bench.stack.pg.vacuum_analyze()
            await bench.worker.vectors.optimize()
            optimize_s = time.perf_counter() - opt_start
            # and the load's writes on disk before measuring: a round run during their
            # write-back is slower than the rest and would not measure recall
            checkpointed = await bench.stack.pg.checkpoint()
            await asyncio.to_thread(os.sync)
            layout = getattr(bench.worker.vectors, "layout", None)  # Qdrant Edge only
            index_layout = layout() if layout is not None else {}

            def query_set() -> list[str]:
                return [
                    f"what did the user do with the {a} {b}?"
                    for a, b in (rng.sample(WORDS, 2) for _ in range(queries))
                ]

            qs, qs_concurrent = query_set(), query_set()
            gauge = cpu_gauge()
            rounds = [
                await measure(bench, query_set() if r else qs, 1, top_k) for r in range(rounds_n)
            ]
            single = pooled(rounds)
            multi = await measure(bench, qs_concurrent, max(1, concurrency), top_k)
            multi.pop("_latencies"), multi.pop("_server"), multi.pop("_parts")
            async with bench.client("bench-main", user="u0") as probe:
                reply = await probe.recall(qs[0], top_k=top_k, cache=False)
        finally:
            if latency_hold is not None:
                latency_hold.close()
    return {
        "memories": n,
        "noise_tenants": noise,
        "top_k": top_k,
        "load_s": round(load_s, 1),
        "optimize_s": round(optimize_s, 1),
        "postgres_checkpoint": checkpointed,
        "memory_locked": memory_locked,
        "cpu_latency_us": latency_hold.us if latency_hold is not None else None,
        "index_layout": index_layout,
        "idf_scope": bench.settings.idf_scope,
        "latency_ms": single,
        "rounds": rounds,
        "cpu_gauge_s": gauge,
        "concurrent": {"clients": concurrency, **multi},
        "server_timings_ms": reply.timings_ms,
        "queries": len(qs),
    }


def _microseconds(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more µs, not {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memories", type=int, default=100_000)
    p.add_argument("--noise-tenants", type=int, default=2)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="single-client rounds of --queries each")
    p.add_argument(
        "--lock-memory",
        action="store_true",
        help="mlockall the worker (as MEMSTREAM_LOCK_MEMORY=true): no page faults on the index",
    )
    p.add_argument(
        "--cpu-latency-us",
        type=_microseconds,
        default=None,
        metavar="US",
        help="hold the CPUs' wake-up latency at US µs while measuring (as MEMSTREAM_CPU_LATENCY_US;"
        " 0: idle CPUs poll instead of halting; needs root)",
    )


def main(args: argparse.Namespace) -> int:
    r = asyncio.run(
        run(
            args.memories,
            args.noise_tenants,
            args.queries,
            args.concurrency,
            args.top_k,
            max(1, args.rounds),
            args.lock_memory,
            args.cpu_latency_us,
        )
    )
    single, multi = r["latency_ms"], r["concurrent"]
    print(
        f"\nrecall over NATS, {r['memories']:,} memories in the tenant "
        f"(+{r['noise_tenants']} noise tenants), top_k {r['top_k']}, loaded in {r['load_s']} s, "
        f"index optimized in {r['optimize_s']} s; CPU gauge {r['cpu_gauge_s']} s (10M-step loop)"
        f"{'; memory locked' if r['memory_locked'] else ''}"
        + (
            f"; CPU wake-up latency held at {r['cpu_latency_us']} µs"
            if r["cpu_latency_us"] is not None
            else ""
        )
    )
    if r["index_layout"]:
        lay = r["index_layout"]
        print(
            f"  index: {lay['segments']} segments, {lay['points']:,} points, "
            f"{lay['unindexed_points']:,} not yet indexed (scanned by every search)"
        )
    for i, s in enumerate(r["rounds"], 1):
        print(
            f"  round {i}  : p50 {s['p50']:.2f} ms  p95 {s['p95']:.2f} ms  p99 {s['p99']:.2f} ms"
            f"  (in the worker: p50 {s['server_p50']:.2f} ms, p95 {s['server_p95']:.2f} ms)"
        )
    if single.get("server_parts"):
        print(
            "  in the worker, 1 client (p50 / p95 ms): "
            + ", ".join(
                f"{k} {v['p50']:.2f} / {v['p95']:.2f}" for k, v in single["server_parts"].items()
            )
        )
    for label, s in (("1 client, all rounds", single), (f"{multi['clients']} clients", multi)):
        print(
            f"  {label}: p50 {s['p50']:.2f} ms  p95 {s['p95']:.2f} ms  p99 {s['p99']:.2f} ms  "
            f"{s['qps']:.0f} req/s  (in the worker: p50 {s['server_p50']:.2f} ms, "
            f"p95 {s['server_p95']:.2f} ms)"
        )
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":  # the client process of ``measure``: a JSON spec on stdin
    print(json.dumps(asyncio.run(client_run(json.loads(sys.stdin.read())))))

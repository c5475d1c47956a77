"""Latency of the vector index at recall scale (not collected by pytest): one big tenant of
100k memories plus noise tenants, 256-d dense vectors, ~10 sparse terms per memory, a record
per point. Measures search, search_sparse and fetch (p50/p95, at the caller) before and after
``optimize()``, with reads on the event loop and in a thread.

    python benchmarks/vector_index.py [--points 100000] [--path DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.ports import VectorFilter, VectorPoint
from memstream.storage.qdrant_edge import EdgeVectorIndex

DIM = 256
VOCAB = 30_000
NOW = 1_800_000_000.0


def unit(rng: random.Random) -> list[float]:
    v = [rng.gauss(0, 1) for _ in range(DIM)]
    norm = sum(x * x for x in v) ** 0.5
    return [x / norm for x in v]


def zipf_term(rng: random.Random) -> int:
    return min(int(rng.paretovariate(1.1)), VOCAB) * 2654435761 % 2**32  # hashed-like ids


def make_point(rng: random.Random, tenant: str, user: str) -> VectorPoint:
    terms = {zipf_term(rng): rng.uniform(0.3, 2.0) for _ in range(10)}
    return VectorPoint(
        id=str(uuid.uuid4()),
        vector=unit(rng),
        tenant=tenant,
        user=user,
        agent=rng.choice(["bot", "helper", None]),
        session=f"s{rng.randrange(500)}",
        type=rng.choice(list(MemoryType)),
        scope=Scope.USER,
        occurred_at=NOW - rng.uniform(0, 3e7),
        expires_at=rng.choice([None] * 9 + [NOW + 1e6]),
        sparse=terms,
        record={
            "text": " ".join(f"word{rng.randrange(5000)}" for _ in range(40)),
            "importance": rng.random(),
            "access_count": rng.randrange(50),
            "source": {"event_ids": [str(uuid.uuid4())], "session": "s1"},
        },
        tags=tuple(rng.sample(["work", "home", "health", "travel"], rng.randrange(3))),
    )


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def dense(idx: EdgeVectorIndex, qs: Iterator[list[float]], flt: VectorFilter, rec: bool) -> Any:
    return idx.search(next(qs), flt, 50, with_records=rec)


def keyword(
    idx: EdgeVectorIndex, qs: Iterator[dict[int, float]], flt: VectorFilter, rec: bool
) -> Any:
    return idx.search_sparse(next(qs), flt, 50, with_records=rec)


async def measure(idx: EdgeVectorIndex, rng: random.Random, ids: list[str], label: str) -> None:
    queries = [unit(rng) for _ in range(50)]
    sparse_q = [{zipf_term(rng): 1.0 for _ in range(rng.randrange(2, 7))} for _ in range(50)]
    filters = {
        "tenant": VectorFilter(tenant="big", now=NOW),
        "tenant+user(80k)": VectorFilter(tenant="big", user="u0", now=NOW),
        "tenant+user(1k)": VectorFilter(tenant="big", user="u7", now=NOW),
        "+tags+time": VectorFilter(
            tenant="big", user="u0", now=NOW, tags=("work",), occurred_from=NOW - 1.5e7
        ),
    }
    qs, sq = itertools.cycle(queries), itertools.cycle(sparse_q)
    for inline in (True, False):
        idx.direct_search_max = 1000 if inline else 0
        idx.direct_fetch_max = 1000 if inline else 0
        where = "loop" if inline else "thread"
        for name, flt in filters.items():
            for records in (False, True):
                d = await timed(300, partial(dense, idx, qs, flt, records))
                s = await timed(300, partial(keyword, idx, sq, flt, records))
                print(
                    f"{label:9} {where:6} {name:17} records={records!s:5} "
                    f"dense p50 {d[0]:.3f} p95 {d[1]:.3f} | sparse p50 {s[0]:.3f} p95 {s[1]:.3f} ms"
                )
        f = await timed(300, lambda: idx.fetch("big", rng.sample(ids, 20)))
        print(f"{label:9} {where:6} fetch 20 ids: p50 {f[0]:.3f} p95 {f[1]:.3f} ms")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--noise", type=int, default=20_000)
    ap.add_argument("--path", type=Path, default=None)
    args = ap.parse_args()
    path = args.path or Path(tempfile.mkdtemp()) / "shard"
    rng = random.Random(1)
    idx = EdgeVectorIndex(path, flush_every_s=3600)
    await idx.ensure(DIM)
    ids: list[str] = []
    t = time.perf_counter()
    batch: list[VectorPoint] = []
    total = args.points + args.noise
    for n in range(total):
        if n < args.points:
            user = "u0" if rng.random() < 0.8 else f"u{rng.randrange(1, 21)}"
            p = make_point(rng, "big", user)
            ids.append(p.id)
        else:
            p = make_point(rng, f"noise{rng.randrange(20)}", "u0")
        batch.append(p)
        if len(batch) == 1000:
            await idx.upsert(batch)
            batch = []
    if batch:
        await idx.upsert(batch)
    print(f"ingested {total} points in {time.perf_counter() - t:.1f}s ({path})")
    await measure(idx, rng, ids, "unoptim.")
    t = time.perf_counter()
    await idx.optimize()
    print(f"optimize: {time.perf_counter() - t:.1f}s, segments {idx.shard.info().segments_count}")
    await measure(idx, rng, ids, "optimized")
    await idx.close()


if __name__ == "__main__":
    asyncio.run(main())

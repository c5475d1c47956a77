"""What the Qdrant Edge engine's calls cost the rest of the worker process (not collected by
pytest). Each call runs where the adapter runs it (``asyncio.to_thread`` for batches, flushes
and ``optimize``), while a probe on the event loop wakes every millisecond: the longest gap
between two wake-ups is how long a recall arriving then would wait for the loop. The share of
a counting loop's progress in another thread tells whether the engine released the
interpreter lock meanwhile (100 %: released; 0 %: held throughout).

    python benchmarks/engine_gil.py [--points 20000] [--dim 256]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import qdrant_edge as qe

from memstream.pipeline.lexical import document_vector
from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.edge_layout import payload
from memstream.storage.ports import VectorFilter, VectorPoint
from memstream.storage.qdrant_edge import EdgeVectorIndex

WORDS = "deploy release friday schema audit dentist invoice garden train coffee".split()


def points(n: int, dim: int, rng: random.Random) -> list[VectorPoint]:
    out = []
    for i in range(n):
        v = [rng.gauss(0, 1) for _ in range(dim)]
        text = " ".join(rng.choice(WORDS) for _ in range(40))
        out.append(
            VectorPoint(
                id=str(uuid.uuid4()),
                vector=v,
                tenant=f"t{i % 4}",
                user=f"u{i % 64}",
                agent=None,
                session=f"s{i % 256}",
                type=MemoryType.EPISODE,
                scope=Scope.USER,
                project=None,
                occurred_at=time.time(),
                expires_at=None,
                sparse=document_vector(text, []),
                record={"id": "x", "text": text},
                pinned=False,
                tags=(),
            )
        )
    return out


def owner_queries(
    n: int, dim: int, owners: int, rng: random.Random
) -> list[tuple[list[float], VectorFilter]]:
    """``n`` random query vectors, each with the filter of one of ``owners`` users of the
    four tenants ``points`` writes (one clock reading for all, as dedupe takes it)."""
    now = time.time()
    return [
        (
            [rng.gauss(0, 1) for _ in range(dim)],
            VectorFilter(
                tenant=f"t{i % 4}",
                user=f"u{i % owners}",
                types=(MemoryType.EPISODE,),
                scopes=(Scope.USER,),
                now=now,
            ),
        )
        for i in range(n)
    ]


def shard_arguments(p: argparse.ArgumentParser, points: int, queries: int) -> None:
    """The options of a benchmark over ``loaded_shard``."""
    p.add_argument("--points", type=int, default=points)
    p.add_argument("--queries", type=int, default=queries)
    p.add_argument("--owners", type=int, default=64)
    p.add_argument("--dim", type=int, default=256)


async def loaded_shard(
    args: argparse.Namespace,
) -> tuple[EdgeVectorIndex, list[tuple[list[float], VectorFilter]]]:
    """A shard in a temp dir holding ``args.points`` points, and ``args.queries`` queries
    over ``args.owners`` owners (``shard_arguments``); the same seed every run."""
    rng = random.Random(1)
    index = EdgeVectorIndex(Path(tempfile.mkdtemp()) / "c", flush_every_s=1e9)
    await index.ensure(args.dim)
    stored = points(args.points, args.dim, rng)
    for lo in range(0, len(stored), 256):
        await index.upsert(stored[lo : lo + 256])
    return index, owner_queries(args.queries, args.dim, args.owners, rng)


def lock_share(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall ms, % of a counting loop's progress in this thread while ``fn`` ran in another,
    against the same loop alone for as long)."""
    worker = threading.Thread(target=fn)
    count = 0
    started = time.perf_counter()
    worker.start()
    while worker.is_alive():
        count += 1
    wall = time.perf_counter() - started
    alone, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < wall:
        alone += 1
    return wall * 1000, 100 * count / max(alone, 1)


async def loop_stall(work: Awaitable[object]) -> tuple[float, float]:
    """(wall ms of ``work``, longest gap in ms between wake-ups of a 1 ms probe meanwhile)."""
    longest, last, done = 0.0, time.perf_counter(), False

    async def probe() -> None:
        nonlocal longest, last
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now

    task = asyncio.create_task(probe())
    started = time.perf_counter()
    await work
    wall = time.perf_counter() - started
    done = True
    await task
    return wall * 1000, longest * 1000


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    index = EdgeVectorIndex(Path(tempfile.mkdtemp()) / "c", flush_every_s=1e9)
    await index.ensure(args.dim)
    shard = index.shard
    data = points(args.points, args.dim, rng)
    for lo in range(0, len(data) - 64, 256):
        await index.upsert(data[lo : lo + 256])
    batch = [qe.Point(p.id, index._vectors(p), payload(p)) for p in data[-64:]]
    flt = VectorFilter(tenant="t1", user="u1")
    req = index._dense_request(data[0].vector, flt, 10, True)
    print(f"{args.points:,} points of {args.dim} dims; engine call: wall, lock left to others")
    rows = [
        ("update, 64 points", lambda: shard.update(qe.UpdateOperation.upsert_points(batch))),
        ("query x100", lambda: [shard.query(req) for _ in range(100)]),
        ("flush", shard.flush),
    ]
    for name, fn in rows:
        wall, share = lock_share(fn)
        print(f"  {name:<20} {wall:9.1f} ms  {share:5.0f} %")
    await index.upsert(data[:64])  # something to flush again
    wall, stall = await loop_stall(index._in_thread("flush", shard.flush))
    print(f"  flush as the adapter runs it: {wall:.1f} ms, event loop stalled up to {stall:.1f} ms")
    wall, stall = await loop_stall(index.optimize())
    print(f"  optimize() of the adapter: {wall:.1f} ms, event loop stalled up to {stall:.1f} ms")
    await index.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=256)
    asyncio.run(main(p.parse_args()))

"""How long ``optimize`` holds a Qdrant Edge shard's process, as the shard grows (not collected
by pytest): ``--rounds`` rounds of ``--step`` points written (the writes start an optimize
each half segment), then ``optimize`` (the maintenance loop's); the longest pause of an event
loop ticking every millisecond meanwhile, then the dense search's latency
(records, one owner's filter) and ``search_many``'s, once the shard is optimized. Run once
per segment size (``segment_kb``, ``MEMSTREAM_INDEX_SEGMENT_KB``), ``0`` for the engine's
defaults, which merge every segment into one; ``--segments``: the engine's merge target
(``MEMSTREAM_INDEX_SEGMENTS``; 0, its default of one per CPU).

    python benchmarks/optimize_stall.py [--step 6000] [--rounds 8] [--segment-kb 8000 0]
        [--segments 8]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from engine_gil import owner_queries, points

from memstream.storage.qdrant_edge import EdgeVectorIndex


async def _ticks(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def one(args: argparse.Namespace, segment_kb: int | None) -> None:
    rng = random.Random(1)
    index = EdgeVectorIndex(
        Path(tempfile.mkdtemp()) / "c",
        flush_every_s=1e9,
        segment_kb=segment_kb,
        segments=args.segments or None,
    )
    await index.ensure(args.dim)
    stalls = []
    for _ in range(args.rounds):
        batch = points(args.step, args.dim, rng)
        stop, gaps = asyncio.Event(), [0.0]
        ticker = asyncio.create_task(_ticks(stop, gaps))
        for lo in range(0, len(batch), 64):
            await index.upsert(batch[lo : lo + 64])
        if index.optimizing is not None:
            await index.optimizing
        await index.optimize()  # the maintenance loop's, every 30 s
        stop.set()
        await ticker
        stalls.append(max(gaps))
    layout = index.layout()
    queries = owner_queries(args.queries, args.dim, 64, rng)
    latencies = []
    for _ in range(2):  # the first round warms the segments' pages
        latencies.clear()
        for vector, flt in queries:
            started = time.perf_counter()
            await index.search(vector, flt, 10, with_records=True)
            latencies.append(time.perf_counter() - started)
    q95 = statistics.quantiles(latencies, n=20)[-1]
    started = time.perf_counter()
    await index.search_many(queries, 3, 0.9)
    many = (time.perf_counter() - started) / len(queries)
    await index.close()
    label = "engine default" if segment_kb is None else f"segment_kb {segment_kb}"
    label += f", segments {args.segments}" if args.segments else ""
    print(f"{label}: {layout['segments']} segments, {layout['points']} points")
    print("  longest pause per round, s: " + " ".join(f"{s:.2f}" for s in stalls))
    print(
        f"  search p50 {statistics.median(latencies) * 1e3:.2f} / p95 {q95 * 1e3:.2f} ms; "
        f"search_many {many * 1e3:.3f} ms a query"
    )


async def main(args: argparse.Namespace) -> None:
    for kb in args.segment_kb:
        await one(args, kb or None)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step", type=int, default=6000)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--segment-kb", type=int, nargs="+", default=[8000, 0])
    p.add_argument("--segments", type=int, default=0)
    asyncio.run(main(p.parse_args()))

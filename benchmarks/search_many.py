"""What dedupe's batch of neighbour searches costs on a Qdrant Edge shard (not collected by
pytest): ``search_many`` of a batch of queries over a few owners, limit 3, with records, as
the dedupe stage asks it, with and without a score threshold (``min_score``).

    python benchmarks/search_many.py [--points 10000] [--queries 192] [--owners 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from engine_gil import loaded_shard, shard_arguments


async def main(args: argparse.Namespace) -> None:
    index, queries = await loaded_shard(args)
    for label, min_score in (("records", None), ("min_score 0.9", 0.9)) * 2:
        started = time.perf_counter()
        for _ in range(args.rounds):
            await index.search_many(queries, 3, min_score)
        per_query = (time.perf_counter() - started) / args.rounds / len(queries)
        print(f"{label:<14} {per_query * 1e3:.3f} ms a query")
    await index.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shard_arguments(p, points=10_000, queries=192)
    p.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(p.parse_args()))

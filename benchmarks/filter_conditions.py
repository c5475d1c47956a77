"""What each condition of a filtered dense search costs on Qdrant Edge's unindexed segment
(not collected by pytest): the owner's key alone, then with the type, and the whole filter
dedupe's near-duplicate search sends (owner, type, scope), over points of ``--owners``
users in four tenants, limit 3, with or without a score threshold.

    python benchmarks/filter_conditions.py [--points 30000] [--owners 64] [--min-score 0.9]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import qdrant_edge as qe
from engine_gil import loaded_shard, shard_arguments

from memstream.storage.edge_layout import edge_filter, match_value, owner_key
from memstream.storage.ports import VectorFilter
from memstream.storage.qdrant_edge import EdgeVectorIndex


def variants(index: EdgeVectorIndex, flt: VectorFilter) -> dict[str, qe.Filter]:
    own = match_value("o_x", owner_key(flt.tenant, flt.user, flt.agent))
    kind = qe.FieldCondition("type", match=qe.MatchAny([t.value for t in flt.types]))
    return {
        "owner key": qe.Filter(must=[own]),
        "owner key, type": qe.Filter(must=[own, kind]),
        "owner, type, scope": edge_filter(flt, index.may_expire(flt.tenant, flt.now)),
    }


async def main(args: argparse.Namespace) -> None:
    index, queries = await loaded_shard(args)
    names = list(variants(index, queries[0][1]))
    for name in names * 2:  # twice: the second round is the one to read
        requests = [
            qe.QueryRequest(
                limit=3,
                score_threshold=args.min_score,
                query=qe.Query.Nearest(list(v), using=index.vector_name),
                filter=variants(index, flt)[name],
                with_payload=False,
            )
            for v, flt in queries
        ]
        started = time.perf_counter()
        for lo in range(0, len(requests), 32):
            index.shard.query_batch(qe.QueryBatchRequest(requests[lo : lo + 32]))
        per_query = (time.perf_counter() - started) / len(requests)
        print(f"{name:<20} {per_query * 1e3:.3f} ms a query")
    await index.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shard_arguments(p, points=30_000, queries=384)
    p.add_argument("--min-score", type=float, default=None)
    asyncio.run(main(p.parse_args()))

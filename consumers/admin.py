"""``memstream streams apply`` and ``memstream reindex``: the fixes ``memstream doctor`` names.

``streams apply`` creates or updates every stream and stage consumer as
``consumers/topology.py`` defines them (what a worker does at start-up), without starting a
worker. ``reindex`` rebuilds the vector index from Postgres, the record of truth: it marks
every live memory as not indexed, and the workers' reconciler writes each point again from
its row within ``MEMSTREAM_SWEEP_EVERY_S``. ``reindex --now`` does the indexing in this
process instead (with Qdrant Edge, only while no worker holds the shard).
"""

from __future__ import annotations

import argparse
import asyncio

import nats

from memstream.consumers import indexing, topology
from memstream.consumers.natsconn import nats_options
from memstream.schemas.settings import Settings
from memstream.storage import pgcheck

BATCH = 256


async def apply_streams(settings: Settings, nats_url: str) -> int:
    nc = await nats.connect(nats_url, **nats_options(settings))
    try:
        topo = await topology.apply(nc.jetstream(), settings)
    finally:
        await nc.close()
    print(f"applied {len(topo.streams)} streams and {len(topo.consumers)} stage consumers")
    return 0


async def reindex(settings: Settings, database_url: str, now: bool, schema: str = "public") -> int:
    marked = await pgcheck.mark_all_unindexed(database_url, schema)
    print(f"{marked} live memories marked for indexing")
    if not now:
        print(
            "running workers index them within MEMSTREAM_SWEEP_EVERY_S "
            f"({settings.sweep_every_s:g} s); `memstream doctor` shows the progress"
        )
        return 0
    from memstream.consumers.stack import make_vector_index
    from memstream.storage.embedding import make_embedder
    from memstream.storage.postgres import PgStore

    embedder = make_embedder(settings.embedding_model, settings.embedding_path)
    pg = await PgStore.connect(database_url, schema=schema)
    vectors = make_vector_index(settings, embedder.dim)
    try:
        await vectors.ensure(embedder.dim)
        done = 0
        # what was marked, not what running workers store meanwhile (theirs to index)
        began = pg.clock()
        while pending := await pg.unindexed(BATCH, written_by=began):
            await indexing.index(pg, vectors, embedder, pending)
            done += len(pending)
        print(f"indexed {done} memories")
    finally:
        await vectors.close()
        await pg.close()
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    streams = sub.add_parser("streams", help="JetStream streams and stage consumers")
    streams.add_argument("action", choices=["apply"])

    def run_streams(a: argparse.Namespace) -> int:
        from memstream.producers.client import discover_nats_url

        settings = Settings()
        url = settings.nats_url or discover_nats_url(settings.state_dir)
        return asyncio.run(apply_streams(settings, url))

    streams.set_defaults(func=run_streams)

    p = sub.add_parser("reindex", help="rebuild the vector index from Postgres")
    p.add_argument(
        "--now",
        action="store_true",
        help="index in this process instead of leaving it to the workers' reconciler "
        "(Qdrant Edge: only with the workers stopped)",
    )

    def run_reindex(a: argparse.Namespace) -> int:
        from memstream.schemas.stack import read_stack

        settings = Settings()
        dsn = (
            settings.database_url.get_secret_value()
            if settings.database_url
            else read_stack(settings.state_dir).get("database_url")
        )
        if not dsn:
            print("memstream: set MEMSTREAM_DATABASE_URL (no running `memstream dev` found)")
            return 2
        return asyncio.run(reindex(settings, dsn, a.now))

    p.set_defaults(func=run_reindex)

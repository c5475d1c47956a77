"""Helpers for integration tests that start a worker of their own, or that need Postgres to
refuse one value as it refuses bad data (a SQLSTATE of class 22)."""

from __future__ import annotations

from memstream.consumers.app import Worker
from memstream.consumers.run import make_vector_index
from memstream.consumers.services import Services
from memstream.pipeline.redact import Redactor
from memstream.schemas.settings import Settings
from memstream.storage.ports import Embedder
from memstream.storage.postgres import PgStore

REFUSED = "quux-refuse"  # a memory whose content holds this is refused by ``refuse_inserts``


async def start_worker(settings: Settings, pg: PgStore, embedder: Embedder) -> Worker:
    """A started worker over ``pg`` and a fresh vector index from ``settings``."""
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    worker = Worker(
        Services(settings, pg, vectors, embedder, Redactor(key=b"k")), settings.nats_url or ""
    )
    await worker.start()
    return worker


async def refuse_inserts(pg: PgStore) -> None:
    """A trigger in the test's schema that raises SQLSTATE 22023 for a memory containing
    ``REFUSED`` (test setup through the pool: no API would add one)."""
    async with pg._pool.acquire() as con:
        await con.execute(
            "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
            "RAISE EXCEPTION 'refused' USING ERRCODE = '22023'; END; $$ LANGUAGE plpgsql; "
            "CREATE TRIGGER refuse BEFORE INSERT ON memories FOR EACH ROW "
            f"WHEN (NEW.content LIKE '%{REFUSED}%') EXECUTE FUNCTION refuse()"
        )

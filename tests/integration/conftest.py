"""A running worker (every stage + recall responder) on real NATS, Postgres and Qdrant Edge."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from workers import Running, _delete_streams

from memstream.consumers.app import Worker
from memstream.consumers.helper import Helper
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.pipeline.redact import Redactor
from memstream.schemas.settings import Settings, StageSettings
from memstream.storage.embedding import make_embedder
from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def embedder():
    return make_embedder(None, None)


@pytest.fixture
def stage_batched() -> bool:
    """Whether the worker's stages take their pull batch as one unit, as by default (a module
    overrides it to run the single-message path)."""
    return True


@pytest.fixture
def stage_fused() -> bool:
    """Whether a worker running every stage hands candidates through redact, dedupe and store
    in memory, as by default (a module overrides it to run the stages over their subjects)."""
    return True


@pytest.fixture
def stage_helper() -> bool:
    """Whether the worker extracts and redacts its fused batches in a helper process (as
    `memstream worker` does on two or more CPUs; a module overrides it)."""
    return False


@pytest.fixture
async def running(
    nats_url: str,
    pg: PgStore,
    namespace: str,
    tmp_path: Path,
    embedder,
    stage_batched: bool,
    stage_fused: bool,
    stage_helper: bool,
) -> AsyncIterator[Running]:
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path,
        stage=StageSettings(
            max_deliver=3,
            retry_delays_s=[0.2, 0.5],
            ack_wait_s=10,
            batched=stage_batched,
            fused=stage_fused,
        ),
    )
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    helper = Helper(settings, b"test-key") if stage_helper else None
    services = Services(settings, pg, vectors, embedder, Redactor(key=b"test-key"), helper)
    worker = Worker(services, nats_url)
    await worker.start()
    yield Running(settings, worker, pg, nats_url)
    await worker.stop()
    await vectors.close()
    await _delete_streams(nats_url, settings)

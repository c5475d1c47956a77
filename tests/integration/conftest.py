"""A running worker (every stage + recall responder) on real NATS, Postgres and Qdrant Edge."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memstream.consumers.app import Worker
from memstream.consumers.embedded import free_port
from memstream.consumers.helper import Helper
from memstream.consumers.run import make_vector_index
from memstream.consumers.services import Services
from memstream.consumers.topology import drained
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient
from memstream.schemas.settings import Settings, StageSettings
from memstream.storage.embedding import make_embedder
from memstream.storage.postgres import PgStore
from memstream.storage.qdrant_server import ServerVectorIndex

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def embedder():
    return make_embedder(None, None)


@dataclass
class Running:
    settings: Settings
    worker: Worker
    pg: PgStore
    nats_url: str

    def client(self, tenant: str, **kw: Any) -> MemoryClient:
        return MemoryClient(tenant, nats_url=self.nats_url, namespace=self.settings.namespace, **kw)

    async def wait_for(
        self,
        predicate: Callable[[], Awaitable[bool]],
        seconds: float = 30.0,
        what: str = "condition",
    ) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await predicate():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")

    async def drained(self) -> bool:
        """True once every stage consumer has nothing pending or unacked."""
        return await drained(self.worker.deps.js, self.settings)

    @contextlib.asynccontextmanager
    async def index_away(self) -> AsyncIterator[None]:
        """Inside: the worker's vector index is a Qdrant server that is not there, so every
        index call fails as in an outage."""
        w = self.worker
        live = w.services.vectors
        down = ServerVectorIndex(
            url=f"http://127.0.0.1:{free_port()}",
            timeout=1,
            check_compatibility=False,
            dim=w.embedder.dim,
        )
        w.services.vectors = down  # Worker, Deps, recall and commands all read it
        try:
            yield
        finally:
            w.services.vectors = live
            await down.close()


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


async def _delete_streams(nats_url: str, settings: Settings) -> None:
    """Leave a shared server as it was: drop this test's streams."""
    import nats

    from memstream.schemas.subjects import Subjects

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for kind in ("turns", "stages", "events", "dlq"):
        with contextlib.suppress(Exception):  # already gone is fine
            await js.delete_stream(Subjects(settings.namespace).stream(kind))
    await nc.close()

"""A running worker (every stage + recall responder) on real NATS, Postgres and Qdrant Edge;
the operator-mode bus of the bus tenancy tests; the console served over HTTP and the browser
(Playwright driving Debian's Chromium) of the console tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from consoles import SHOTS, TOKEN
from natsservers import Bus, operator_mode_server
from playwright.async_api import Browser, BrowserContext, async_playwright
from workers import Running, _delete_streams

from memstream.console import ConsoleBackend, serve, standalone
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


# --- the bus tenancy tests: one operator-mode nats-server per module ---------------------------


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    with operator_mode_server(tmp_path_factory.mktemp("bus")) as server:
        yield server


# --- the console tests ------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():  # .ci/run installs it; a developer's machine may not have it
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (as .ci/run does)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    return CHROMIUM


@pytest.fixture(scope="session")
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield b
        await b.close()


@pytest.fixture
async def console(running: Any) -> AsyncIterator[str]:
    """The console app served over HTTP on a free loopback port, as a NATS client of the
    worker (dead letters redacted by the worker, as in the gateway); yields its URL."""
    backend = await ConsoleBackend.connect(running.settings, running.nats_url)
    server = await serve(standalone(backend, TOKEN), "127.0.0.1", 0)
    yield server.url
    await server.stop()
    await backend.close()


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
    ctx.set_default_timeout(15_000)
    yield ctx
    await ctx.close()

"""The optional LLM extractor end to end: a worker with MEMSTREAM_EXTRACTOR=rules+llm against a
fake OpenAI-compatible endpoint (a real HTTP server on loopback; the model is the fake)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from memstream.consumers.app import Worker
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.consumers.topology import drained
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient
from memstream.schemas.memory import MemoryType
from memstream.schemas.settings import LlmSettings, Settings, StageSettings
from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration

API_KEY = "sk-test-llm-0123456789abcdef"


@dataclass
class FakeModel:
    """What the endpoint answers (``mode``) and every request body it received."""

    mode: str = "ok"
    answer: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def fake_model() -> Iterator[FakeModel]:
    model = FakeModel()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            model.requests.append(body)
            model.auth.append(self.headers.get("Authorization", ""))
            if self.path != "/v1/chat/completions" or model.mode == "500":
                self.send_response(500 if model.mode == "500" else 404)
                self.end_headers()
                return
            if model.mode == "garbage":
                data = b"<html>not json</html>"
            else:
                content = json.dumps(model.answer)
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": content}}]}
                ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    model.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield model
    server.shutdown()
    server.server_close()


@pytest.fixture
async def llm_worker(
    nats_url: str, pg: PgStore, namespace: str, tmp_path: Path, embedder: Any, fake_model: Any
) -> AsyncIterator[Worker]:
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path,
        stage=StageSettings(max_deliver=3, retry_delays_s=[0.2, 0.5], ack_wait_s=10),
        extractor="rules+llm",
        llm=LlmSettings(
            base_url=fake_model.url,
            model="fake-1",
            api_key=SecretStr(API_KEY),
            timeout_s=2.0,
            failures_to_pause=2,
            cooldown_s=60,
        ),
    )
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    worker = Worker(Services(settings, pg, vectors, embedder, Redactor(key=b"test-key")), nats_url)
    await worker.start()
    yield worker
    await worker.stop()
    await vectors.close()


async def _ingest(worker: Worker, nats_url: str, text: str, event_id: str) -> None:
    async with MemoryClient(
        "acme", user="ann", nats_url=nats_url, namespace=worker.settings.namespace
    ) as mem:
        await mem.publish_turn([("user", text)], session="s1", event_id=event_id)
    for _ in range(400):
        if await drained(worker.deps.js, worker.settings):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the turn was not processed within 20 s")


async def test_llm_memories_complement_the_rules_and_see_only_redacted_text(
    llm_worker: Worker, nats_url: str, fake_model: FakeModel, pg: PgStore
) -> None:
    """The endpoint gets the redacted turn with the key as a bearer token; what it finds is
    stored beside the episode and the rules' memories, redacted again, and the key never
    reaches the stored memories."""
    fake_model.answer = {
        "memories": [
            {"type": "fact", "content": "Works at the Lisbon office.", "salience": 0.9},
            {"type": "todo", "content": "Mail [EMAIL:00000000] the report.", "salience": 0.7},
        ]
    }
    await _ingest(
        llm_worker,
        nats_url,
        "I prefer aisle seats. I work at the Lisbon office, write me at ann@example.com.",
        "e-llm-1",
    )
    sent = fake_model.requests[0]["messages"][1]["content"]
    assert "ann@example.com" not in sent and "[EMAIL:" in sent
    assert fake_model.auth == [f"Bearer {API_KEY}"]
    rows = await pg.list_memories(_owner(), limit=50, offset=0)
    kinds = {(m.type, m.content) for m in rows}
    assert (MemoryType.FACT, "Works at the Lisbon office.") in kinds
    assert any(m.type is MemoryType.PREFERENCE for m in rows)  # the rules still run
    assert any(m.type is MemoryType.EPISODE for m in rows)
    llm_made = [m for m in rows if m.metadata.get("extractor") == "llm"]
    assert len(llm_made) == 2
    assert all(API_KEY not in m.content for m in rows)
    assert llm_worker.deps.llm is not None and llm_worker.deps.llm.found == 2


async def test_an_endpoint_failure_leaves_the_rules_and_pauses_the_endpoint(
    llm_worker: Worker, nats_url: str, fake_model: FakeModel, pg: PgStore
) -> None:
    """HTTP 500 and an answer that is not JSON: the turns are stored with the rules' memories,
    nothing is dead-lettered; after two failures in a row the endpoint is left alone."""
    fake_model.mode = "500"
    await _ingest(llm_worker, nats_url, "I prefer green tea in the morning.", "e-llm-2")
    fake_model.mode = "garbage"
    await _ingest(llm_worker, nats_url, "I prefer dark mode in every editor.", "e-llm-3")
    await _ingest(llm_worker, nats_url, "I prefer trains over planes for short trips.", "e-llm-4")
    assert len(fake_model.requests) == 2  # the third turn found the endpoint paused
    rows = await pg.list_memories(_owner(), limit=50, offset=0)
    prefs = [m for m in rows if m.type is MemoryType.PREFERENCE]
    assert len(prefs) == 3 and not [m for m in rows if m.metadata.get("extractor") == "llm"]
    assert llm_worker.deps.llm is not None and llm_worker.deps.llm.failures == 2
    assert llm_worker.deps.metrics["extract"].dead_lettered == 0


def _owner() -> Any:
    from memstream.storage.postgres import OwnerFilter

    return OwnerFilter(tenant="acme", user="ann")

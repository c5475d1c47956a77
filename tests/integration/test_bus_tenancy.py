"""Tenancy on the bus, against a real nats-server (from the wheel) running the operator-mode
configuration that `memstream creds init` writes: a tenant's credential publishes only its
own turns, asks recall and commands, hears replies only on its own inbox, and reads no
stream, stage, dead letter, event, KV bucket or JetStream API; the worker, with its own
credential, still runs the pipeline end to end."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout

from memstream.consumers import creds
from memstream.consumers.app import Worker
from memstream.consumers.embedded import free_port, nats_server_binary, wait_for_port
from memstream.consumers.run import make_vector_index
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient, RecallError
from memstream.producers.connection import NatsAuth, creds_inbox_prefix
from memstream.schemas.errors import ErrorCode
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import Subjects, token
from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration

NS = "bus"  # the server is this module's own: one namespace serves every test


@dataclass
class Bus:
    url: str
    authority: Path
    server_log: Path

    def tenant(self, tenant: str, user: str | None = None) -> Path:
        out = self.authority / "issued" / f"{uuid.uuid4().hex}.creds"
        return creds.tenant(self.authority, NS, tenant, out, user=user)[0]


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    """A nats-server with JetStream in operator mode: `creds init`'s auth.conf included."""
    base = tmp_path_factory.mktemp("bus")
    authority = base / "authority"
    creds.init(authority, NS)
    port = free_port()
    conf = base / "nats.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{ store_dir: "{base / "js"}" }}\n'
        f'include "authority/{creds.AUTH_CONF}"\n'  # relative: nats-server joins it to the dir
    )
    log = base / "nats-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port(port, 15, proc)
        yield Bus(f"nats://127.0.0.1:{port}", authority, log)
    finally:
        proc.terminate()
        proc.wait(10)


class Violations:
    """The permission errors the server sent one connection."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.changed = asyncio.Event()

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))
        self.changed.set()

    async def wait_for(self, kind: str, subject: str, within_s: float = 5.0) -> None:
        """Until the server refused ``kind`` (publish/subscription) on ``subject``."""
        needle = f'permissions violation for {kind} to "{subject}"'.lower()

        async def until() -> None:
            while not any(needle in s.lower() for s in self.seen):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), within_s)


async def connect(bus: Bus, creds_file: Path, **kw: Any) -> tuple[Any, Violations]:
    errors = Violations()
    opts = NatsAuth(creds=creds_file).connect_options()
    nc = await nats.connect(bus.url, error_cb=errors.record, allow_reconnect=False, **opts, **kw)
    return nc, errors


@pytest.fixture
async def worker(bus: Bus, pg: PgStore, tmp_path: Path, embedder: Any) -> AsyncIterator[Worker]:
    settings = Settings(
        nats_url=bus.url,
        nats_creds=bus.authority / creds.WORKER_CREDS,
        namespace=NS,
        state_dir=tmp_path,
        stage=StageSettings(max_deliver=3, retry_delays_s=[0.2, 0.5], ack_wait_s=10),
    )
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    w = Worker(settings, bus.url, pg, vectors, embedder, Redactor(key=b"test-key-0123456789"))
    await w.start()
    yield w
    await w.stop()
    await vectors.close()


async def test_worker_and_tenant_credentials_run_the_pipeline_end_to_end(
    bus: Bus, worker: Worker, pg: PgStore
) -> None:
    """With its credential the worker stores a tenant's turn; the tenant's SDK client, with
    its own credential (replies on its inbox prefix) and an API key, recalls it."""
    tenant = f"acme-{uuid.uuid4().hex[:6]}"
    key = await pg.create_api_key(tenant, "agent")
    a_creds = bus.tenant(tenant)
    assert creds_inbox_prefix(a_creds) == f"_INBOX.{token(tenant)}"
    async with MemoryClient(
        tenant, user="alice", nats_url=bus.url, namespace=NS, nats_creds=a_creds, api_key=key
    ) as mem:
        published = await mem.publish_turn([("user", "I prefer green tea in the morning")])
        assert published is not None and published.stream == Subjects(NS).stream("turns")

        async def found() -> bool:
            reply = await mem.recall("what tea do I like?", cache=False)
            return any("green tea" in h.text for h in reply.hits)

        for _ in range(300):  # up to 30 s, polling the real pipeline
            if await found():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the turn was never recalled")
        remembered = await mem.remember("the build runs make and pytest")
        assert "pytest" in remembered.content
        # erasure purges the owner's raw turns through the JetStream API: the worker may
        erased = await mem.forget_owner()
        assert erased["turns"] == 1 and erased["memories"] >= 2, erased


async def test_bus_auth_makes_api_keys_mandatory(bus: Bus, worker: Worker, pg: PgStore) -> None:
    """On an authenticated bus, recall without a key, or with another tenant's key, is
    refused: the body's tenant name alone proves nothing."""
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    a_key = await pg.create_api_key(a, "agent")
    async with MemoryClient(
        a, user="u", nats_url=bus.url, namespace=NS, nats_creds=bus.tenant(a)
    ) as m:
        with pytest.raises(RecallError) as no_key:
            await m.recall("anything")
        assert no_key.value.code is ErrorCode.UNAUTHORIZED
    # tenant A's credential and key, claiming to be tenant B in the request body
    async with MemoryClient(
        b, user="u", nats_url=bus.url, namespace=NS, nats_creds=bus.tenant(a), api_key=a_key
    ) as m:
        with pytest.raises(RecallError) as forged:
            await m.recall("anything")
        assert forged.value.code is ErrorCode.UNAUTHORIZED


@pytest.mark.parametrize(
    "subject",
    [
        "{ns}.turns.>",  # every tenant's raw turns
        "{ns}.turns.{b}.>",  # B's raw turns
        "{ns}.stage.>",
        "{ns}.dlq.>",
        "{ns}.events.>",
        "{ns}.events.{b}",
        "{ns}.recall",  # other tenants' recall requests, API keys included
        "{ns}.cmd.*",
        "$KV.>",
        "$JS.API.>",
        "_INBOX.>",  # every tenant's replies
        "_INBOX.{b}.>",  # B's replies
        ">",
    ],
)
async def test_tenant_credential_cannot_subscribe_outside_its_inbox(bus: Bus, subject: str) -> None:
    """Each subscription of A outside its own inbox is refused by the server, and a turn B
    publishes meanwhile never reaches it."""
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    subject = subject.format(ns=NS, b=token(b))
    nc, errors = await connect(bus, bus.tenant(a))
    got: list[Any] = []

    async def keep(msg: Any) -> None:
        got.append(msg)

    sub = await nc.subscribe(subject, cb=keep)
    await errors.wait_for("subscription", subject)
    async with MemoryClient(
        b, user="u", nats_url=bus.url, namespace=NS, nats_creds=bus.tenant(b)
    ) as mb:
        await mb.publish_turn([("user", "B's private turn")])
    await nc.flush()
    assert got == []
    await sub.unsubscribe()
    await nc.close()


async def test_tenant_credential_cannot_publish_for_another_tenant_or_to_internals(
    bus: Bus,
) -> None:
    """A publish to B's turns, a stage, the DLQ, events or the KV bucket is refused (no PubAck,
    a violation), and so is every JetStream API request (no stream read, no consumer)."""
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    s = Subjects(NS)
    nc, errors = await connect(bus, bus.tenant(a))
    js = nc.jetstream(timeout=1.0)  # a refused request is never answered: wait 1 s, not 5
    for subject in (
        s.turns(b, "u", "s"),
        s.stage("store", a),  # even its own tenant: a candidate "already redacted"
        s.dlq("extract"),
        s.events(a),
        f"$KV.{s.stream('recall_cache')}.q.x",
    ):
        with pytest.raises((NatsTimeout, TimeoutError)):
            await js.publish(subject, b"{}", timeout=1.0)
        await errors.wait_for("publish", subject)
    with pytest.raises((NatsTimeout, TimeoutError)):
        await js.stream_info(s.stream("turns"))
    await errors.wait_for("publish", f"$JS.API.STREAM.INFO.{s.stream('turns')}")
    with pytest.raises((NatsTimeout, TimeoutError)):
        await js.pull_subscribe(s.turns_filter(b), durable="steal", stream=s.stream("turns"))
    await nc.close()


async def test_owner_credential_publishes_only_its_owner_turns(bus: Bus, worker: Worker) -> None:
    """A credential issued for (tenant, user alice) stores alice's turns, not bob's."""
    a = f"a-{uuid.uuid4().hex[:6]}"
    alice = bus.tenant(a, user="alice")
    assert creds_inbox_prefix(alice) == f"_INBOX.{token(a)}.alice"
    async with MemoryClient(
        a, user="alice", nats_url=bus.url, namespace=NS, nats_creds=alice, publish_timeout=1.0
    ) as m:
        assert await m.publish_turn([("user", "alice's turn")]) is not None
        with pytest.raises(Exception, match="not stored"):
            await m.publish_turn([("user", "pretending to be bob")], user="bob")


async def test_unknown_or_forged_credentials_are_refused(bus: Bus, tmp_path: Path) -> None:
    """A credential signed by another authority (same layout, other keys) cannot connect."""
    other = tmp_path / "other"
    creds.init(other, NS)
    forged = creds.tenant(other, NS, "a", tmp_path / "forged.creds")[0]
    with pytest.raises(nats.errors.Error):
        await nats.connect(
            bus.url,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            **NatsAuth(creds=forged).connect_options(),
        )

"""Tenancy on the bus, against a real nats-server (from the wheel) running the operator-mode
configuration that `memstream creds init` writes: a tenant's credential publishes only its
own turns, asks recall and commands, hears replies only on its own inbox, and reads no
stream, stage, dead letter, event, KV bucket or JetStream API; the worker, with its own
credential, still runs the pipeline end to end."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout
from natsservers import NS, Bus, operator_mode_server

from memstream.consumers import creds
from memstream.consumers.app import Worker
from memstream.consumers.redaction_key import make_redactor
from memstream.consumers.run import make_worker
from memstream.consumers.services import Services
from memstream.consumers.stack import Stack, make_vector_index
from memstream.consumers.topology import apply
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient, RecallError
from memstream.producers.connection import NatsAuth, creds_inbox_prefix
from memstream.schemas.errors import ErrorCode
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import Subjects, token
from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    with operator_mode_server(tmp_path_factory.mktemp("bus")) as server:
        yield server


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


async def with_streams(bus: Bus) -> None:
    """The namespace's streams, as a worker makes them (idempotent): a test that publishes
    turns needs them whichever tests ran before it."""
    nc, _ = await connect(bus, bus.authority / creds.WORKER_CREDS)
    try:
        await apply(nc.jetstream(), Settings(nats_url=bus.url, namespace=NS))
    finally:
        await nc.close()


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
    w = Worker(
        Services(settings, pg, vectors, embedder, Redactor(key=b"test-key-0123456789")), bus.url
    )
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
    assert creds_inbox_prefix(a_creds) == f"_INBOX.t.{token(tenant)}"
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
        "_INBOX.t.{b}.>",  # B's replies
        "_INBOX.s.>",  # the gateway's replies (every tenant's)
        ">",
    ],
)
async def test_tenant_credential_cannot_subscribe_outside_its_inbox(bus: Bus, subject: str) -> None:
    """Each subscription of A outside its own inbox is refused by the server, and a turn B
    publishes meanwhile never reaches it."""
    await with_streams(bus)  # B's publish is acked: the server has routed it when it returns
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
    assert creds_inbox_prefix(alice) == f"_INBOX.t.{token(a)}.alice"
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


async def test_console_requests_need_the_worker_credential(bus: Bus, worker: Worker) -> None:
    """With the worker's credential the console hears the workers' stats and has text
    redacted by them; a tenant's credential may not send the console's requests."""
    from memstream.console import ConsoleBackend
    from memstream.consumers.natsconn import nats_options

    backend = await ConsoleBackend.connect(
        worker.settings, bus.url, connect_options=nats_options(worker.settings)
    )
    try:
        stats = await backend.worker_stats()
        assert len(stats) == 1 and stats[0]["health"]["postgres"]["ok"]
        ((text, counts),) = await backend.redact([("acme", "mail bob@example.com")])
        assert counts == {"EMAIL": 1} and "bob@example.com" not in text
    finally:
        await backend.close()
    nc, errors = await connect(bus, bus.tenant("acme"))
    try:
        for what in ("stats", "redact"):
            await nc.publish(f"{NS}.ops.{what}", b"{}")
            await errors.wait_for("publish", f"{NS}.ops.{what}")
    finally:
        await nc.close()


async def test_the_worker_answers_only_on_inboxes(bus: Bus, worker: Worker) -> None:
    """A request whose reply subject is another tenant's turns or a stage gets no answer
    there: the reply subject is the requester's choice, and the worker may publish into its
    streams, so it would write where the tenant itself may not."""
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    s = Subjects(NS)
    js = worker.deps.js
    streams = [s.stream(k) for k in ("turns", "stages", "dlq")]

    async def last_seqs() -> list[int]:
        return [(await js.stream_info(name)).state.last_seq for name in streams]

    before = await last_seqs()
    nc, _ = await connect(bus, bus.tenant(a))
    body = f'{{"tenant": "{a}", "user": "u", "query": "tea"}}'.encode()
    command = f'{{"tenant": "{a}", "user": "u"}}'.encode()
    for reply in (s.turns(b, "u", "s"), s.stage("store", b), s.dlq("store")):
        await nc.publish(s.recall, body, reply=reply)
        await nc.publish(s.cmd("list"), command, reply=reply)
    # answered in order after the refused ones: by then those were handled
    assert b"unauthorized" in (await nc.request(s.recall, body, timeout=5)).data
    assert b"unauthorized" in (await nc.request(s.cmd("list"), command, timeout=5)).data
    assert await last_seqs() == before
    await nc.close()


async def test_a_revoked_credential_is_cut_off_after_a_reload(bus: Bus) -> None:
    """`creds revoke` + a server reload closes the revoked user's connection and refuses it
    from then on; another credential of the same tenant goes on working."""
    a = f"a-{uuid.uuid4().hex[:6]}"
    leaked, kept = bus.tenant(a), bus.tenant(a)
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await nats.connect(
        bus.url,
        allow_reconnect=False,
        closed_cb=on_closed,
        **NatsAuth(creds=leaked).connect_options(),
    )
    creds.revoke(bus.authority, NS, leaked)
    bus.reload()
    await asyncio.wait_for(closed.wait(), 10)
    assert nc.is_closed
    with pytest.raises(nats.errors.Error):
        await nats.connect(
            bus.url,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            **NatsAuth(creds=leaked).connect_options(),
        )
    still, errors = await connect(bus, kept)
    await still.publish(Subjects(NS).turns(a, "u", "s"), b"{}")
    await still.flush()
    assert still.is_connected and errors.seen == []
    await still.close()


async def test_a_service_credential_serves_every_tenant_but_reads_nothing(
    bus: Bus, worker: Worker, pg: PgStore
) -> None:
    """The gateway's credential publishes any tenant's turns and asks recall (replies on
    `_INBOX.s.<name>`), and is refused every stream, stage, KV and API subject."""
    gateway = creds.service(bus.authority, NS, "gateway", bus.authority / "gw.creds", True)[0]
    assert creds_inbox_prefix(gateway) == "_INBOX.s.gateway"
    for tenant in (f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"):
        key = await pg.create_api_key(tenant, "gateway")
        async with MemoryClient(
            tenant, user="u", nats_url=bus.url, namespace=NS, nats_creds=gateway, api_key=key
        ) as m:
            assert await m.publish_turn([("user", "hello")]) is not None
            assert (await m.recall("hello")).hits is not None
    nc, errors = await connect(bus, gateway)
    for subject in (f"{NS}.turns.>", f"{NS}.stage.>", "$KV.>", "_INBOX.t.>"):
        await nc.subscribe(subject)
        await errors.wait_for("subscription", subject)
    await nc.publish(f"$JS.API.STREAM.INFO.{Subjects(NS).stream('turns')}", b"")
    await errors.wait_for("publish", f"$JS.API.STREAM.INFO.{Subjects(NS).stream('turns')}")
    await nc.close()


async def test_an_expired_credential_is_refused(bus: Bus) -> None:
    """A credential past its `--expires-days` cannot connect."""
    out = bus.authority / "issued" / "expired.creds"
    creds.tenant(bus.authority, NS, "a", out, expires_at=int(time.time()) - 60)
    with pytest.raises(nats.errors.Error):
        await nats.connect(
            bus.url,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            **NatsAuth(creds=out).connect_options(),
        )


async def test_dev_bus_auth_runs_the_embedded_nats_in_operator_mode(
    tmp_path: Path, database_url: str, namespace: str, embedder: Any
) -> None:
    """`memstream dev --bus-auth`: the embedded nats-server refuses a client without a
    credential, the worker runs with its own, and a tenant credential issued from the state
    directory's authority publishes and recalls (with an API key)."""
    settings = Settings(
        namespace=namespace,
        state_dir=tmp_path,
        database_url=database_url,
        embedded_bus_auth=True,
        recall_cache_ttl_s=None,
    )
    stack = await Stack.open(settings, schema=namespace, dim=embedder.dim)
    try:
        assert stack.settings.nats_creds == tmp_path / "nats-auth" / creds.WORKER_CREDS
        with pytest.raises(nats.errors.Error):
            await nats.connect(stack.nats_url, allow_reconnect=False, max_reconnect_attempts=0)
        w = make_worker(stack, embedder, make_redactor(stack.settings, b"k" * 32))
        await w.vectors.ensure(embedder.dim)
        await w.start()
        try:
            out = tmp_path / "acme.creds"
            creds.tenant(tmp_path / "nats-auth", namespace, "acme", out)
            key = await stack.pg.create_api_key("acme", "agent")
            async with MemoryClient(
                "acme",
                user="alice",
                nats_url=stack.nats_url,
                namespace=namespace,
                nats_creds=out,
                api_key=key,
            ) as m:
                assert await m.publish_turn([("user", "I prefer green tea")]) is not None
                assert (await m.recall("tea")).hits is not None
        finally:
            await w.stop()
    finally:
        await stack.close()

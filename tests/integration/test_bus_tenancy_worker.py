"""The worker and its clients on a tenant-isolated bus, against a real nats-server (from the
wheel) running the operator-mode configuration that `memstream creds init` writes: the worker,
with its own credential, runs the pipeline end to end; a tenant's credential publishes only its
own (owner's) turns and asks recall and commands with its API key, which the worker requires;
the worker answers only on inboxes; the console needs the worker's credential; a service
credential serves every tenant and reads nothing; `memstream dev --bus-auth` runs the same."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from busclients import connect
from natsservers import NS, Bus

from memstream.consumers import creds
from memstream.consumers.app import Worker
from memstream.consumers.redaction_key import make_redactor
from memstream.consumers.run import make_worker
from memstream.consumers.services import Services
from memstream.consumers.stack import Stack, make_vector_index
from memstream.pipeline.redact import Redactor
from memstream.producers.client import MemoryClient, RecallError
from memstream.producers.connection import creds_inbox_prefix
from memstream.schemas.errors import ErrorCode
from memstream.schemas.settings import Settings, StageSettings
from memstream.schemas.subjects import Subjects, token
from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration


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

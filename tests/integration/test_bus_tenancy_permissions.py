"""Tenancy on the bus as the server enforces it, against a real nats-server (from the wheel)
running the operator-mode configuration that `memstream creds init` writes: a tenant's
credential subscribes only to its own inbox and publishes no other tenant's turns, stage, dead
letter, event, KV bucket or JetStream API request; forged, revoked and expired credentials are
refused."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest
from busclients import connect
from nats.errors import TimeoutError as NatsTimeout
from natsservers import NS, Bus

from memstream.consumers import creds
from memstream.consumers.topology import apply
from memstream.producers.client import MemoryClient
from memstream.producers.connection import NatsAuth
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import Subjects, token

pytestmark = pytest.mark.integration


async def with_streams(bus: Bus) -> None:
    """The namespace's streams, as a worker makes them (idempotent): a test that publishes
    turns needs them whichever tests ran before it."""
    nc, _ = await connect(bus, bus.authority / creds.WORKER_CREDS)
    try:
        await apply(nc.jetstream(), Settings(nats_url=bus.url, namespace=NS))
    finally:
        await nc.close()


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

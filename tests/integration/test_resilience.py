"""Topology ownership and failure paths: nothing lost, every failure explained."""

from __future__ import annotations

import nats
import pytest

from memstream.consumers.app import Worker
from memstream.consumers.embedded import free_port
from memstream.consumers.services import Services
from memstream.consumers.stack import make_vector_index
from memstream.consumers.topology import apply, topology
from memstream.pipeline.redact import Redactor
from memstream.schemas.settings import Settings, StageSettings
from memstream.storage.postgres import OwnerFilter
from memstream.storage.qdrant_server import ServerVectorIndex

pytestmark = pytest.mark.integration


async def test_topology_is_applied_and_updated(nats_url, namespace) -> None:
    """Streams and durable consumers get exactly the configured settings; applying twice is a
    no-op; a changed setting (the delivery limit, the ack deadline) updates the existing
    consumer in place, and so does a changed batch size (its ack-pending limit: an upgrade
    from the default of 128 to 256 finds consumers created at 128)."""
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        stage=StageSettings(max_deliver=4, ack_wait_s=12, batch_size=128),
    )
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        topo = await apply(js, settings)
        await apply(js, settings)
        for stage, (stream, cfg) in topo.consumers.items():
            info = await js.consumer_info(stream, cfg.durable_name or "")
            assert info.config.max_deliver == 4 and info.config.ack_wait == 12, stage
            assert info.config.max_ack_pending == 128 * 16, stage
            assert (
                str(getattr(info.config.ack_policy, "value", info.config.ack_policy)) == "explicit"
            )
        stages = await js.stream_info(settings_stream(settings, "stages"))
        assert (
            str(getattr(stages.config.retention, "value", stages.config.retention)) == "workqueue"
        )
        changed = settings.model_copy(update={"stage": StageSettings(max_deliver=7, ack_wait_s=10)})
        assert changed.stage.batch_size == 256  # the default
        await apply(js, changed)
        stream, cfg = topology(changed).consumers["store"]
        updated = (await js.consumer_info(stream, cfg.durable_name or "")).config
        assert (updated.max_deliver, updated.ack_wait) == (7, 10)
        assert updated.max_ack_pending == 256 * 16
    finally:
        for s in topology(settings).streams:
            await js.delete_stream(s.name or "")
        await nc.close()


def settings_stream(settings: Settings, kind: str) -> str:
    from memstream.schemas.subjects import Subjects

    return Subjects(settings.namespace).stream(kind)


async def test_vector_index_down_keeps_memories_and_reconciles(
    nats_url, pg, namespace, tmp_path, embedder
) -> None:
    """With the Qdrant server unreachable, stored memories stay in Postgres (not indexed),
    keyword recall still finds them (degraded), and the reconciler indexes them once an
    index answers again."""
    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path,
        stage=StageSettings(max_deliver=3, retry_delays_s=[0.2]),
    )
    down = ServerVectorIndex(
        url=f"http://127.0.0.1:{free_port()}",
        timeout=1,
        check_compatibility=False,
        dim=embedder.dim,
    )
    worker = Worker(Services(settings, pg, down, embedder, Redactor(key=b"k")), nats_url)
    await worker.start()
    try:
        from memstream.producers.client import MemoryClient

        async with MemoryClient("acme", user="lee", nats_url=nats_url, namespace=namespace) as mem:
            await mem.publish_turn([("user", "The spare tyre is in the garage loft")])
            flt = OwnerFilter(tenant="acme", user="lee")
            assert await mem.flush(within_s=10)  # stored in Postgres, not indexed
            rows = await pg.list_memories(flt)
            assert rows and not rows[0].indexed
            reply = await mem.recall("where is the spare tyre?", cache=False)
            assert reply.degraded == ["vector_index"]
            assert "garage loft" in reply.hits[0].text
            # the index is back (a live engine): the maintenance round indexes what waited
            live = make_vector_index(settings)
            await live.ensure(embedder.dim)
            worker.services.vectors = live
            await worker.reconcile_once()  # the maintenance loop may have been first
            assert all(r.indexed for r in await pg.list_memories(flt))
            reply = await mem.recall("where is the spare tyre?", cache=False)
            assert reply.degraded == [] and "garage loft" in reply.hits[0].text
            await live.close()
    finally:
        await worker.stop()
        nc = await nats.connect(nats_url)
        for s in topology(settings).streams:
            await nc.jetstream().delete_stream(s.name or "")
        await nc.close()


async def test_postgres_outage_dead_letters_then_replay_stores(
    nats_url, database_url, namespace, tmp_path, embedder
) -> None:
    """Postgres gone: the extract stage retries, then dead-letters the turn with the reason;
    once Postgres is back, `memstream dlq replay` sends it through and it is stored once."""
    import argparse

    from memstream.consumers.dlq import dead_letters
    from memstream.consumers.dlq import run as dlq_run
    from memstream.producers.client import MemoryClient
    from memstream.schemas.subjects import DLQ_REASON_HEADER, Subjects
    from memstream.storage.postgres import PgStore

    settings = Settings(
        nats_url=nats_url,
        namespace=namespace,
        state_dir=tmp_path,
        # an outage is held and retried in place for outage_hold_s first: short here
        stage=StageSettings(max_deliver=2, retry_delays_s=[0.1], outage_hold_s=0.3),
    )
    broken = await PgStore.connect(database_url, schema=namespace)
    await broken.close()
    vectors = make_vector_index(settings)
    await vectors.ensure(embedder.dim)
    worker = Worker(Services(settings, broken, vectors, embedder, Redactor(key=b"k")), nats_url)
    await worker.start()
    s = Subjects(namespace)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    arrived = await nc.subscribe(s.dlq("extract"))  # the dead letter as it is published
    try:
        async with MemoryClient("acme", user="mo", nats_url=nats_url, namespace=namespace) as mem:
            await mem.publish_turn([("user", "The bike lock code starts with seven")])
            await arrived.next_msg(timeout=15)
            (dead,) = await dead_letters(js, s, "extract", 10)
            assert "StorageUnavailable" in dead.headers[DLQ_REASON_HEADER]
            healthy = await PgStore.connect(database_url, schema=namespace)
            worker.services.store = healthy
            args = argparse.Namespace(action="replay", stage="extract", limit=100)
            assert await dlq_run(args, settings, nats_url) == 0
            assert await dead_letters(js, s, "extract", 10) == []
            flt = OwnerFilter(tenant="acme", user="mo")
            assert await mem.flush(within_s=15)  # the replayed turn went through every stage
            rows = await healthy.list_memories(flt)
            assert len(rows) == 1 and "bike lock" in rows[0].content
            await healthy.close()
    finally:
        await worker.stop()
        await vectors.close()
        for st in topology(settings).streams:
            await js.delete_stream(st.name or "")
        await nc.close()

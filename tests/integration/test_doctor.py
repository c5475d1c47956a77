"""``memstream doctor`` against the real embedded stack: healthy, then one induced problem at
a time, each reported with the fix it names."""

from __future__ import annotations

import secrets

import asyncpg
import nats
import pytest
from nats.js.api import ConsumerConfig
from pydantic import SecretStr

from memstream.consumers import doctor
from memstream.consumers.admin import apply_streams
from memstream.consumers.topology import topology
from memstream.schemas.subjects import Subjects
from memstream.storage import pgcheck

pytestmark = pytest.mark.integration

KEY = secrets.token_hex(32)


def configured(running):
    """The running worker's settings, with a production redaction key."""
    return running.settings.model_copy(update={"redaction_key": SecretStr(KEY)})


async def check(running, database_url: str, capsys, **update):
    """Run the doctor; returns (exit code, printed report, findings by check)."""
    settings = configured(running).model_copy(update=update)
    schema = running.settings.namespace
    code = await doctor.doctor(settings, running.nats_url, database_url, schema)
    out = capsys.readouterr().out
    findings = await doctor.diagnose(settings, running.nats_url, database_url, schema)
    return code, out, {f.check: f for f in findings}


async def stored(running) -> None:
    async with running.client("acme", user="ann") as mem:
        await mem.publish_turn([("user", "I prefer green tea in the morning")])
    await running.wait_for(running.drained, 30, "ingestion")


async def test_healthy_stack_passes_every_check(running, database_url: str, capsys) -> None:
    """On a worker that stored memories, every check passes and the exit code is 0; the
    report does not hold the redaction key."""
    await stored(running)
    code, out, found = await check(running, database_url, capsys)
    assert code == 0, out
    assert set(found) == {
        "nats",
        "streams",
        "consumers",
        "dead_letters",
        "postgres",
        "migrations",
        "clock",
        "redaction_key",
        "index",
        "embedding",
        "index_count",
    }
    assert "all checks passed" in out
    assert found["index_count"].detail.startswith(f"{await running.worker.vectors.count()} points")
    assert await running.worker.vectors.count() > 0
    assert KEY not in out


async def test_a_waiting_dead_letter_fails_with_the_dlq_fix(
    running, database_url: str, capsys
) -> None:
    """A dead letter in the stream makes the doctor exit 1 naming the stage and `memstream dlq`."""
    s = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        await nc.jetstream().publish(s.turns("acme", "ann", "s1"), b"not a turn")
    finally:
        await nc.close()

    async def dead() -> bool:
        return bool(running.worker.deps.metrics["extract"].dead_lettered)

    await running.wait_for(dead, 30, "the dead letter")
    code, out, found = await check(running, database_url, capsys)
    assert code == 1
    assert not found["dead_letters"].ok
    assert "1 waiting (extract: 1)" in found["dead_letters"].detail
    assert "memstream dlq list" in found["dead_letters"].fix
    assert "fix: read the reasons with `memstream dlq list`" in out
    assert all(f.ok for name, f in found.items() if name != "dead_letters")


async def test_a_drifted_consumer_fails_until_streams_apply(
    running, database_url: str, capsys
) -> None:
    """A stage consumer changed behind memstream's back is named with the field that drifted
    and `memstream streams apply`; after the apply the doctor passes again."""
    stream, cfg = topology(running.settings).consumers["dedupe"]
    nc = await nats.connect(running.nats_url)
    try:
        drifted = ConsumerConfig.from_response(cfg.as_dict())
        drifted.max_deliver = 9
        await nc.jetstream().add_consumer(stream, drifted)
    finally:
        await nc.close()
    code, out, found = await check(running, database_url, capsys)
    assert code == 1
    assert not found["consumers"].ok
    assert "stage dedupe" in found["consumers"].detail
    assert "max_deliver is 9, memstream wants 3" in found["consumers"].detail
    assert "memstream streams apply" in out
    assert await apply_streams(running.settings, running.nats_url) == 0
    code, out, found = await check(running, database_url, capsys)
    assert code == 0, out


async def test_index_count_mismatch_fails_until_reindexed(
    running, database_url: str, capsys
) -> None:
    """A point missing from the index is reported with `memstream reindex`; marking the
    memories for reindexing lets the reconciler restore it, and the doctor passes."""
    await stored(running)
    assert await running.pg.unindexed(10) == []
    before = await running.worker.vectors.count()
    con = await asyncpg.connect(
        database_url, server_settings={"search_path": running.settings.namespace}
    )
    try:
        some = await con.fetchval("SELECT id::text FROM memories WHERE tenant = 'acme' LIMIT 1")
    finally:
        await con.close()
    await running.worker.vectors.delete("acme", [some])
    assert await running.worker.vectors.count() == before - 1
    code, out, found = await check(running, database_url, capsys)
    assert code == 1
    assert not found["index_count"].ok
    assert f"{before - 1} points, Postgres has {before} live indexed memories" in out
    assert "memstream reindex" in found["index_count"].fix
    marked = await pgcheck.mark_all_unindexed(database_url, running.settings.namespace)
    assert marked == before
    await running.worker.reconcile_once()
    code, out, _ = await check(running, database_url, capsys)
    assert code == 0, out


async def test_missing_migration_and_development_key_are_named(
    running, database_url: str, capsys
) -> None:
    """An unapplied migration names starting a worker; an unset redaction key names
    MEMSTREAM_REDACTION_KEY."""
    con = await asyncpg.connect(
        database_url, server_settings={"search_path": running.settings.namespace}
    )
    try:
        last = await con.fetchval("SELECT max(version) FROM schema_migrations")
        await con.execute("DELETE FROM schema_migrations WHERE version = $1", last)
    finally:
        await con.close()
    code, out, found = await check(running, database_url, capsys, redaction_key=None)
    assert code == 1
    assert f"FAIL  migrations     not applied: {last}" in out
    assert found["migrations"].detail == f"not applied: {last}"
    assert "memstream worker" in found["migrations"].fix
    assert not found["redaction_key"].ok
    assert "MEMSTREAM_REDACTION_KEY" in found["redaction_key"].fix


async def test_unreachable_servers_are_named_without_credentials(
    running, database_url: str, capsys
) -> None:
    """NATS on a dead port and Postgres with a wrong password: each named with its fix; the
    password appears nowhere in the report."""
    settings = configured(running)
    wrong = "pw-" + secrets.token_hex(8)
    scheme, rest = database_url.split("//", 1)
    host = rest.split("@", 1)[-1]
    bad_dsn = f"{scheme}//memstream_nobody:{wrong}@{host}"
    code = await doctor.doctor(settings, "nats://127.0.0.1:1", bad_dsn, running.settings.namespace)
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  nats" in out and "MEMSTREAM_NATS_URL" in out
    assert "FAIL  postgres" in out and "MEMSTREAM_DATABASE_URL" in out
    assert wrong not in out


async def test_a_worker_on_the_development_key_is_named(running, database_url: str, capsys) -> None:
    """Even with a proper key in the doctor's environment, a worker that runs with its state
    directory's development key (as `memstream dev` does) fails the check."""
    running.worker.dev_redaction_key = True
    code, out, found = await check(running, database_url, capsys)
    assert code == 1
    assert "runs with its state directory's development key" in found["redaction_key"].detail
    assert "without --dev-redaction-key" in out


async def test_reindex_now_rebuilds_a_new_collection_from_postgres(
    running, database_url: str, capsys
) -> None:
    """`memstream reindex --now` with a new collection fills it with one point per live memory,
    read from Postgres alone."""
    from memstream.consumers.admin import reindex
    from memstream.consumers.stack import make_vector_index

    await stored(running)
    want = await running.pg.count()
    fresh = running.settings.model_copy(update={"collection": "rebuilt"})
    assert await reindex(fresh, database_url, now=True, schema=running.settings.namespace) == 0
    assert f"indexed {want} memories" in capsys.readouterr().out
    index = make_vector_index(fresh)
    try:
        await index.ensure(running.worker.embedder.dim)
        assert await index.count() == want > 0
        assert await index.count("acme") == want
    finally:
        await index.close()
    assert await running.pg.unindexed(10) == []

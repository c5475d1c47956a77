"""The store checks: Postgres (reachable, migrations, clock), the redaction key, and the
vector index (reachable, dimension, count against Postgres)."""

from __future__ import annotations

from typing import Any

from memstream.consumers.doctor.bus import worker_stats
from memstream.consumers.doctor.findings import Finding
from memstream.consumers.redaction_key import DEV_KEY_FILE, MIN_KEY_CHARS, PUBLIC_KEYS
from memstream.producers.connection import display_url
from memstream.schemas.errors import MemstreamError
from memstream.schemas.settings import Settings
from memstream.storage import pgcheck

MAX_SKEW_S = 2.0


async def check_postgres(database_url: str | None, schema: str) -> tuple[list[Finding], Any]:
    if not database_url:
        return [
            Finding(
                "postgres",
                False,
                "no database configured and no running `memstream dev` recorded one",
                "set MEMSTREAM_DATABASE_URL",
            )
        ], None
    try:
        report = await pgcheck.inspect(database_url, schema)
    except MemstreamError as exc:
        return [
            Finding(
                "postgres",
                False,
                str(exc),
                "start PostgreSQL, or set MEMSTREAM_DATABASE_URL to a reachable server "
                "(user, password, database)",
            )
        ], None
    found = [
        Finding("postgres", True, f"connected (round trip {report.round_trip_s * 1000:.1f} ms)")
    ]
    if report.missing:
        found.append(
            Finding(
                "migrations",
                False,
                f"not applied: {', '.join(map(str, report.missing))}",
                "start one worker (`memstream worker`): it applies pending migrations at "
                "start-up, under a lock, before it consumes",
            )
        )
    elif report.unknown:
        found.append(
            Finding(
                "migrations",
                False,
                f"the database has migrations this memstream does not know: "
                f"{', '.join(map(str, report.unknown))}",
                "upgrade this memstream to the release the workers run (docs/operations.md)",
            )
        )
    else:
        found.append(Finding("migrations", True, f"all {len(report.packaged)} applied"))
    skew = report.skew_s
    found.append(
        Finding(
            "clock",
            abs(skew) <= MAX_SKEW_S,
            f"Postgres is {abs(skew):.2f} s {'ahead of' if skew > 0 else 'behind'} this host",
            "synchronise the clocks of this host and the database host (NTP: chrony or "
            "systemd-timesyncd); expiry and fact validity compare them",
        )
    )
    return found, report


def check_redaction_key(settings: Settings, stats: dict[str, Any] | None = None) -> Finding:
    """The key in this environment, and what the answering worker reports it runs with."""
    fix = (
        "set MEMSTREAM_REDACTION_KEY to a random secret, the same on every worker "
        "(`python -c 'import secrets; print(secrets.token_hex(32))'`), kept in a secret store"
    )
    if settings.redaction_key is None:
        return Finding(
            "redaction_key",
            False,
            "MEMSTREAM_REDACTION_KEY is not set: only `memstream dev` (or --dev-redaction-key) "
            "runs, with the state directory's development key",
            fix,
        )
    key = settings.redaction_key.get_secret_value()
    if key in PUBLIC_KEYS or len(key) < MIN_KEY_CHARS:
        return Finding(
            "redaction_key", False, "MEMSTREAM_REDACTION_KEY is a public example or too short", fix
        )
    dev = settings.state_dir / DEV_KEY_FILE
    try:
        is_dev = dev.exists() and dev.read_text().strip() == key
    except OSError:
        is_dev = False
    if is_dev:
        return Finding(
            "redaction_key",
            False,
            f"MEMSTREAM_REDACTION_KEY is the development key of {settings.state_dir}",
            fix,
        )
    if stats is not None and stats.get("dev_redaction_key"):
        return Finding(
            "redaction_key",
            False,
            f"worker {stats.get('worker', '?')} runs with its state directory's development "
            "key (`memstream dev` or --dev-redaction-key)",
            fix + ", then restart that worker as `memstream worker` without --dev-redaction-key",
        )
    return Finding("redaction_key", True, "set, not a development or example key")


async def check_index(
    settings: Settings, nc: Any, report: pgcheck.PgReport | None, dim: int
) -> list[Finding]:
    """The index answers; the embedding model's dimension is the collection's; its point
    count is Postgres's count of live indexed memories."""
    fix_down = "start the Qdrant server, or set MEMSTREAM_QDRANT_URL (and MEMSTREAM_QDRANT_API_KEY)"
    if settings.qdrant_url:
        from memstream.storage.qdrant_server import ServerVectorIndex

        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        index = ServerVectorIndex(
            url=settings.qdrant_url, api_key=key, collection=settings.collection
        )
        try:
            stored: int | None = await index.stored_dim()
            count = await index.count() if stored is not None else 0
        except MemstreamError as exc:
            return [
                Finding(
                    "index", False, f"Qdrant at {display_url(settings.qdrant_url)}: {exc}", fix_down
                )
            ]
        finally:
            await index.close()
        where = f"Qdrant collection {settings.collection!r}"
    else:
        from memstream.storage.qdrant_edge import stored_dim

        path = settings.state_dir / "qdrant" / settings.collection
        stored = stored_dim(path)
        stats = await worker_stats(nc, settings)
        health = stats.get("health", {}).get("index") if stats else None
        if health is None or not health.get("ok"):
            why = (
                "no worker answers"
                if health is None
                else f"the worker reports {health.get('error')}"
            )
            return [
                Finding(
                    "index",
                    False,
                    f"Qdrant Edge shard {path}: {why} (the shard lives inside the worker process)",
                    "start the worker that owns the shard (`memstream worker` with this state "
                    "directory); Qdrant Edge is one process's index: use a Qdrant server for "
                    "several",
                )
            ]
        count = int(health["count"])
        where = f"Qdrant Edge shard {path}"
    found = [Finding("index", True, f"{where} answers, {count} points")]
    if stored is None:
        found.append(
            Finding(
                "embedding",
                False,
                f"{where} does not exist yet",
                "start a worker: it creates the collection",
            )
        )
        return found
    found.append(
        Finding(
            "embedding",
            stored == dim,
            f"the embedding model gives {dim} dimensions, {where} holds {stored}",
            "the model changed: set MEMSTREAM_EMBEDDING_MODEL back, or point MEMSTREAM_COLLECTION "
            "at a new collection and run `memstream reindex` to fill it from Postgres",
        )
    )
    if report is not None:
        want, slack = report.indexed, report.pending_deletes
        ok = want <= count <= want + slack
        waiting = f"; {report.unindexed} wait for the reconciler" if report.unindexed else ""
        found.append(
            Finding(
                "index_count",
                ok,
                f"{count} points, Postgres has {want} live indexed memories"
                f"{f' and {slack} point deletions queued' if slack else ''}{waiting}",
                "run `memstream reindex` (marks every live memory for the workers' reconciler, "
                "which writes each point again from its Postgres row)",
            )
        )
    return found

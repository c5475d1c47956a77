"""``memstream doctor``: check a deployment and say what to do about each problem.

Checks, in order (a check whose server is unreachable is reported once, as that server):

- ``nats``: connects with the configured credentials; JetStream answers;
- ``streams`` / ``consumers``: every stream and stage consumer exists with the configuration
  ``consumers/topology.py`` defines (an existing durable is bound, not updated, by clients);
- ``dead_letters``: nothing waits in the dead-letter stream;
- ``postgres``: connects; ``migrations``: every packaged migration is applied, none unknown;
- ``clock``: Postgres ``now()`` within ``MAX_SKEW_S`` of this host's clock (expiry, TTLs and
  fact validity compare the two);
- ``redaction_key``: set, not a published example, not the state directory's development key;
- ``index``: answers (a Qdrant server directly; Qdrant Edge through the worker that owns the
  shard, ``<ns>.ops.stats``); ``embedding``: the model's dimension is the collection's;
  ``index_count``: the index holds one point per live indexed memory in Postgres.

Output never holds a DSN, a key or a credential: URLs are shown without user info, errors by
their type. Exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import nats
from nats.js.api import ConsumerConfig, StreamConfig

from memstream.consumers.natsconn import nats_options
from memstream.consumers.redaction_key import DEV_KEY_FILE, MIN_KEY_CHARS, PUBLIC_KEYS
from memstream.consumers.topology import topology
from memstream.producers.connection import display_url
from memstream.schemas.errors import MemstreamError
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import Subjects
from memstream.storage import pgcheck

MAX_SKEW_S = 2.0
TIMEOUT_S = 5.0
APPLY = "run `memstream streams apply` (creates or updates streams and consumers in place)"


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""


def _same(want: Any, have: Any) -> bool:
    if isinstance(want, float) or isinstance(have, float):
        return abs(float(want or 0) - float(have or 0)) < 1e-3
    return bool(want == have)


def _drift(want: Any, have: Any, fields: tuple[str, ...]) -> list[str]:
    out = []
    for name in fields:
        w, h = getattr(want, name), getattr(have, name)
        if not _same(w, h):
            w, h = getattr(w, "value", w), getattr(h, "value", h)
            out.append(f"{name} is {h}, memstream wants {w}")
    return out


STREAM_FIELDS = (
    "subjects",
    "retention",
    "max_age",
    "storage",
    "discard",
    "duplicate_window",
    "num_replicas",
)
CONSUMER_FIELDS = (
    "deliver_policy",
    "ack_policy",
    "ack_wait",
    "max_deliver",
    "filter_subject",
    "max_ack_pending",
)


async def _quiet(exc: Exception) -> None:
    del exc


async def check_bus(settings: Settings, nats_url: str) -> tuple[list[Finding], Any]:
    """NATS, streams, consumers and dead letters; returns the findings and an open
    connection (None when NATS did not answer)."""
    where = display_url(nats_url)
    try:
        nc = await asyncio.wait_for(
            nats.connect(
                nats_url,
                connect_timeout=TIMEOUT_S,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                error_cb=_quiet,  # the failure is the finding, not a logged traceback
                **nats_options(settings),
            ),
            TIMEOUT_S * 2,
        )
    except Exception as exc:  # noqa: BLE001 - any failure to connect is the finding
        return [
            Finding(
                "nats",
                False,
                f"cannot connect to {where} ({type(exc).__name__})",
                "start NATS with JetStream, or set MEMSTREAM_NATS_URL and the MEMSTREAM_NATS_* "
                "credentials to a reachable server",
            )
        ], None
    js = nc.jetstream(timeout=TIMEOUT_S)
    try:
        await js.account_info()
    except Exception as exc:  # noqa: BLE001 - JetStream off or not permitted
        return [
            Finding(
                "nats",
                False,
                f"{where} answers but JetStream does not ({type(exc).__name__})",
                "enable JetStream on the server (`jetstream {}` in its configuration) and give "
                "this user access to the JetStream API",
            )
        ], nc
    found = [Finding("nats", True, f"connected to {where}, JetStream enabled")]
    topo = topology(settings)
    drifted: list[str] = []
    for want in topo.streams:
        name = want.name or ""
        try:
            have: StreamConfig = (await js.stream_info(name)).config
        except Exception:  # noqa: BLE001 - missing (or unreadable) is the finding
            drifted.append(f"stream {name} is missing")
            continue
        drifted += [f"stream {name}: {d}" for d in _drift(want, have, STREAM_FIELDS)]
    found.append(
        Finding(
            "streams", not drifted, "; ".join(drifted) or f"{len(topo.streams)} as defined", APPLY
        )
    )
    drifted = []
    for stage, (stream, want_c) in topo.consumers.items():
        durable = want_c.durable_name or ""
        try:
            have_c: ConsumerConfig = (await js.consumer_info(stream, durable)).config
        except Exception:  # noqa: BLE001 - missing (or unreadable) is the finding
            drifted.append(f"stage {stage}: consumer {stream}/{durable} is missing")
            continue
        drifted += [
            f"stage {stage} ({stream}/{durable}): {d}"
            for d in _drift(want_c, have_c, CONSUMER_FIELDS)
        ]
    found.append(
        Finding(
            "consumers",
            not drifted,
            "; ".join(drifted) or f"{len(topo.consumers)} stage consumers as defined",
            APPLY + "; a field the server cannot change in place needs the consumer deleted "
            "first (`nats consumer rm <stream> <durable>`); it resumes from the stream",
        )
    )
    found.append(await _dead_letters(js, settings))
    return found, nc


async def _dead_letters(js: Any, settings: Settings) -> Finding:
    s = Subjects(settings.namespace)
    try:
        state = (await js.stream_info(s.stream("dlq"), subjects_filter=s.dlq())).state
    except Exception as exc:  # noqa: BLE001 - reported with the streams above when missing
        return Finding(
            "dead_letters",
            False,
            f"cannot read the dead-letter stream ({type(exc).__name__})",
            APPLY,
        )
    if not state.messages:
        return Finding("dead_letters", True, "none waiting")
    by_stage = ", ".join(
        f"{subject.rsplit('.', 1)[-1]}: {n}"
        for subject, n in sorted((state.subjects or {}).items())
    )
    return Finding(
        "dead_letters",
        False,
        f"{state.messages} waiting ({by_stage})",
        "read the reasons with `memstream dlq list` (or the console's Dead letters page), fix "
        "the cause, then `memstream dlq replay`, or discard them in the console",
    )


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


async def worker_stats(nc: Any, settings: Settings) -> dict[str, Any] | None:
    """The first worker's answer to ``<ns>.ops.stats`` (None when none answers)."""
    if nc is None:
        return None
    try:
        msg = await nc.request(Subjects(settings.namespace).ops("stats"), b"{}", timeout=TIMEOUT_S)
        stats: dict[str, Any] = json.loads(msg.data)
    except Exception:  # noqa: BLE001 - no worker answered
        return None
    return stats


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


async def diagnose(
    settings: Settings,
    nats_url: str,
    database_url: str | None,
    schema: str = "public",
    dim: int | None = None,
) -> list[Finding]:
    """Every check; ``dim``: the embedding model's dimension (loaded from settings if None)."""
    bus, nc = await check_bus(settings, nats_url)
    try:
        pg, report = await check_postgres(database_url, schema)
        if dim is None:
            from memstream.storage.embedding import make_embedder

            dim = make_embedder(settings.embedding_model, settings.embedding_path).dim
        index = await check_index(settings, nc, report, dim)
        key = check_redaction_key(settings, await worker_stats(nc, settings))
    finally:
        if nc is not None:
            await nc.close()
    return [*bus, *pg, key, *index]


def render(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{'ok  ' if f.ok else 'FAIL'}  {f.check:<14} {f.detail}")
        if not f.ok:
            lines.append(f"      {'':<14} fix: {f.fix}")
    failed = sum(not f.ok for f in findings)
    lines.append("all checks passed" if not failed else f"{failed} check(s) failed")
    return "\n".join(lines)


async def doctor(
    settings: Settings,
    nats_url: str,
    database_url: str | None,
    schema: str = "public",
    as_json: bool = False,
    dim: int | None = None,
) -> int:
    """Run every check, print the report; 0 when all passed, else 1."""
    findings = await diagnose(settings, nats_url, database_url, schema, dim)
    print(json.dumps([asdict(f) for f in findings]) if as_json else render(findings))
    return 0 if all(f.ok for f in findings) else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check NATS, Postgres, the index and their configuration")
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--json", action="store_true")

    def run(a: argparse.Namespace) -> int:
        from memstream.producers.client import discover_nats_url
        from memstream.schemas.stack import read_stack

        settings = Settings()
        if a.state_dir:
            settings = settings.model_copy(update={"state_dir": a.state_dir})
        nats_url = settings.nats_url or discover_nats_url(settings.state_dir)
        dsn = (
            settings.database_url.get_secret_value()
            if settings.database_url
            else read_stack(settings.state_dir).get("database_url")
        )
        return asyncio.run(doctor(settings, nats_url, dsn, as_json=a.json))

    p.set_defaults(func=run)

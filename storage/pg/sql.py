"""What the Postgres modules share: the owner filter and its SQL, the row to record mapping,
the driver-error translation and the audit-key helpers. No statements run here."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import asyncpg

from memstream.schemas.errors import DataRejected
from memstream.schemas.memory import Candidate, MemoryRecord, MemoryType, Scope
from memstream.storage.pgpool import OUTAGE

_MIGRATION_LOCK = 0x6D656D73  # "mems"
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_TRANSIENT = OUTAGE  # storage/pgpool.py says why each class is there

# The values themselves are refused (SQLSTATE class 22: NUL in text 22021, \u0000 in jsonb
# 22P05, NaN in jsonb 22P02 ...; class 54: a tsvector or index row over the size limits):
# the same message fails the same way every time, so it is permanent.
_PERMANENT = (asyncpg.exceptions.DataError, asyncpg.exceptions.ProgramLimitExceededError)


def _rejected(exc: asyncpg.PostgresError) -> DataRejected:
    """The SQLSTATE and its class name only: a driver message may quote the value."""
    return DataRejected(
        f"postgres refused the data: SQLSTATE {exc.sqlstate} ({type(exc).__name__})"
    )


def _fold_key(candidate_id: str) -> str:
    return f"folded:{candidate_id}"


async def _queue_vector_deletes(con: Any, tenant: str, ids: Sequence[str]) -> None:
    """Queue the points of ``ids`` for deletion, inside the caller's transaction: the memory
    change and the promise to delete its point commit together (``vector_deletes``)."""
    if ids:
        await con.execute(
            "INSERT INTO vector_deletes (tenant, memory_id) SELECT $1, unnest($2::uuid[]) "
            "ON CONFLICT DO NOTHING",
            tenant,
            list(ids),
        )


@dataclass(frozen=True, slots=True)
class OwnerFilter:
    """Tenant always. Whose memories (docs/memory-model.md; the same rules as
    ``storage.ports.VectorFilter``):

    - ``user`` and/or ``agent`` set: that owner exactly (an unset one matches only NULL).
      ``shared`` (reads): also the tenant's ``global`` memories and the ``project`` ones of
      ``project``, whoever owns them.
    - ``peer``: agent-owned memories (no user), of ``agent`` if set, never ``exclude_agent``'s.
    - neither: the whole tenant (internal readers only).

    session, types, scopes, time and tags narrow when set."""

    tenant: str
    user: str | None = None
    agent: str | None = None
    project: str | None = None
    shared: bool = False
    peer: bool = False
    session: str | None = None
    types: Sequence[MemoryType] = ()
    scopes: Sequence[Scope] = ()
    exclude_agent: str | None = None  # with ``peer``: every agent but this one
    occurred_from: datetime | None = None
    occurred_to: datetime | None = None
    tags: Sequence[str] = ()  # every one of these


Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def migrations() -> list[tuple[int, str]]:
    """(version, sql) of every packaged migration, in order."""
    folder = resources.files("memstream.storage") / "migrations"
    out = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            out.append((int(entry.name.split("_", 1)[0]), entry.read_text("utf-8")))
    return sorted(out)


def _where(flt: OwnerFilter, args: list[Any], now: datetime, live: bool = True) -> str:
    """SQL conditions for a filter; appends the bind values to ``args``. ``live``: hide
    tombstoned, expired, superseded and not-yet/no-longer valid memories."""
    args.append(flt.tenant)
    parts = [f"tenant = ${len(args)}", "deleted_at IS NULL"]
    if live:
        args.append(now)
        n = f"${len(args)}"
        parts += [
            "superseded_by IS NULL",
            f"(expires_at IS NULL OR pinned OR expires_at > {n})",
            f"(valid_to IS NULL OR valid_to > {n})",
            f"(valid_from IS NULL OR valid_from <= {n})",
        ]
    if owner := _owner_sql(flt, args):
        parts.append(owner)
    if flt.session is not None:
        args.append(flt.session)
        parts.append(f"session = ${len(args)}")
    if flt.types:
        args.append([t.value for t in flt.types])
        parts.append(f"type = ANY(${len(args)}::text[])")
    if flt.scopes:
        args.append([s.value for s in flt.scopes])
        parts.append(f"scope = ANY(${len(args)}::text[])")
    if flt.occurred_from is not None:
        args.append(flt.occurred_from)
        parts.append(f"occurred_at >= ${len(args)}")
    if flt.occurred_to is not None:
        args.append(flt.occurred_to)
        parts.append(f"occurred_at <= ${len(args)}")
    if flt.tags:
        args.append(list(flt.tags))
        parts.append(f"tags @> ${len(args)}::text[]")
    return " AND ".join(parts)


def _owner_sql(flt: OwnerFilter, args: list[Any]) -> str | None:
    """The owner condition of ``flt`` (see ``OwnerFilter``), None for the whole tenant. An
    unset user or agent is written ``IS NULL`` (not ``IS NOT DISTINCT FROM $n``, which no
    index serves)."""

    def equal(column: str, value: str | None) -> str:
        if value is None:
            return f"{column} IS NULL"
        args.append(value)
        return f"{column} = ${len(args)}"

    if flt.peer:
        parts = ["user_id IS NULL", "agent_id IS NOT NULL"]
        if flt.agent is not None:
            parts.append(equal("agent_id", flt.agent))
        if flt.exclude_agent is not None:
            args.append(flt.exclude_agent)
            parts.append(f"agent_id <> ${len(args)}")
        return " AND ".join(parts)
    if flt.user is None and flt.agent is None:
        return None
    own = f"{equal('user_id', flt.user)} AND {equal('agent_id', flt.agent)}"
    if not flt.shared:
        return own
    shared = [f"({own})", "scope = 'global'"]
    if flt.project is not None:
        args.append(flt.project)
        shared.append(f"(scope = 'project' AND project = ${len(args)})")
    return f"({' OR '.join(shared)})"


def keyword_query(text: str) -> str:
    """An OR tsquery over the words of ``text`` (safe: only letters and digits reach it)."""
    return " | ".join(dict.fromkeys(w.lower() for w in _WORD.findall(text)))


def _record(row: asyncpg.Record) -> MemoryRecord:
    return MemoryRecord(
        id=str(row["id"]),
        tenant=row["tenant"],
        user=row["user_id"],
        agent=row["agent_id"],
        app=row["app"],
        project=row["project"],
        session=row["session"],
        type=MemoryType(row["type"]),
        scope=Scope(row["scope"]),
        content=row["content"],
        content_hash=row["content_hash"],
        salience=row["salience"],
        confidence=row["confidence"],
        importance=row["importance"],
        pinned=row["pinned"],
        access_count=row["access_count"],
        source_event_ids=list(row["source_event_ids"]),
        metadata=json.loads(row["metadata"]),
        occurred_at=row["occurred_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        expires_at=row["expires_at"],
        deleted_at=row["deleted_at"],
        indexed=row["indexed"],
        last_accessed_at=row["last_accessed_at"],
        fact_key=row["fact_key"],
        valid_from=row["valid_from"],
        valid_to=row["valid_to"],
        superseded_by=str(row["superseded_by"]) if row["superseded_by"] else None,
        tags=list(row["tags"]),
    )


_COLUMNS = (
    "id, tenant, user_id, agent_id, app, project, session, scope, type, content, content_hash, "
    "salience, confidence, importance, pinned, access_count, source_event_ids, metadata, "
    "occurred_at, created_at, updated_at, expires_at, deleted_at, indexed, last_accessed_at, "
    "fact_key, valid_from, valid_to, superseded_by, tags"
)


def _upsert_args(memory_id: str, content_hash: str, c: Candidate, now: datetime) -> tuple[Any, ...]:
    """The parameters of ``PgStore.upsert``'s statement for one candidate."""
    key = c.metadata.get("fact_key")
    return (
        memory_id,
        c.owner.tenant,
        c.owner.user,
        c.owner.agent,
        c.app,
        c.project,
        c.session,
        c.scope.value,
        c.type.value,
        c.content,
        content_hash,
        c.salience,
        c.confidence,
        c.importance,
        c.source_event_id,
        json.dumps(c.metadata),
        json.dumps(c.redactions),
        c.occurred_at,
        c.pinned,
        c.expires_at,
        key if isinstance(key, str) else None,
        now,
        list(c.tags),
    )


def hash_key(key: str) -> str:
    """sha256 of an API key (keys are 256-bit random: no salt or slow hash needed)."""
    return hashlib.sha256(key.encode()).hexdigest()

"""Postgres adapter (asyncpg): the record of truth.

Every write is idempotent: memory ids are deterministic, inserts use
``ON CONFLICT``, audit rows carry a unique ``event_key``. Driver errors are
translated here, once: connection failures become ``StorageUnavailable``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import asyncpg

from memstream.schemas.errors import DataRejected, StorageUnavailable
from memstream.schemas.memory import Candidate, MemoryRecord, MemoryType, Scope
from memstream.storage.pgpool import OUTAGE, GuardedPool

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


class PgStore:
    """Memories and their audit trail in one Postgres schema."""

    def __init__(self, pool: asyncpg.Pool, clock: Clock = utcnow) -> None:
        self._pool = GuardedPool(pool)  # every use translates an outage, once
        self.clock = clock

    @classmethod
    async def connect(
        cls,
        dsn: str,
        schema: str = "public",
        min_size: int = 1,
        max_size: int = 10,
        clock: Clock = utcnow,
    ) -> PgStore:
        """Open a pool whose connections use ``schema`` and apply pending migrations."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
            raise ValueError("schema must be a lower-case SQL identifier")
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                server_settings={"search_path": schema, "application_name": "memstream"},
            )
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres is not reachable") from exc
        store = cls(pool, clock)
        await store.migrate(schema)
        return store

    async def migrate(self, schema: str) -> list[int]:
        """Apply packaged migrations not yet recorded; returns the versions applied."""
        applied: list[int] = []
        async with self._pool.acquire() as con, con.transaction():
            await con.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await con.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            await con.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r["version"] for r in await con.fetch("SELECT version FROM schema_migrations")}
            for version, sql in migrations():
                if version not in done:
                    await con.execute(sql)
                    await con.execute(
                        "INSERT INTO schema_migrations (version) VALUES ($1)", version
                    )
                    applied.append(version)
        return applied

    async def close(self) -> None:
        await self._pool.close()

    async def drop_schema(self, schema: str) -> None:
        """Drop a schema and everything in it (benchmarks and tests clean up their own)."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema) or schema == "public":
            raise ValueError("refusing to drop that schema")
        async with self._pool.acquire() as con:
            await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    async def vacuum_analyze(self) -> None:
        """VACUUM ANALYZE the memories table: after a bulk load, so that the planner has
        statistics and autovacuum has nothing left to do in the middle of later work."""
        try:
            async with self._pool.acquire() as con:
                await con.execute("VACUUM ANALYZE memories")
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc

    async def checkpoint(self) -> bool:
        """CHECKPOINT: after a bulk load, the writes reach the disk now rather than during
        later work. False when the role may not (superuser or pg_checkpoint only)."""
        try:
            async with self._pool.acquire() as con:
                await con.execute("CHECKPOINT")
        except asyncpg.InsufficientPrivilegeError:
            return False
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc
        return True

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return list(await self._pool.fetch(sql, *args))
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc
        except _PERMANENT as exc:
            raise _rejected(exc) from exc

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Any]:
        """A pooled connection inside a transaction, driver errors translated here."""
        try:
            async with self._pool.acquire() as con, con.transaction():
                yield con
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc
        except _PERMANENT as exc:
            raise _rejected(exc) from exc

    async def ping(self) -> None:
        """One round trip (health checks); raises StorageUnavailable when it fails."""
        await self._fetch("SELECT 1")

    async def existing(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """The (tenant, memory id) pairs among ``keys`` that are live memories: ``exists``
        for a batch, in one statement."""
        if not keys:
            return set()
        rows = await self._fetch(
            "SELECT m.tenant, m.id::text AS id FROM memories m JOIN unnest($1::text[], "
            "$2::uuid[]) AS q(tenant, id) ON m.id = q.id AND m.tenant = q.tenant "
            "WHERE m.deleted_at IS NULL",
            [t for t, _ in keys],
            [uuid.UUID(mid) for _, mid in keys],
        )
        return {(r["tenant"], r["id"]) for r in rows}

    async def memory_off_among(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> set[tuple[str, str, str]]:
        """The (tenant, owner key, session) triples among ``keys`` whose memory is off:
        ``is_memory_off`` for a batch, in one statement."""
        if not keys:
            return set()
        rows = await self._fetch(
            "SELECT o.tenant, o.owner_key, o.session FROM memory_off o JOIN unnest($1::text[], "
            "$2::text[], $3::text[]) AS q(tenant, owner_key, session) ON o.tenant = q.tenant "
            "AND o.owner_key = q.owner_key AND o.session = q.session",
            [k[0] for k in keys],
            [k[1] for k in keys],
            [k[2] for k in keys],
        )
        return {(r["tenant"], r["owner_key"], r["session"]) for r in rows}

    async def memories_by_id(self, keys: Sequence[tuple[str, str]]) -> dict[str, MemoryRecord]:
        """Live memories among (tenant, memory id) pairs of any tenants, in one statement
        (``get_many`` without an owner filter: the store stage reads back what it wrote)."""
        if not keys:
            return {}
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE (tenant, id) IN "
            "(SELECT * FROM unnest($1::text[], $2::uuid[])) AND deleted_at IS NULL "
            "AND superseded_by IS NULL AND (expires_at IS NULL OR pinned OR expires_at > $3) "
            "AND (valid_to IS NULL OR valid_to > $3) AND (valid_from IS NULL OR valid_from <= $3)",
            [t for t, _ in keys],
            [uuid.UUID(mid) for _, mid in keys],
            self.clock(),
        )
        return {str(r["id"]): _record(r) for r in rows}

    async def exists(self, tenant: str, memory_id: str) -> bool:
        rows = await self._fetch(
            "SELECT 1 FROM memories WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL",
            memory_id,
            tenant,
        )
        return bool(rows)

    async def upsert(self, memory_id: str, content_hash: str, c: Candidate) -> bool:
        """Insert the memory, or merge the candidate's source event into it.

        Returns True when a row was inserted. Replaying the same candidate is a
        no-op: the source event id is already recorded.
        """
        return (await self.upsert_many([(memory_id, content_hash, c)]))[0]

    async def upsert_many(self, rows: Sequence[tuple[str, str, Candidate]]) -> list[bool]:
        """``upsert`` for many candidates in one transaction and one round trip per statement
        kind (the statements are pipelined): True per row that was inserted. Rows run in
        order, so a memory id listed twice is inserted by the first and merged by the second.
        """
        if not rows:
            return []
        sql = """
        INSERT INTO memories (id, tenant, user_id, agent_id, app, project, session, scope, type,
            content, content_hash, salience, confidence, importance, source_event_ids, metadata,
            redactions, occurred_at, pinned, expires_at, fact_key, created_at, updated_at, tags)
        VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,ARRAY[$15::text],$16::jsonb,
                $17::jsonb,$18,$19,$20,$21,$22,$22,$23::text[])
        ON CONFLICT (id) DO UPDATE SET
            source_event_ids = CASE WHEN $15 = ANY(memories.source_event_ids)
                THEN memories.source_event_ids ELSE memories.source_event_ids || $15::text END,
            deleted_at = CASE WHEN $15 = ANY(memories.source_event_ids)
                THEN memories.deleted_at ELSE NULL END,
            updated_at = CASE WHEN $15 = ANY(memories.source_event_ids)
                THEN memories.updated_at ELSE $22 END,
            indexed = CASE WHEN $15 = ANY(memories.source_event_ids)
                THEN memories.indexed ELSE false END  -- the index record lists the sources
        RETURNING (xmax = 0) AS inserted
        """
        now = self.clock()
        args = [_upsert_args(mid, chash, c, now) for mid, chash, c in rows]
        try:
            async with self._transaction() as con:
                found = await con.fetchmany(sql, args)
                inserted = [bool(r["inserted"]) for r in found]
                await self._events(
                    con,
                    [
                        (
                            c.owner.tenant,
                            mid,
                            "stored" if new else "merged",
                            c.source_event_id,
                            {
                                "source_event_id": c.source_event_id,
                                "type": c.type.value,
                                "redactions": c.redactions,
                            },
                        )
                        for (mid, _, c), new in zip(rows, inserted, strict=True)
                    ],
                )
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc
        return inserted

    async def _events(
        self,
        con: Any,
        events: Sequence[tuple[str, str | None, str, str, dict[str, Any]]],
        keys: Sequence[str | None] = (),
    ) -> None:
        """``_event`` for many audit rows (tenant, memory id, kind, cause, detail), pipelined;
        ``keys``, when given, one per row, as ``_event``'s ``key``."""
        now = self.clock()
        keyed = list(keys) or [None] * len(events)
        await con.executemany(
            "INSERT INTO memory_events (event_key, tenant, memory_id, kind, at, detail) "
            "VALUES ($1, $2, $3, $4, $5, $6::jsonb) ON CONFLICT (event_key) DO NOTHING",
            [
                (key or f"{kind}:{mid or '-'}:{cause}", tenant, mid, kind, now, json.dumps(detail))
                for (tenant, mid, kind, cause, detail), key in zip(events, keyed, strict=True)
            ],
        )

    async def _event(
        self,
        con: Any,
        tenant: str,
        memory_id: str | None,
        kind: str,
        cause: str,
        detail: dict[str, Any],
        key: str | None = None,
    ) -> None:
        """Append one audit row; the key (by default kind, memory and cause) makes a replayed
        operation record nothing new."""
        await con.execute(
            "INSERT INTO memory_events (event_key, tenant, memory_id, kind, at, detail) "
            "VALUES ($1, $2, $3, $4, $5, $6::jsonb) ON CONFLICT (event_key) DO NOTHING",
            key or f"{kind}:{memory_id or '-'}:{cause}",
            tenant,
            memory_id,
            kind,
            self.clock(),
            json.dumps(detail),
        )

    async def record_event(
        self,
        tenant: str,
        memory_id: str | None,
        kind: str,
        cause: str,
        detail: dict[str, Any] | None = None,
    ) -> None:
        try:
            async with self._pool.acquire() as con:
                await self._event(con, tenant, memory_id, kind, cause, detail or {})
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc
        except _PERMANENT as exc:
            raise _rejected(exc) from exc

    async def events_for(self, tenant: str, memory_id: str | None = None) -> list[dict[str, Any]]:
        """The audit trail of one memory (or a tenant), oldest first."""
        if memory_id is None:
            rows = await self._fetch(
                "SELECT memory_id, kind, at, detail FROM memory_events "
                "WHERE tenant = $1 ORDER BY seq",
                tenant,
            )
        else:
            rows = await self._fetch(
                "SELECT memory_id, kind, at, detail FROM memory_events "
                "WHERE tenant = $1 AND memory_id = $2 ORDER BY seq",
                tenant,
                memory_id,
            )
        return [
            {
                "memory_id": str(r["memory_id"]) if r["memory_id"] else None,
                "kind": r["kind"],
                "at": r["at"],
                "detail": json.loads(r["detail"]),
            }
            for r in rows
        ]

    async def bulk_insert(self, rows: Sequence[tuple[str, str, Candidate]]) -> None:
        """Load many memories at once (benchmarks, imports): COPY, no audit rows, indexed."""
        records = [
            (
                uuid.UUID(mid),
                c.owner.tenant,
                c.owner.user,
                c.owner.agent,
                c.session,
                c.scope.value,
                c.type.value,
                c.content,
                chash,
                [c.source_event_id],
                json.dumps(c.metadata),
                c.occurred_at,
                True,
            )
            for mid, chash, c in rows
        ]
        async with self._pool.acquire() as con:
            await con.copy_records_to_table(
                "memories",
                records=records,
                columns=[
                    "id",
                    "tenant",
                    "user_id",
                    "agent_id",
                    "session",
                    "scope",
                    "type",
                    "content",
                    "content_hash",
                    "source_event_ids",
                    "metadata",
                    "occurred_at",
                    "indexed",
                ],
            )

    async def merge_many(self, merges: Sequence[tuple[str, str, str, str]]) -> list[bool]:
        """``merge`` for many (tenant, memory id, source event id, candidate id), in one
        transaction, the statements pipelined and run in order: True for each that found its
        live memory. Each fold is recorded under its candidate id, as ``merge`` does."""
        if not merges:
            return []
        async with self._transaction() as con:
            rows = await con.fetchmany(
                "UPDATE memories SET source_event_ids = CASE WHEN $3 = ANY(source_event_ids) "
                "THEN source_event_ids ELSE source_event_ids || $3::text END, updated_at = $4, "
                "indexed = false "
                "WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL RETURNING $5::int AS i",
                [
                    (mid, tenant, src, self.clock(), i)
                    for i, (tenant, mid, src, _) in enumerate(merges)
                ],
            )
            done = {r["i"] for r in rows}
            folds = [m for i, m in enumerate(merges) if i in done]
            await self._events(
                con,
                [
                    (tenant, mid, "merged", src, {"source_event_id": src, "near_duplicate": True})
                    for tenant, mid, src, _ in folds
                ],
                [_fold_key(cid) for *_, cid in folds],
            )
        return [i in done for i in range(len(merges))]

    async def merge(
        self, tenant: str, memory_id: str, source_event_id: str, candidate_id: str | None = None
    ) -> bool:
        """Fold a near-duplicate's source event into an existing live memory. With
        ``candidate_id`` the fold is recorded under it, in the same transaction, so that a
        redelivered candidate finds where it went (``folded_into``) instead of deciding again:
        the near-duplicate check depends on the index, which may be away on the next try."""
        async with self._transaction() as con:
            row = await con.fetchrow(
                "UPDATE memories SET source_event_ids = CASE WHEN $3 = ANY(source_event_ids) "
                "THEN source_event_ids ELSE source_event_ids || $3::text END, updated_at = $4, "
                "indexed = false "
                "WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL RETURNING id",
                memory_id,
                tenant,
                source_event_id,
                self.clock(),
            )
            if row is None:
                return False
            await self._event(
                con,
                tenant,
                memory_id,
                "merged",
                source_event_id,
                {"source_event_id": source_event_id, "near_duplicate": True},
                key=_fold_key(candidate_id) if candidate_id else None,
            )
        return True

    async def folded_into(self, tenant: str, candidate_id: str) -> str | None:
        """The memory a near-duplicate candidate was folded into (``merge``), or None."""
        rows = await self._fetch(
            "SELECT memory_id::text AS id FROM memory_events WHERE event_key = $1 AND tenant = $2",
            _fold_key(candidate_id),
            tenant,
        )
        return str(rows[0]["id"]) if rows else None

    async def folded_among(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """``folded_into`` for many (tenant, candidate id), in one read: the folded ones only."""
        if not pairs:
            return {}
        rows = await self._fetch(
            "SELECT e.tenant, e.event_key, e.memory_id::text AS id FROM memory_events e "
            "JOIN unnest($1::text[], $2::text[]) AS p(tenant, key) "
            "ON e.event_key = p.key AND e.tenant = p.tenant",
            [t for t, _ in pairs],
            [_fold_key(c) for _, c in pairs],
        )
        by_key = {(str(r["tenant"]), str(r["event_key"])): str(r["id"]) for r in rows}
        return {(t, c): by_key[(t, _fold_key(c))] for t, c in pairs if (t, _fold_key(c)) in by_key}

    async def session_contexts(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> dict[str, list[str]]:
        """The contents of the ``turns`` episodes right before each memory in its session (by
        occurrence, then arrival, then id; oldest first), in one statement: the earlier-turn
        context of the keyword leg. Memory id -> contents; memories without earlier episodes
        are absent. One statement for the batch, not one per memory."""
        # once per memory: a memory listed twice would get its context twice
        memories = list({str(uuid.UUID(m.id)): m for m in memories}.values())
        if not memories:
            return {}
        rows = await self._fetch(
            "SELECT q.id::text AS of, c.content FROM unnest($1::text[], $2::text[], $3::text[], "
            "$4::text[], $5::timestamptz[], $6::timestamptz[], $7::uuid[]) "
            "AS q(tenant, session, user_id, agent_id, occurred_at, created_at, id) "
            "CROSS JOIN LATERAL (SELECT m.content, m.occurred_at, m.created_at, m.id "
            "FROM memories m WHERE m.tenant = q.tenant AND m.session = q.session "
            "AND m.type = 'episode' AND m.user_id IS NOT DISTINCT FROM q.user_id "
            "AND m.agent_id IS NOT DISTINCT FROM q.agent_id "
            "AND (m.occurred_at, m.created_at, m.id) < (q.occurred_at, q.created_at, q.id) "
            "AND m.deleted_at IS NULL "
            "ORDER BY m.occurred_at DESC, m.created_at DESC, m.id DESC LIMIT $8) c "
            "ORDER BY q.id, c.occurred_at, c.created_at, c.id",
            [m.tenant for m in memories],
            [m.session for m in memories],
            [m.user for m in memories],
            [m.agent for m in memories],
            [m.occurred_at for m in memories],
            [m.created_at for m in memories],
            [uuid.UUID(m.id) for m in memories],
            turns,
        )
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r["of"], []).append(r["content"])
        return out

    async def session_followers(self, m: MemoryRecord, turns: int = 2) -> list[MemoryRecord]:
        """The episodes right after ``m`` in its session: their context includes ``m``, so
        they are re-indexed when ``m`` arrives late (stages may reorder turns)."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE tenant = $1 AND session = $2 "
            "AND type = 'episode' AND user_id IS NOT DISTINCT FROM $3 "
            "AND agent_id IS NOT DISTINCT FROM $4 AND (occurred_at, created_at, id) > ($5, $6, $7) "
            "AND deleted_at IS NULL ORDER BY occurred_at, created_at, id LIMIT $8",
            m.tenant,
            m.session,
            m.user,
            m.agent,
            m.occurred_at,
            m.created_at,
            uuid.UUID(m.id),
            turns,
        )
        return [_record(r) for r in rows]

    async def session_followers_many(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> list[MemoryRecord]:
        """``session_followers`` of every memory, in one statement (each follower once)."""
        memories = list({str(uuid.UUID(m.id)): m for m in memories}.values())
        if not memories:
            return []
        cols = ", ".join(f"f.{c.strip()}" for c in _COLUMNS.split(","))
        rows = await self._fetch(
            f"SELECT DISTINCT ON (f.id) {cols} FROM unnest($1::text[], $2::text[], "
            "$3::text[], $4::text[], $5::timestamptz[], $6::timestamptz[], $7::uuid[]) "
            "AS q(tenant, session, user_id, agent_id, occurred_at, created_at, id) "
            "CROSS JOIN LATERAL (SELECT * FROM memories m WHERE m.tenant = q.tenant "
            "AND m.session = q.session AND m.type = 'episode' "
            "AND m.user_id IS NOT DISTINCT FROM q.user_id "
            "AND m.agent_id IS NOT DISTINCT FROM q.agent_id "
            "AND (m.occurred_at, m.created_at, m.id) > (q.occurred_at, q.created_at, q.id) "
            "AND m.deleted_at IS NULL "
            "ORDER BY m.occurred_at, m.created_at, m.id LIMIT $8) f ORDER BY f.id",
            [m.tenant for m in memories],
            [m.session for m in memories],
            [m.user for m in memories],
            [m.agent for m in memories],
            [m.occurred_at for m in memories],
            [m.created_at for m in memories],
            [uuid.UUID(m.id) for m in memories],
            turns,
        )
        return [_record(r) for r in rows]

    async def mark_indexed(self, ids: Sequence[str]) -> None:
        await self._fetch(
            "UPDATE memories SET indexed = true WHERE id = ANY($1::uuid[])", list(ids)
        )

    async def unindexed(self, limit: int = 256) -> list[MemoryRecord]:
        """Live memories not yet in the vector index (Qdrant was down when stored)."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE NOT indexed AND deleted_at IS NULL "
            "ORDER BY created_at LIMIT $1",
            limit,
        )
        return [_record(r) for r in rows]

    async def keyword_search(
        self, flt: OwnerFilter, query: str, limit: int
    ) -> list[tuple[str, float]]:
        """(id, rank) by Postgres full-text ranking over an OR of the query words."""
        tsq = keyword_query(query)
        if not tsq:
            return []
        args: list[Any] = [tsq]
        where = _where(flt, args, self.clock())
        args.append(limit)
        rows = await self._fetch(
            f"SELECT id, ts_rank_cd(tsv, q) AS rank FROM memories, "
            f"to_tsquery('english', $1) q WHERE {where} AND tsv @@ q "
            f"ORDER BY rank DESC, id LIMIT ${len(args)}",
            *args,
        )
        return [(str(r["id"]), float(r["rank"])) for r in rows]

    async def get_many(self, flt: OwnerFilter, ids: Sequence[str]) -> dict[str, MemoryRecord]:
        """Live (not deleted, not expired, not superseded) memories among ``ids`` that
        match the filter: a hit from another tenant or owner can never pass."""
        if not ids:
            return {}
        args: list[Any] = [list(ids)]
        where = _where(flt, args, self.clock())
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE id = ANY($1::uuid[]) AND {where}", *args
        )
        return {str(r["id"]): _record(r) for r in rows}

    async def touch(self, tenant: str, counts: Mapping[str, int]) -> None:
        """Count accesses of memories (own recall only; peer reads never call this): one
        statement for a whole batch of recalls."""
        await self._fetch(
            "UPDATE memories m SET access_count = m.access_count + t.n, last_accessed_at = $4 "
            "FROM unnest($2::uuid[], $3::int[]) AS t(id, n) WHERE m.tenant = $1 AND m.id = t.id",
            tenant,
            list(counts),
            list(counts.values()),
            self.clock(),
        )

    async def list_memories(
        self, flt: OwnerFilter, limit: int = 100, offset: int = 0, live: bool = True
    ) -> list[MemoryRecord]:
        args: list[Any] = []
        where = _where(flt, args, self.clock(), live)
        args += [limit, offset]
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} ORDER BY occurred_at DESC, id "
            f"LIMIT ${len(args) - 1} OFFSET ${len(args)}",
            *args,
        )
        return [_record(r) for r in rows]

    async def count(self, tenant: str | None = None) -> int:
        if tenant is None:
            rows = await self._fetch("SELECT count(*) AS n FROM memories")
        else:
            rows = await self._fetch("SELECT count(*) AS n FROM memories WHERE tenant = $1", tenant)
        return int(rows[0]["n"])

    # --- management operations (mem.cmd.*) ------------------------------------------------

    async def get(self, flt: OwnerFilter, memory_id: str) -> MemoryRecord | None:
        """One memory of the caller's scope (superseded and expired included), or None."""
        args: list[Any] = [memory_id]
        where = _where(flt, args, self.clock(), live=False)
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE id = $1 AND {where}", *args
        )
        return _record(rows[0]) if rows else None

    async def set_pinned(
        self, flt: OwnerFilter, memory_id: str, pinned: bool
    ) -> MemoryRecord | None:
        """Pin (ranks first, never expires) or unpin; None when not the caller's memory."""
        args: list[Any] = [memory_id, pinned]
        where = _where(flt, args, self.clock(), live=False)
        async with self._transaction() as con:
            row = await con.fetchrow(
                f"UPDATE memories SET pinned = $2, updated_at = now() WHERE id = $1 AND {where} "
                f"RETURNING {_COLUMNS}",
                *args,
            )
            if row is None:
                return None
            kind = "pinned" if pinned else "unpinned"
            await self._event(con, flt.tenant, memory_id, kind, self.clock().isoformat(), {})
        return _record(row)

    async def update_content(
        self,
        flt: OwnerFilter,
        memory_id: str,
        content: str,
        content_hash: str,
        metadata: dict[str, Any] | None,
        redactions: dict[str, int],
    ) -> MemoryRecord | None:
        """New (redacted) text for one of the caller's live memories, same id; the caller
        rebuilds the index point (``indexed`` is reset). None when not the caller's.

        The row's hash becomes ``<hash>@<id>``: an edited memory keeps its id, which is no
        longer the one exact dedupe derives from its text, so it leaves the exact-dedupe key
        (a later turn with the same text is a memory of its own, or a near-duplicate merge)."""
        args: list[Any] = [memory_id, content, f"{content_hash}@{memory_id}"]
        args.append(json.dumps(redactions))
        meta_sql = ""
        if metadata is not None:
            args.append(json.dumps(metadata))
            meta_sql = f", metadata = ${len(args)}::jsonb"
        where = _where(flt, args, self.clock(), live=True)
        async with self._transaction() as con:
            row = await con.fetchrow(
                f"UPDATE memories SET content = $2, content_hash = $3, redactions = $4::jsonb,"
                f" indexed = false, updated_at = now(){meta_sql} WHERE id = $1 AND {where} "
                f"AND fact_key IS NULL RETURNING {_COLUMNS}",
                *args,
            )
            if row is None:
                return None
            await self._event(
                con,
                flt.tenant,
                memory_id,
                "updated",
                f"{content_hash}:{self.clock().isoformat()}",
                {"redactions": redactions},
            )
        return _record(row)

    async def tombstone(self, flt: OwnerFilter, memory_id: str) -> bool:
        """Forget one memory: tombstoned now, hidden from every read."""
        args: list[Any] = [memory_id, self.clock()]
        where = _where(flt, args, self.clock(), live=False)
        async with self._transaction() as con:
            row = await con.fetchrow(
                f"UPDATE memories SET deleted_at = $2, updated_at = $2 WHERE id = $1 AND {where} "
                "RETURNING id",
                *args,
            )
            if row is None:
                return False
            await _queue_vector_deletes(con, flt.tenant, [memory_id])
            await self._event(con, flt.tenant, memory_id, "forgotten", "tombstone", {})
        return True

    async def erase(self, flt: OwnerFilter) -> list[str]:
        """Erasure: delete every memory of the owner (or one session) for good.
        Returns the ids removed; one audit row records the erasure (no content)."""
        args: list[Any] = []
        where = _where(flt, args, self.clock(), live=False).replace("deleted_at IS NULL", "true")
        async with self._transaction() as con:
            rows = await con.fetch(f"DELETE FROM memories WHERE {where} RETURNING id", *args)
            ids = [str(r["id"]) for r in rows]
            await _queue_vector_deletes(con, flt.tenant, ids)
            await self._event(
                con,
                flt.tenant,
                None,
                "erased",
                self.clock().isoformat(),
                {
                    "user": flt.user,
                    "agent": flt.agent,
                    "session": flt.session,
                    "memories": len(ids),
                },
            )
        return ids

    async def current_fact(self, flt: OwnerFilter, key: str) -> MemoryRecord | None:
        args: list[Any] = [key]
        where = _where(flt, args, self.clock())
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE fact_key = $1 AND {where} "
            "ORDER BY valid_from DESC NULLS LAST LIMIT 1",
            *args,
        )
        return _record(rows[0]) if rows else None

    async def put_fact(
        self, memory_id: str, content_hash: str, c: Candidate, key: str, valid_from: datetime
    ) -> tuple[MemoryRecord | None, str]:
        """Insert a fact version valid from ``valid_from``; the version current until then is
        closed (valid_to, superseded_by) and its point queued for deletion. Returns (the closed
        version or None, the id of the current version). Putting the value the current
        version already holds changes nothing (a retried put): (None, its id). A value held
        by an earlier, closed version opens a new version (A, B, then A again)."""
        owner = OwnerFilter(tenant=c.owner.tenant, user=c.owner.user, agent=c.owner.agent)
        async with self._transaction() as con:
            args: list[Any] = [key, memory_id]
            where = _where(owner, args, self.clock(), live=False)
            old = await con.fetchrow(
                f"SELECT {_COLUMNS} FROM memories WHERE fact_key = $1 AND id <> $2 AND "
                f"superseded_by IS NULL AND valid_to IS NULL AND {where} FOR UPDATE",
                *args,
            )
            if old is not None and old["content_hash"] == content_hash:
                return None, str(old["id"])
            await con.execute(
                """INSERT INTO memories (id, tenant, user_id, agent_id, session, scope, type,
                    content, content_hash, source_event_ids, metadata, occurred_at, fact_key,
                    valid_from, created_at, updated_at, importance, confidence, project)
                VALUES ($1,$2,$3,$4,$5,$6,'fact',$7,$8,ARRAY[$9::text],$10::jsonb,$11,$12,$13,
                        $14,$14,$15,1.0,$16)
                ON CONFLICT (id) DO NOTHING""",
                memory_id,
                c.owner.tenant,
                c.owner.user,
                c.owner.agent,
                c.session,
                c.scope.value,
                c.content,
                content_hash,
                c.source_event_id,
                json.dumps(c.metadata),
                c.occurred_at,
                key,
                valid_from,
                self.clock(),
                c.importance,
                c.project,
            )
            if old is not None:
                await con.execute(
                    "UPDATE memories SET valid_to = $2, superseded_by = $3, updated_at = $4 "
                    "WHERE id = $1",
                    old["id"],
                    valid_from,
                    memory_id,
                    self.clock(),
                )
                await _queue_vector_deletes(con, c.owner.tenant, [str(old["id"])])
                await self._event(
                    con,
                    c.owner.tenant,
                    str(old["id"]),
                    "superseded",
                    memory_id,
                    {"by": memory_id, "fact_key": key},
                )
            await self._event(
                con,
                c.owner.tenant,
                memory_id,
                "fact_put",
                c.source_event_id,
                {"fact_key": key, "supersedes": str(old["id"]) if old else None},
            )
        return (_record(old) if old is not None else None), memory_id

    async def fact_history(self, flt: OwnerFilter, key: str) -> list[MemoryRecord]:
        """Every version of a fact, oldest first."""
        args: list[Any] = [key]
        where = _where(flt, args, self.clock(), live=False)
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE fact_key = $1 AND {where} "
            "ORDER BY valid_from NULLS FIRST, created_at",
            *args,
        )
        return [_record(r) for r in rows]

    async def pending_review(self, tenant: str, since: dict[str, datetime]) -> dict[str, int]:
        """Memories created per agent since each given time (``*``: every agent together)."""
        out: dict[str, int] = {}
        for agent, ts in since.items():
            if agent == "*":
                rows = await self._fetch(
                    "SELECT count(*) AS n FROM memories WHERE tenant = $1 "
                    "AND created_at >= $2 AND deleted_at IS NULL",
                    tenant,
                    ts,
                )
            else:
                rows = await self._fetch(
                    "SELECT count(*) AS n FROM memories WHERE tenant = $1 "
                    "AND agent_id = $2 AND created_at >= $3 "
                    "AND deleted_at IS NULL",
                    tenant,
                    agent,
                    ts,
                )
            out[agent] = int(rows[0]["n"])
        return out

    async def set_memory_off(self, tenant: str, owner_key: str, session: str, off: bool) -> None:
        if off:
            await self._fetch(
                "INSERT INTO memory_off (tenant, owner_key, session) VALUES "
                "($1, $2, $3) ON CONFLICT DO NOTHING",
                tenant,
                owner_key,
                session,
            )
        else:
            await self._fetch(
                "DELETE FROM memory_off WHERE tenant = $1 AND owner_key = $2 AND session = $3",
                tenant,
                owner_key,
                session,
            )

    async def is_memory_off(self, tenant: str, owner_key: str, session: str) -> bool:
        rows = await self._fetch(
            "SELECT 1 FROM memory_off WHERE tenant = $1 AND owner_key = $2 AND session = $3",
            tenant,
            owner_key,
            session,
        )
        return bool(rows)

    async def purge_expired(
        self, limit: int = 1000
    ) -> list[tuple[str, str, str | None, str | None]]:
        """Delete memories past expires_at (pinned ones never expire); returns
        (tenant, id, user, agent) of each removed."""
        async with self._transaction() as con:
            rows = await con.fetch(
                "DELETE FROM memories WHERE id IN (SELECT id FROM memories WHERE expires_at <= $1 "
                "AND NOT pinned LIMIT $2) RETURNING tenant, id, user_id, agent_id",
                self.clock(),
                limit,
            )
            for r in rows:
                await _queue_vector_deletes(con, r["tenant"], [str(r["id"])])
                await self._event(con, r["tenant"], str(r["id"]), "expired", "sweeper", {})
        return [(r["tenant"], str(r["id"]), r["user_id"], r["agent_id"]) for r in rows]

    async def pending_vector_deletes(self, limit: int = 1000) -> dict[str, list[str]]:
        """Points still to delete (queued with their memory's change), by tenant."""
        rows = await self._fetch(
            "SELECT tenant, memory_id FROM vector_deletes ORDER BY at LIMIT $1", limit
        )
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(r["tenant"], []).append(str(r["memory_id"]))
        return out

    async def vector_deletes_done(self, tenant: str, ids: Sequence[str]) -> None:
        """The points of ``ids`` are deleted: drop them from the queue. A memory among them
        that is live again (re-stored after it was forgotten) may have been indexed before
        the delete ran, so it is marked unindexed and the reconciler indexes it again."""
        async with self._transaction() as con:
            await con.execute(
                "DELETE FROM vector_deletes WHERE tenant = $1 AND memory_id = ANY($2::uuid[])",
                tenant,
                list(ids),
            )
            await con.execute(
                "UPDATE memories SET indexed = false WHERE tenant = $1 AND id = ANY($2::uuid[]) "
                "AND deleted_at IS NULL AND superseded_by IS NULL AND indexed",
                tenant,
                list(ids),
            )

    # --- tenant credentials ----------------------------------------------------------------

    async def create_api_key(
        self, tenant: str, name: str = "", user: str | None = None, agent: str | None = None
    ) -> str:
        """A new key for ``tenant`` (bound to ``user`` and/or ``agent`` when given); only its
        hash is stored, the key is returned once."""
        key = "msk_" + secrets.token_urlsafe(32)
        await self._fetch(
            "INSERT INTO api_keys (key_hash, tenant, name, owner_user, owner_agent) "
            "VALUES ($1, $2, $3, $4, $5)",
            hash_key(key),
            tenant,
            name,
            user,
            agent,
        )
        return key

    async def identity_of_key(self, key: str) -> tuple[str, str | None, str | None] | None:
        """(tenant, user, agent) a live key is bound to (user/agent None: any), or None."""
        rows = await self._fetch(
            "SELECT tenant, owner_user, owner_agent FROM api_keys "
            "WHERE key_hash = $1 AND revoked_at IS NULL",
            hash_key(key),
        )
        if not rows:
            return None
        return str(rows[0]["tenant"]), rows[0]["owner_user"], rows[0]["owner_agent"]

    async def revoke_api_key(self, key: str) -> bool:
        rows = await self._fetch(
            "UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 "
            "AND revoked_at IS NULL RETURNING tenant",
            hash_key(key),
        )
        return bool(rows)

    async def tenant_of_key(self, key: str) -> str | None:
        """The tenant a live key belongs to, or None."""
        rows = await self._fetch(
            "SELECT tenant FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", hash_key(key)
        )
        return str(rows[0]["tenant"]) if rows else None


def hash_key(key: str) -> str:
    """sha256 of an API key (keys are 256-bit random: no salt or slow hash needed)."""
    return hashlib.sha256(key.encode()).hexdigest()

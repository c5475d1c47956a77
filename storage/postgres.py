"""Postgres adapter (asyncpg): the record of truth.

Every write is idempotent: memory ids are deterministic, inserts use
``ON CONFLICT``, audit rows carry a unique ``event_key``. Driver errors are
translated here, once: connection failures become ``StorageUnavailable``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import asyncpg

from memstream.schemas.errors import StorageUnavailable
from memstream.schemas.memory import Candidate, MemoryRecord, MemoryType, Scope

_MIGRATION_LOCK = 0x6D656D73  # "mems"
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_TRANSIENT = (
    OSError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.InterfaceError,
    TimeoutError,
)


@dataclass(frozen=True, slots=True)
class OwnerFilter:
    """Tenant always; user/agent/session narrow when set."""

    tenant: str
    user: str | None = None
    agent: str | None = None
    session: str | None = None
    types: Sequence[MemoryType] = ()
    scopes: Sequence[Scope] = ()


def migrations() -> list[tuple[int, str]]:
    """(version, sql) of every packaged migration, in order."""
    folder = resources.files("memstream.storage") / "migrations"
    out = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            out.append((int(entry.name.split("_", 1)[0]), entry.read_text("utf-8")))
    return sorted(out)


def _where(flt: OwnerFilter, args: list[Any]) -> str:
    """SQL conditions for a filter; appends the bind values to ``args``."""
    args.append(flt.tenant)
    parts = [f"tenant = ${len(args)}", "deleted_at IS NULL", "superseded_by IS NULL",
             "(expires_at IS NULL OR expires_at > now())"]
    for column, value in (("user_id", flt.user), ("agent_id", flt.agent), ("session", flt.session)):
        if value is not None:
            args.append(value)
            parts.append(f"{column} = ${len(args)}")
    if flt.types:
        args.append([t.value for t in flt.types])
        parts.append(f"type = ANY(${len(args)}::text[])")
    if flt.scopes:
        args.append([s.value for s in flt.scopes])
        parts.append(f"scope = ANY(${len(args)}::text[])")
    return " AND ".join(parts)


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
    )


_COLUMNS = (
    "id, tenant, user_id, agent_id, app, project, session, scope, type, content, content_hash, "
    "salience, confidence, importance, pinned, access_count, source_event_ids, metadata, "
    "occurred_at, created_at, updated_at, expires_at, deleted_at, indexed"
)


class PgStore:
    """Memories and their audit trail in one Postgres schema."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, dsn: str, schema: str = "public", min_size: int = 1,
                      max_size: int = 10) -> PgStore:
        """Open a pool whose connections use ``schema`` and apply pending migrations."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
            raise ValueError("schema must be a lower-case SQL identifier")
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size,
                server_settings={"search_path": schema, "application_name": "memstream"},
            )
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres is not reachable") from exc
        store = cls(pool)
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
                    await con.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
                    applied.append(version)
        return applied

    async def close(self) -> None:
        await self._pool.close()

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return list(await self._pool.fetch(sql, *args))
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc

    async def exists(self, tenant: str, memory_id: str) -> bool:
        rows = await self._fetch(
            "SELECT 1 FROM memories WHERE id = $1 AND tenant = $2 AND deleted_at IS NULL",
            memory_id, tenant,
        )
        return bool(rows)

    async def upsert(self, memory_id: str, content_hash: str, c: Candidate) -> bool:
        """Insert the memory, or merge the candidate's source event into it.

        Returns True when a row was inserted. Replaying the same candidate is a
        no-op: the source event id is already recorded.
        """
        sql = """
        INSERT INTO memories (id, tenant, user_id, agent_id, app, project, session, scope, type,
            content, content_hash, salience, confidence, importance, source_event_ids, metadata,
            redactions, occurred_at)
        VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,ARRAY[$15::text],$16::jsonb,
                $17::jsonb,$18)
        ON CONFLICT (id) DO UPDATE SET
            source_event_ids = CASE WHEN $15 = ANY(memories.source_event_ids)
                THEN memories.source_event_ids ELSE memories.source_event_ids || $15::text END,
            deleted_at = CASE WHEN $15 = ANY(memories.source_event_ids)
                THEN memories.deleted_at ELSE NULL END,
            updated_at = CASE WHEN $15 = ANY(memories.source_event_ids)
                THEN memories.updated_at ELSE now() END
        RETURNING (xmax = 0) AS inserted
        """
        args = (
            memory_id, c.owner.tenant, c.owner.user, c.owner.agent, c.app, c.project, c.session,
            c.scope.value, c.type.value, c.content, content_hash, c.salience, c.confidence,
            c.importance, c.source_event_id, json.dumps(c.metadata), json.dumps(c.redactions),
            c.occurred_at,
        )
        try:
            async with self._pool.acquire() as con, con.transaction():
                inserted: bool = await con.fetchval(sql, *args)
                kind = "stored" if inserted else "merged"
                await con.execute(
                    "INSERT INTO memory_events (event_key, tenant, memory_id, kind, detail) "
                    "VALUES ($1, $2, $3, $4, $5::jsonb) ON CONFLICT (event_key) DO NOTHING",
                    f"{kind}:{memory_id}:{c.source_event_id}", c.owner.tenant, memory_id, kind,
                    json.dumps({"source_event_id": c.source_event_id, "type": c.type.value,
                                "redactions": c.redactions}),
                )
        except _TRANSIENT as exc:
            raise StorageUnavailable("postgres did not answer") from exc
        return inserted

    async def mark_indexed(self, ids: Sequence[str]) -> None:
        await self._fetch("UPDATE memories SET indexed = true WHERE id = ANY($1::uuid[])", list(ids))

    async def unindexed(self, limit: int = 256) -> list[MemoryRecord]:
        """Live memories not yet in the vector index (Qdrant was down when stored)."""
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE NOT indexed AND deleted_at IS NULL "
            "ORDER BY created_at LIMIT $1", limit,
        )
        return [_record(r) for r in rows]

    async def keyword_search(self, flt: OwnerFilter, query: str, limit: int
                             ) -> list[tuple[str, float]]:
        """(id, rank) by Postgres full-text ranking over an OR of the query words."""
        tsq = keyword_query(query)
        if not tsq:
            return []
        args: list[Any] = [tsq]
        where = _where(flt, args)
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
        where = _where(flt, args)
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE id = ANY($1::uuid[]) AND {where}", *args
        )
        return {str(r["id"]): _record(r) for r in rows}

    async def touch(self, tenant: str, ids: Sequence[str], at: datetime | None = None) -> None:
        """Count an access of each memory (own recall only)."""
        await self._fetch(
            "UPDATE memories SET access_count = access_count + 1, "
            "last_accessed_at = coalesce($3, now()) WHERE tenant = $1 AND id = ANY($2::uuid[])",
            tenant, list(ids), at,
        )

    async def list_memories(self, flt: OwnerFilter, limit: int = 100, offset: int = 0
                            ) -> list[MemoryRecord]:
        args: list[Any] = []
        where = _where(flt, args)
        args += [limit, offset]
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} ORDER BY occurred_at DESC, id "
            f"LIMIT ${len(args) - 1} OFFSET ${len(args)}", *args,
        )
        return [_record(r) for r in rows]

    async def count(self, tenant: str | None = None) -> int:
        if tenant is None:
            rows = await self._fetch("SELECT count(*) AS n FROM memories")
        else:
            rows = await self._fetch("SELECT count(*) AS n FROM memories WHERE tenant = $1", tenant)
        return int(rows[0]["n"])

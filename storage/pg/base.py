"""The pool every Postgres group shares: connecting, migrations, housekeeping, the
driver-error translation around each statement and the one audit-row insert."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self, TypeVar

import asyncpg

from memstream.schemas.errors import StorageConflict, StorageUnavailable
from memstream.storage.pg.sql import (
    _MIGRATION_LOCK,
    _PERMANENT,
    _TRANSIENT,
    Clock,
    _rejected,
    migrations,
    utcnow,
)
from memstream.storage.pgpool import GuardedPool, unavailable

T = TypeVar("T")


class PgBase:
    """One pool and clock; the statement groups (storage/pg/*) build on it."""

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
    ) -> Self:
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
            raise unavailable(exc) from exc

    async def checkpoint(self) -> bool:
        """CHECKPOINT: after a bulk load, the writes reach the disk now rather than during
        later work. False when the role may not (superuser or pg_checkpoint only)."""
        try:
            async with self._pool.acquire() as con:
                await con.execute("CHECKPOINT")
        except asyncpg.InsufficientPrivilegeError:
            return False
        except _TRANSIENT as exc:
            raise unavailable(exc) from exc
        return True

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        try:
            return list(await self._pool.fetch(sql, *args))
        except _TRANSIENT as exc:
            raise unavailable(exc) from exc
        except _PERMANENT as exc:
            raise _rejected(exc) from exc

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Any]:
        """A pooled connection inside a transaction, driver errors translated here."""
        try:
            async with self._pool.acquire() as con, con.transaction():
                yield con
        except _TRANSIENT as exc:
            raise unavailable(exc) from exc
        except _PERMANENT as exc:
            raise _rejected(exc) from exc

    async def _in_transaction(self, body: Callable[[Any], Awaitable[T]]) -> T:
        """``body(con)`` in a transaction, run once more if PostgreSQL cancelled it to break
        a deadlock (``StorageConflict``): its writes were rolled back, so the second run is
        the one that counts. For a command's write over many rows, which can lock them in
        another order than the store stage's batch."""
        try:
            async with self._transaction() as con:
                return await body(con)
        except StorageConflict:
            async with self._transaction() as con:
                return await body(con)

    async def ping(self) -> None:
        """One round trip (health checks); raises StorageUnavailable when it fails."""
        await self._fetch("SELECT 1")

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

    async def count(self, tenant: str | None = None) -> int:
        """Memories stored, of one tenant or of all (tombstoned ones included)."""
        if tenant is None:
            rows = await self._fetch("SELECT count(*) AS n FROM memories")
        else:
            rows = await self._fetch("SELECT count(*) AS n FROM memories WHERE tenant = $1", tenant)
        return int(rows[0]["n"])

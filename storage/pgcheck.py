"""Read-only looks at the Postgres record of truth, for ``memstream doctor``, and the one
write ``memstream reindex`` needs.

Unlike ``PgStore.connect`` nothing here applies migrations: the doctor reports what is
missing instead of fixing it behind the operator's back. Connection failures raise
``StorageUnavailable`` naming the exception type only (a driver message may quote the DSN).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from memstream.schemas.errors import StorageUnavailable
from memstream.storage.pgpool import OUTAGE
from memstream.storage.postgres import migrations

__all__ = ["PgReport", "inspect", "mark_all_unindexed"]

CONNECT_TIMEOUT_S = 5.0
# a memory whose point belongs in the index: live, current, and marked indexed
_INDEXABLE = "deleted_at IS NULL AND superseded_by IS NULL"


@dataclass(frozen=True)
class PgReport:
    applied: tuple[int, ...]  # versions recorded in schema_migrations
    packaged: tuple[int, ...]  # versions this memstream ships
    server_now: datetime  # now() on the server
    local_at_midpoint: float  # the local clock (epoch s) half-way through that round trip
    round_trip_s: float
    indexed: int  # live memories marked indexed: the points the index should hold
    unindexed: int  # live memories waiting for the reconciler
    pending_deletes: int  # points queued for deletion (vector_deletes)

    @property
    def missing(self) -> tuple[int, ...]:
        return tuple(v for v in self.packaged if v not in self.applied)

    @property
    def unknown(self) -> tuple[int, ...]:
        """Versions in the database that this memstream does not ship (a newer release)."""
        return tuple(v for v in self.applied if v not in self.packaged)

    @property
    def skew_s(self) -> float:
        """Server clock minus local clock, in seconds."""
        return self.server_now.timestamp() - self.local_at_midpoint


def _schema(schema: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        raise ValueError("schema must be a lower-case SQL identifier")
    return schema


async def _connect(dsn: str, schema: str) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(
            dsn,
            timeout=CONNECT_TIMEOUT_S,
            server_settings={"search_path": _schema(schema), "application_name": "memstream"},
        )
    except (*OUTAGE, asyncpg.PostgresError) as exc:
        raise StorageUnavailable(f"postgres is not reachable ({type(exc).__name__})") from None


async def inspect(dsn: str, schema: str = "public") -> PgReport:
    """Migrations, the server's clock and the index bookkeeping, in one connection."""
    con = await _connect(dsn, schema)
    try:
        before = time.time()
        server_now = await con.fetchval("SELECT now()")
        after = time.time()
        has_table = await con.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
        applied: list[int] = []
        if has_table:
            applied = [
                r["version"] for r in await con.fetch("SELECT version FROM schema_migrations")
            ]
        indexed = unindexed = pending = 0
        if await con.fetchval("SELECT to_regclass('memories') IS NOT NULL"):
            row = await con.fetchrow(
                f"SELECT count(*) FILTER (WHERE indexed) AS indexed, "
                f"count(*) FILTER (WHERE NOT indexed) AS unindexed "
                f"FROM memories WHERE {_INDEXABLE}"
            )
            indexed, unindexed = int(row["indexed"]), int(row["unindexed"])
        if await con.fetchval("SELECT to_regclass('vector_deletes') IS NOT NULL"):
            pending = int(await con.fetchval("SELECT count(*) FROM vector_deletes"))
    except (*OUTAGE, asyncpg.PostgresError) as exc:
        raise StorageUnavailable(f"postgres failed ({type(exc).__name__})") from None
    finally:
        await con.close()
    return PgReport(
        applied=tuple(sorted(applied)),
        packaged=tuple(v for v, _ in migrations()),
        server_now=server_now,
        local_at_midpoint=(before + after) / 2,
        round_trip_s=after - before,
        indexed=indexed,
        unindexed=unindexed,
        pending_deletes=pending,
    )


async def mark_all_unindexed(dsn: str, schema: str = "public") -> int:
    """Mark every live memory as not indexed, so the workers' reconciler (or ``memstream
    reindex --now``) writes its point again from the Postgres row. Returns how many."""
    con = await _connect(dsn, schema)
    try:
        status = await con.execute(f"UPDATE memories SET indexed = false WHERE {_INDEXABLE}")
    except (*OUTAGE, asyncpg.PostgresError) as exc:
        raise StorageUnavailable(f"postgres failed ({type(exc).__name__})") from None
    finally:
        await con.close()
    return int(status.split()[-1])

"""PostgreSQL's statements by execution time over a benchmark run (pg_stat_statements): which
of the pipeline's statements the database spends its time on. The server the benchmark
starts for its worker processes preloads the extension with tracking off in its
postgresql.conf (``EmbeddedPostgres.start(statements=True)``); a run switches it on for every
session with ALTER SYSTEM (the workers' pools included), reads the totals after, and resets
it to the file's setting. Another server must preload it itself.

Execution time is not the server's CPU: it leaves out parsing, commits and the background
processes, and includes waits. docs/benchmarks.md ("fifteenth session") has a change that cut
the statements' time by a tenth and cost the server more CPU; compare CPU side by side.
"""

from __future__ import annotations

import contextlib
import re
from types import TracebackType
from typing import Any

import asyncpg

# the statement's text as reported: whitespace collapsed, cut at this many characters
TEXT_CHARS = 90


async def start(dsn: str) -> str | None:
    """Count statements from now on (every session of the server, the totals reset); None
    when counting started, else why it cannot (a server without the extension preloaded, a
    role that may not change the setting)."""
    con = await asyncpg.connect(dsn)
    try:
        preloaded = await con.fetchval("SELECT current_setting('shared_preload_libraries')")
        if "pg_stat_statements" not in preloaded:
            return f"the server does not preload pg_stat_statements ({preloaded or 'nothing'})"
        await con.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await con.execute("ALTER SYSTEM SET pg_stat_statements.track = 'top'")
        await con.execute("SELECT pg_reload_conf()")
        await con.execute("SELECT pg_stat_statements_reset()")
    except asyncpg.PostgresError as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        await con.close()
    return None


class Counting:
    """``async with Counting(dsn, limit) as counting: ... await counting.report()``: the
    statements counted between the two, as the benchmark's ``pg_statements`` field (None when
    ``limit`` is 0, nothing counted). A run that fails in between still turns counting off
    again, so that no server is left counting by a benchmark that never read it."""

    def __init__(self, dsn: str, limit: int) -> None:
        self.dsn, self.limit = dsn, limit
        self._why: str | None = None
        self._on = False

    async def __aenter__(self) -> Counting:
        if self.limit:
            self._why = await start(self.dsn)
            self._on = self._why is None
        return self

    async def report(self) -> dict[str, Any] | None:
        """The top statements since the start, or why there are none; counting off again."""
        if not self.limit:
            return None
        top: list[dict[str, Any]] = []
        if self._on:
            self._on = False
            top, self._why = await stop(self.dsn, self.limit)
        return {"unavailable": self._why, "top": top}

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._on:  # the run failed before its report: off again, the failure stands
            self._on = False
            with contextlib.suppress(asyncpg.PostgresError, OSError):
                await _reset(await asyncpg.connect(self.dsn))


async def stop(dsn: str, limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """The ``limit`` statements of this database that took the most execution time since
    ``start``, with each one's share of all of them, and None; counting off again. With the
    server gone or refusing, no statements and why (the run's other figures stand)."""
    try:
        return await _top(dsn, limit), None
    except (asyncpg.PostgresError, OSError) as exc:
        return [], f"{type(exc).__name__}: {exc}".splitlines()[0]


async def _top(dsn: str, limit: int) -> list[dict[str, Any]]:
    con = await asyncpg.connect(dsn)
    try:
        rows = await con.fetch(
            "SELECT query, calls, rows, total_exec_time AS ms, "
            "sum(total_exec_time) OVER () AS all_ms FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY total_exec_time DESC"
        )
    finally:
        await _reset(con)
    return [
        {
            "statement": re.sub(r"\s+", " ", r["query"]).strip()[:TEXT_CHARS],
            "calls": int(r["calls"]),
            "rows": int(r["rows"]),
            "ms": round(float(r["ms"]), 1),
            "share": round(float(r["ms"]) / float(r["all_ms"]), 3) if r["all_ms"] else 0.0,
        }
        for r in rows[:limit]
    ]


async def _reset(con: asyncpg.Connection) -> None:
    """Counting back to postgresql.conf's setting (off, on the benchmark's server); closes
    ``con``."""
    try:
        await con.execute("ALTER SYSTEM RESET pg_stat_statements.track")
        await con.execute("SELECT pg_reload_conf()")
    finally:
        await con.close()

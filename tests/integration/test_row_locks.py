"""Bookkeeping writes against a real PostgreSQL: the ``indexed`` marks and recall's access
counts never wait for a row another transaction holds (the store stage's, which upserts and
folds into memories), so neither can be half of a deadlock with it. PostgreSQL breaks one
only after ``deadlock_timeout`` (1 s), with both sides stalled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import asyncpg
import pytest

from memstream.pipeline import dedupe
from memstream.schemas.errors import StorageConflict, StorageUnavailable
from memstream.schemas.memory import Candidate, Owner
from memstream.storage.pg.sql import OwnerFilter
from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration


def _turn(i: int) -> Candidate:
    return Candidate(
        candidate_id=f"c{i}",
        owner=Owner(tenant="acme", user="bo"),
        session="s1",
        content=f"turn {i}: the deploy moved to Friday",
        source_event_id=f"e{i}",
        occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        redacted=True,
    )


async def _until_a_lock_wait(database_url: str) -> None:
    """Return once a backend of this database waits for a lock (watched from a connection of
    its own: a transaction reads pg_stat_activity once)."""
    watch = await asyncpg.connect(database_url)
    try:
        for _ in range(1000):  # 10 s at most
            if await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ):
                return
            await asyncio.sleep(0.01)
        raise TimeoutError("no backend waited for a lock within 10 s")
    finally:
        await watch.close()


_UPDATE = "UPDATE memories SET updated_at = now() WHERE id = $1"


@contextlib.asynccontextmanager
async def _second_held(
    pg: PgStore, database_url: str, namespace: str
) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.transaction.Transaction, str, str]]:
    """Two memories written, and another connection's open transaction holding the second
    (as a store batch holds a memory it folds a source into): the connection, its
    transaction, and the two ids. Updating the first on that connection closes a cycle with
    whoever holds the first and waits for the second."""
    keys = [dedupe.key(_turn(i)) for i in range(2)]
    await pg.upsert_many([(k.memory_id, k.content_hash, k.candidate) for k in keys])
    first, second = (k.memory_id for k in keys)
    con = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        other = con.transaction()
        await other.start()
        await con.execute(_UPDATE, second)
        yield con, other, first, second
    finally:
        await con.close()


async def _marked(con: asyncpg.Connection, ids: Sequence[str]) -> dict[str, bool]:
    rows = await con.fetch(
        "SELECT id::text AS id, indexed FROM memories WHERE id = ANY($1::uuid[])", list(ids)
    )
    return {r["id"]: r["indexed"] for r in rows}


async def test_a_mark_skips_a_row_another_transaction_holds(
    pg: PgStore, database_url: str, namespace: str
) -> None:
    """Three memories written; another transaction holds the second (as the next store
    batch's transaction holds a memory it folds a source into). Marking all three returns
    at once, marks the other two, and leaves the held one unindexed, where the maintenance
    loop finds it; once that transaction has ended, the mark takes it too. A mark that
    waited would time out here: it waited for the transaction, and when that transaction
    next wanted a row the mark held, PostgreSQL broke the deadlock only after a second."""
    keys = [dedupe.key(_turn(i)) for i in range(3)]
    await pg.upsert_many([(k.memory_id, k.content_hash, k.candidate) for k in keys])
    ids = [k.memory_id for k in keys]
    con = await asyncpg.connect(database_url, server_settings={"search_path": namespace})
    try:
        holder = con.transaction()
        await holder.start()
        await con.execute("UPDATE memories SET updated_at = now() WHERE id = $1", ids[1])
        await asyncio.wait_for(pg.mark_indexed(ids), timeout=5)
        await holder.rollback()
        assert await _marked(con, ids) == {ids[0]: True, ids[1]: False, ids[2]: True}
        assert [m.id for m in await pg.unindexed()] == [ids[1]]
        await asyncio.wait_for(pg.mark_indexed(ids), timeout=5)
        assert await _marked(con, ids) == dict.fromkeys(ids, True)
        assert await pg.unindexed() == []
    finally:
        await con.close()


async def test_access_counts_skip_a_row_another_transaction_holds(
    pg: PgStore, database_url: str, namespace: str
) -> None:
    """Two memories recalled; a transaction holds the second and next wants the first (as a
    store transaction folding sources into both would). The access counts are written at
    once for the first and the second comes back to be counted later, so that transaction
    gets the first row without a deadlock; once it has ended, the second is counted.
    Waiting, the count held the first row while it waited for the second: PostgreSQL
    cancelled one side after a second (DeadlockDetectedError)."""
    async with _second_held(pg, database_url, namespace) as (con, holder, first, second):
        counting = asyncio.create_task(pg.touch("acme", {first: 2, second: 3}))
        await asyncio.sleep(0.3)  # the count has taken what it could
        await con.execute(_UPDATE, first)
        assert await asyncio.wait_for(counting, timeout=5) == [second]
        await holder.commit()
        assert await pg.touch("acme", {second: 3}) == []
        rows = await con.fetch(
            "SELECT id::text AS id, access_count FROM memories WHERE id = ANY($1::uuid[])",
            [first, second],
        )
        assert {r["id"]: r["access_count"] for r in rows} == {first: 2, second: 3}


async def test_a_deadlock_leaves_the_store_as_a_conflict_not_an_outage(
    pg: PgStore, database_url: str, namespace: str
) -> None:
    """A store transaction in a deadlock that PostgreSQL breaks by cancelling it raises
    ``StorageConflict``: retried like an outage (a ``StorageUnavailable``), and named apart,
    so the stage's log and last error say what happened instead of "postgres did not
    answer"."""
    async with _second_held(pg, database_url, namespace) as (con, other, first, second):
        with pytest.raises(StorageConflict) as raised:
            async with pg._transaction() as mine:
                await mine.execute(_UPDATE, first)
                waiting = asyncio.create_task(mine.execute(_UPDATE, second))
                # this side waits first, so its deadlock check (1 s on) finds the cycle
                await _until_a_lock_wait(database_url)
                await con.execute(_UPDATE, first)  # the other side closes it
                await waiting
        assert isinstance(raised.value, StorageUnavailable)  # handled as any outage
        await other.commit()


async def test_an_erasure_cancelled_to_break_a_deadlock_is_run_again(
    pg: PgStore, database_url: str, namespace: str
) -> None:
    """An erasure deletes the owner's rows in the table's order; a store transaction holds
    the second and next wants the first (folding sources into both). PostgreSQL cancels the
    erasure, which waited first, after a second: it is run again, waits for that transaction
    to end, and erases both memories, once (one audit row). Without the second run the
    command answered "unavailable" (``StorageConflict``)."""
    async with _second_held(pg, database_url, namespace) as (con, other, first, second):
        erasing = asyncio.create_task(pg.erase(OwnerFilter(tenant="acme", user="bo")))
        await _until_a_lock_wait(database_url)  # the erasure holds the first, waits for the second
        await con.execute(_UPDATE, first)  # returns once PostgreSQL has cancelled the erasure
        await asyncio.sleep(0.2)
        assert not erasing.done()  # run again, and waiting for this transaction
        await other.commit()
        assert sorted(await asyncio.wait_for(erasing, timeout=5)) == sorted([first, second])
        assert await con.fetchval("SELECT count(*) FROM memories") == 0
        assert await con.fetchval("SELECT count(*) FROM memory_events WHERE kind = 'erased'") == 1

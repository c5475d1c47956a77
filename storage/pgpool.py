"""An asyncpg pool whose every use translates an outage into ``StorageUnavailable``.

``PgStore`` reaches Postgres only through ``GuardedPool``: ``acquire()`` (with or without a
transaction inside) and ``fetch()``. Whatever the body raises that means "the server or the
connection is gone" leaves as ``StorageUnavailable`` (a ``TransientError``: the stage retries
soon, the maintenance loop goes on, commands answer ``unavailable``), never as a driver error.

What a restart of Postgres looks like to asyncpg, and why each class is here:

- ``OSError`` (connection refused) and ``PostgresConnectionError`` (08xxx: the socket closed
  in the middle of a statement) while the server is down;
- ``OperatorInterventionError`` (57xxx): ``AdminShutdownError`` 57P01 is the FATAL message a
  backend sends to its client when the server is stopped, ``CrashShutdownError`` 57P02 when a
  sibling crashed, ``CannotConnectNowError`` 57P03 while it starts or recovers,
  ``QueryCanceledError`` 57014 a statement timeout;
- ``InternalClientError``: that FATAL message also reaches connections that sit *idle* in the
  pool. asyncpg's protocol does not expect a message when no statement runs, so it parks the
  connection in its error-consume state (2) until the socket closes, a few milliseconds later.
  A statement issued on it in between fails with ``cannot switch to state 12; another operation
  (2) is in progress``. No connection is shared by two coroutines: the pool hands out a
  connection the server has already dropped. The failed statement's release resets the
  connection, the reset fails, and asyncpg terminates it, so the next acquire gets a fresh one;
- ``InterfaceError``: a closed pool or connection (e.g. ``Transaction.__aexit__`` on a
  connection that died inside the transaction);
- ``TooManyConnectionsError``, deadlocks and serialization failures: retrying helps.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from memstream.schemas.errors import StorageConflict, StorageUnavailable

OUTAGE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.DeadlockDetectedError,  # concurrent merges of one memory: retry
    asyncpg.exceptions.SerializationError,
)
# of those, the ones where the server is there and broke a conflict between statements
CONFLICTS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
)


def unavailable(exc: BaseException) -> StorageUnavailable:
    """What an ``OUTAGE`` error leaves the store as: ``StorageConflict`` for a conflict
    PostgreSQL broke, else ``StorageUnavailable``. Both are retried; the type tells the
    operator which it was."""
    if isinstance(exc, CONFLICTS):
        return StorageConflict("postgres cancelled a statement to break a lock conflict")
    return StorageUnavailable("postgres did not answer")


class GuardedPool:
    """The asyncpg pool, with outage errors translated once, here."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Any]:
        try:
            async with self.pool.acquire() as con:
                yield con
        except OUTAGE as exc:
            raise unavailable(exc) from exc

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        try:
            return list(await self.pool.fetch(sql, *args))
        except OUTAGE as exc:
            raise unavailable(exc) from exc

    async def close(self) -> None:
        await self.pool.close()

"""The Qdrant Edge shard, and the recall responder, in a process of their own.

Qdrant Edge runs inside the process that opens its shard, and its calls hold the interpreter
lock. With the shard in the worker, one interpreter runs the stages' Python, the engine's
calls and every recall, and recall waits behind all of it (docs/benchmarks.md: recall took
40% of that process's time in a run with a client asking back to back). With
``MEMSTREAM_STAGE__INDEX_PROCESS`` the worker starts a child that opens the shard, answers
``<ns>.recall`` and the command verbs (a worker of the ``recall`` role, consumers/roles.py),
and serves the worker's own index calls (``RemoteIndex``, a ``VectorIndex``) over a socket.
The worker keeps the stages and the index's maintenance, and no longer opens the shard.

Order: the child answers the worker's calls one at a time, in the order they were sent, so
a search sent after an upsert sees the upsert, as in one process.

Failures: a child that exits (killed, out of memory) fails the calls waiting on it with
``IndexProcessGone``, a ``StorageUnavailable``: the stages take the index-away path (memories
kept in Postgres unindexed, dedupe exact only, the maintenance loop indexing them later), and
the next call starts a new child. Recall has no responder until the new child answers; the
agent's request times out, as when a worker restarts.

The child's own side is consumers/indexchild.py; the frames both speak, consumers/indexwire.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import pickle
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memstream.consumers import indexchild, indexwire, spawned
from memstream.consumers.helper import retrieved, usable_cpus
from memstream.consumers.logs import log
from memstream.consumers.outage import Backoff
from memstream.schemas.errors import StorageUnavailable
from memstream.schemas.settings import Settings
from memstream.storage.ports import Record, RecordHit, VectorFilter, VectorPoint

START_TIMEOUT_S = 120.0  # loading the model, connecting, opening the shard
# after a failed start, calls fail at once for a pause that doubles from 2 s up to 60 s (each
# start loads the model: a shard that never opens must not keep a core busy)
RESPAWN_PAUSE_S = (2.0, 60.0)


class IndexProcessGone(StorageUnavailable):
    """The index process exited (killed, out of memory) before it answered."""


def wanted(settings: Settings) -> bool:
    """Whether a worker of these settings runs its shard in an index process: it owns a Qdrant
    Edge shard (every index role, no Qdrant server), the setting is on, and the machine has a
    core to spare."""
    from memstream.consumers.roles import INDEX_ROLES

    return (
        settings.stage.index_process
        and not settings.qdrant_url
        and set(settings.stages) >= INDEX_ROLES
        and usable_cpus() >= 2
    )


def without_recall(settings: Settings) -> Settings:
    """The worker's own settings once its index process answers recall."""
    return settings.model_copy(
        update={"stages": tuple(r for r in settings.stages if r != "recall")}
    )


class RemoteIndex:
    """``VectorIndex`` whose calls run in the index process (see the module docstring)."""

    def __init__(
        self, settings: Settings, nats_url: str, dsn: str, key: bytes, schema: str = "public"
    ) -> None:
        self._args = (settings, nats_url, dsn, key, schema)
        self._proc: Any = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[tuple[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()  # one start at a time
        self._failed_at = 0.0
        self._pauses = Backoff(*RESPAWN_PAUSE_S)
        self._restarting: asyncio.Future[None] | None = None
        self.pause_s = 0.0  # calls fail at once for this long after ``_failed_at``
        self._closing = False
        self.restarts = 0
        self.spawned = 0  # processes started, the first included
        # every index process is started from this one thread, whose nice value the worker
        # never raises: an index process started again runs at the worker's original value
        # (consumers/priority.py)
        self._launcher = ThreadPoolExecutor(1, thread_name_prefix="memstream-index-launcher")
        self.launcher_thread: int | None = None  # its thread id, once it has started one

    def __repr__(self) -> str:
        return f"RemoteIndex(running={self._writer is not None}, key=<hidden>)"

    @property
    def searches_inline(self) -> bool:
        return False  # the searches run in the other process: side by side is free here

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        """Start the index process and wait until it answers (its shard open, its recall
        responder subscribed); its start's error is raised here."""
        async with self._lock:
            if self._writer is None:
                await self._spawn()

    async def _spawn(self) -> None:
        self.spawned += 1
        ctx = multiprocessing.get_context("spawn")
        mine, theirs = socket.socketpair()
        proc = ctx.Process(
            target=indexchild.main, args=(theirs, *self._args), name="memstream-index", daemon=True
        )
        # waited for on the loop, as a plain ``start`` is: a start is never left half done
        self.launcher_thread = self._launcher.submit(_started, proc).result()
        theirs.close()
        reader, writer = await asyncio.open_connection(sock=mine)
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                _, data = await indexwire.read(reader)
            kind, value = pickle.loads(data)
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            kind, value = "error", IndexProcessGone("the index process did not start")
        except BaseException:  # cancelled: no child left behind holding the shard
            writer.close()
            await asyncio.shield(asyncio.to_thread(_stop, proc, 0))
            raise
        if kind != "ready":
            writer.close()
            await asyncio.to_thread(_stop, proc, 5)
            raise value
        self._proc, self._writer = proc, writer
        self._reading = asyncio.create_task(self._answers(reader, writer))

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                rid, data = await indexwire.read(reader)
                fut = self._pending.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(indexwire.answer_of(data))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        if self._writer is writer:
            self._writer = None
            if not self._closing:
                log.warning("index_process.gone", waiting=len(self._pending))
        writer.close()
        gone = IndexProcessGone("the index process exited")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(gone)
        self._pending.clear()

    async def _running(self) -> asyncio.StreamWriter:
        """The running child's end of the socket, starting a new child if it is gone. The
        start runs as a task of its own that callers wait for: a caller given up on (a
        health check's deadline) does not stop a start that others need."""
        if self._writer is not None:
            return self._writer
        if self._closing:
            raise IndexProcessGone("the index is closed")
        if self._restarting is None or self._restarting.done():
            if time.monotonic() - self._failed_at < self.pause_s:
                raise IndexProcessGone("the index process is restarting")
            self._restarting = asyncio.ensure_future(self._restart())
            self._restarting.add_done_callback(retrieved)
        await asyncio.shield(self._restarting)
        if self._writer is None:  # gone again at once
            raise IndexProcessGone("the index process exited")
        return self._writer

    async def _restart(self) -> None:
        async with self._lock:
            if self._writer is not None:
                return
            if self._proc is not None:
                await asyncio.to_thread(_stop, self._proc, 5)
                self._proc = None
            try:
                await self._spawn()
            except Exception as exc:  # noqa: BLE001 - any start failure: the index is away
                self._failed_at, self.pause_s = time.monotonic(), self._pauses.next()
                # the type only: a message could quote a connection string
                log.warning(
                    "index_process.start_failed",
                    error=type(exc).__name__,
                    retry_in_s=round(self.pause_s, 1),
                )
                raise IndexProcessGone("the index process did not start") from None
            self._pauses.reset()
            self.pause_s = 0.0
            self.restarts += 1
            log.warning("index_process.restarted")

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        writer = await self._running()
        rid = next(self._ids)
        fut: asyncio.Future[tuple[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        writer.write(indexwire.frame(rid, (method, args, kwargs)))
        with contextlib.suppress(ConnectionError):  # the reader sees the end, fails the call
            await writer.drain()
        kind, value = await fut
        if kind == "error":
            raise value
        return value

    async def ensure(self, dim: int) -> None:
        await self._call("ensure", dim)

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        await self._call("upsert", list(points))

    async def search(
        self, vector: Sequence[float], flt: VectorFilter, limit: int, *, with_records: bool = False
    ) -> Any:
        return await self._call("search", vector, flt, limit, with_records=with_records)

    async def search_many(
        self,
        queries: Sequence[tuple[Sequence[float], VectorFilter]],
        limit: int,
        min_score: float | None = None,
    ) -> list[list[RecordHit]]:
        found: list[list[RecordHit]] = await self._call(
            "search_many", list(queries), limit, min_score
        )
        return found

    async def search_sparse(
        self,
        sparse: Mapping[int, float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: bool = False,
    ) -> Any:
        return await self._call(
            "search_sparse", dict(sparse), flt, limit, with_records=with_records
        )

    async def fetch(self, tenant: str, ids: Sequence[str]) -> dict[str, Record]:
        found: dict[str, Record] = await self._call("fetch", tenant, list(ids))
        return found

    async def delete(self, tenant: str, ids: Sequence[str]) -> None:
        await self._call("delete", tenant, list(ids))

    async def count(self, tenant: str | None = None) -> int:
        n: int = await self._call("count", tenant)
        return n

    async def optimize(self) -> bool:
        changed: bool = await self._call("optimize")
        return changed

    async def optimize_builds(self) -> bool:
        """Whether the shard's ``optimize`` would build now (a pause of the index process
        that recall should not wait for: ``Maintenance``)."""
        builds: bool = await self._call("optimize_builds")
        return builds

    async def pause_recall(self) -> None:
        """The index process stops answering recall (the requests it has go on)."""
        await self._call("recall_off")

    async def resume_recall(self) -> None:
        """The index process answers recall again."""
        await self._call("recall_on")

    async def metrics(self) -> bytes:
        """The index process's Prometheus exposition (its recall responder's series)."""
        if self._writer is None:  # a scrape does not start a new process
            raise IndexProcessGone("the index process is not running")
        text: bytes = await self._call("metrics")
        return text

    async def close(self) -> None:
        """Stop the index process: it stops answering recall, closes the shard and exits."""
        self._closing = True
        if self._restarting is not None and not self._restarting.done():
            self._restarting.cancel()  # the child being started is stopped (``_spawn``)
            with contextlib.suppress(BaseException):
                await self._restarting
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if self._reading is not None:
            with contextlib.suppress(Exception):
                await self._reading
        if self._proc is not None:
            await asyncio.to_thread(_stop, self._proc, 30)
            self._proc = None
        self._launcher.shutdown(wait=False)


def _started(proc: Any) -> int:
    """Start ``proc``; the id of the thread that did (``RemoteIndex._launcher``)."""
    spawned.start(proc)
    return threading.get_native_id()


def _stop(proc: Any, wait_s: float) -> None:
    proc.join(wait_s)
    if proc.is_alive():
        proc.kill()
        proc.join(5)

"""The recall responder, and the thread it runs on in a worker that owns a Qdrant Edge shard.

A worker that owns the shard also runs the ingest stages, and both share one event loop:
a recall request that arrives while a stage batch builds its rows or points waits for that
step to end, and at 500 turns/s such steps take milliseconds each (docs/ingest.md, "The
owner's ceiling"). So recall gets a thread of its own, with its own event loop and its own
NATS connection (``RecallLane``): a request is read and answered there, and the stages'
steps only share the interpreter lock with it, which Python hands over every
``SWITCH_INTERVAL_S`` instead of at the end of a step.

What recall reads in the shard is safe from any thread (``VectorIndex.reads_any_loop``).
What belongs to the worker's loop (Postgres: keys, the degraded keyword search, access
counts; the recall cache's bucket) is reached through ``consumers.home.Home``. With an
index that is tied to the worker's loop (the Qdrant server adapter), the whole answer runs
there, as without the thread.

``RecallResponder`` is what either way answers a message: the bound on requests waiting,
the deadline, bounded concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import nats

from memstream.consumers.busauth import safe_reply
from memstream.consumers.home import Home
from memstream.consumers.logs import log
from memstream.consumers.metrics import WorkerMetrics
from memstream.consumers.recall import RecallService, error_reply
from memstream.schemas.errors import ErrorCode
from memstream.schemas.settings import Settings

T = TypeVar("T")

# how long a thread that wants the interpreter lock waits before the holder must let go
# (Python's default is 5 ms): recall's share of a busy worker comes in pieces this long.
# With the default, recall on the thread was slower than on the worker's loop
# (docs/benchmarks.md, "2026-11-26, recall thread")
SWITCH_INTERVAL_S = 0.0002
SLOTS = 64  # recalls answered at once; the rest wait for a slot (within their deadline)


class RecallResponder:
    """Answers recall messages on the loop it is used from: more than
    ``recall_max_pending`` waiting are refused ``unavailable`` at once, and each one that
    waits longer than ``recall_deadline_s`` is answered ``timeout``."""

    def __init__(
        self,
        answer: Callable[[bytes], Awaitable[bytes]],
        settings: Callable[[], Settings],
        recall: RecallService,
        telemetry: WorkerMetrics,
    ) -> None:
        self.answer, self.settings, self.recall, self.telemetry = (
            answer,
            settings,
            recall,
            telemetry,
        )
        self.slots = asyncio.Semaphore(SLOTS)
        self.pending = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def message(self, msg: Any) -> None:
        settings = self.settings()
        if msg.reply and not safe_reply(msg.reply, settings.namespace):
            log.warning("recall.refused", reason="reply subject is not an inbox")
            return
        if self.pending >= settings.recall_max_pending:
            # overloaded: say so at once rather than queue without bound (each queued request
            # holds a task and its body); the agent may retry or go without memories
            self.recall.failed += 1
            if msg.reply:
                await msg.respond(error_reply(ErrorCode.UNAVAILABLE, "recall is overloaded"))
            return
        self.pending += 1
        task = asyncio.create_task(self._respond(msg, settings.recall_deadline_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respond(self, msg: Any, deadline_s: float) -> None:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(deadline_s):
                async with self.slots:  # bounded concurrency; the rest wait here
                    data = await self.answer(msg.data)
        except TimeoutError:
            self.recall.failed += 1
            data = error_reply(ErrorCode.TIMEOUT, "recall did not finish within its deadline")
        finally:
            self.pending -= 1
            self.telemetry.recall_answered(time.perf_counter() - started)
        if msg.reply:
            with contextlib.suppress(Exception):  # the requester or NATS may be gone
                await msg.respond(data)

    async def finish(self) -> None:
        """Wait for the requests in hand."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class RecallLane:
    """The recall subscription on a thread of its own, with its own loop and connection."""

    def __init__(
        self,
        responder: Callable[[], RecallResponder],
        connect: Callable[[Callable[[], Awaitable[None]]], Coroutine[Any, Any, Any]],
        subject: str,
        queue: str,
        home: Home,
        lost: Callable[[], None],
    ) -> None:
        """``responder``: made on the lane's loop (its semaphore belongs there);
        ``connect(closed)``: the lane's NATS connection, ``closed`` called if it ends for
        good; ``lost``: called on the worker's loop then."""
        self._make_responder, self._connect = responder, connect
        self.subject, self.queue, self.home, self._lost = subject, queue, home, lost
        self.responder: RecallResponder | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started: Future[None] = Future()
        self._stop: asyncio.Event | None = None
        self._stopping = False

    async def start(self) -> None:
        """Connected and subscribed when this returns (or raises what stopped it)."""
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._main, name="memstream-recall", daemon=True)
        self._thread.start()
        await asyncio.wrap_future(self._started)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.responder = self._make_responder()
            nc = await self._connect(self._closed)
            sub = await nc.subscribe(
                self.subject,
                queue=self.queue,
                cb=self.responder.message,
                pending_msgs_limit=100_000,
            )
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it in the worker
            self._started.set_exception(exc)
            return
        self._started.set_result(None)
        await self._stop.wait()
        if not nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await sub.drain()
        await self.responder.finish()
        if not nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await nc.drain()

    async def _closed(self) -> None:
        if not self._stopping:
            log.error("recall.nats_closed", action="exiting for the supervisor to restart")
            self.home.call(self._lost)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result, run on the lane's loop (for tests and diagnostics)."""
        assert self.loop is not None
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def stop(self) -> None:
        """Drain the subscription, answer what is in hand, close the connection."""
        self._stopping = True
        if self.loop is not None and self._stop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended already
                self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

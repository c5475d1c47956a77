"""Outages: errors that say a server is away, not that a message is bad.

A stage that meets an outage holds the message and tries again soon (``Backoff``: 0.5 s
doubling to 2 s, with jitter so that workers do not retry in step), renewing the message's
ack deadline each time (``in_progress``), so the retries use no delivery and bring the message
no closer to the dead-letter subject. Only an outage that lasts longer than the hold budget
(``stage.outage_hold_s``) gives the message back (nack with a short delay, one delivery
used). Errors that are not outages keep the long retry schedule (``stage.retry_delays_s``).
See docs/topology.md ("Outages and retries").
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from memstream.consumers.logs import log
from memstream.schemas.errors import StorageUnavailable

T = TypeVar("T")

OUTAGES: tuple[type[BaseException], ...] = (
    StorageUnavailable,  # Postgres or the vector index did not answer (translated at the edge)
    nats.errors.NoRespondersError,  # JetStream not (yet) there: a restarting server
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,  # reconnecting, the pending buffer is full
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,  # 503 from JetStream (no quorum, starting up)
    TimeoutError,  # nats.errors.TimeoutError is one; a PubAck that did not come
    ConnectionError,  # refused, reset
)


def is_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or what it was raised from) says a server is away."""
    seen: BaseException | None = exc
    for _ in range(4):  # a translated error carries its cause
        if seen is None:
            return False
        if isinstance(seen, OUTAGES):
            return True
        seen = seen.__cause__
    return False


class Backoff:
    """Jittered exponential pauses: ``first`` doubling up to ``cap``, each drawn from
    [half, full] of the current step (so that many workers spread out)."""

    def __init__(self, first: float = 0.5, cap: float = 2.0) -> None:
        self.first, self.cap = first, cap
        self.step = first

    def next(self) -> float:
        pause = random.uniform(self.step / 2, self.step)  # jitter, not a secret
        self.step = min(self.step * 2, self.cap)
        return pause

    def reset(self) -> None:
        self.step = self.first


async def hold(
    attempt: Callable[[], Awaitable[T]],
    budget_s: float,
    renew: Callable[[], Awaitable[object]],
    on_hold: Callable[[BaseException, bool], None],
    renew_s: float | None = None,
) -> T:
    """``attempt``, tried again while it fails with an outage and ``budget_s`` lasts: each
    pause (``Backoff``) is reported to ``on_hold`` (the error, and whether it is the first)
    and followed by ``renew`` (the messages' ack deadline). Any other error, or an outage
    past the budget, is raised.

    With ``renew_s``, a try that runs longer than that renews the deadline every ``renew_s``
    too, for up to ``budget_s``: a batch that waits behind a slow call (the vector index
    building its graphs) is not delivered again while it is still being handled, and a
    try that hangs past the budget lets its messages go to another process after
    ``ack_wait`` (logged: ``stage.slow_try``)."""
    backoff = Backoff()
    held = 0.0
    while True:
        try:
            return await _renewing(attempt(), renew, renew_s, budget_s)
        except Exception as exc:
            if not is_outage(exc) or held >= budget_s:
                raise
            on_hold(exc, held == 0.0)
            pause = backoff.next()
            await asyncio.sleep(pause)
            held += pause
            with contextlib.suppress(Exception):  # NATS itself may be the one away
                await renew()


async def _renewing(
    work: Awaitable[T],
    renew: Callable[[], Awaitable[object]],
    every_s: float | None,
    limit_s: float,
) -> T:
    """``work``, with ``renew`` called every ``every_s`` while it runs (never: None), until
    ``limit_s`` has passed."""
    if every_s is None:
        return await work
    task = asyncio.ensure_future(work)
    started = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            if time.monotonic() - started >= limit_s:
                log.warning("stage.slow_try", seconds=round(time.monotonic() - started, 1))
                return await task
            with contextlib.suppress(Exception):  # NATS away: back after ack_wait
                await renew()
    finally:
        if not task.done():  # cancelled from outside: the work goes with it
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

"""Stage batches: a stage handles its whole pull batch as one unit.

The contract (docs/ingest.md):
- every message of the batch is decoded and checked first; one that fails (a permanent
  error: bad JSON, wrong subject, a candidate that skipped redact) goes to the single path,
  which dead-letters it on its first delivery: it never holds up the rest;
- the others go through one batch call: one pure call per step, one Postgres round trip per
  statement kind, one embedding call, one vector upsert, publishes pipelined and awaited
  together. They are acked, together, only after all of the batch's outputs are durable;
- an outage (a server away) holds the whole batch and tries it again, renewing every
  message's ack deadline, as the single path does for one message;
- any other failure of the batch call falls back to singles: each message of the batch, in
  stream order, through the single path (``StageRunner``): the poison message is dead-lettered
  or retried alone, the rest succeed. Writes are idempotent, so what the failed batch call
  did already is done again harmlessly.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from memstream.consumers.logs import log
from memstream.consumers.outage import Backoff, hold
from memstream.consumers.pull import Pull
from memstream.consumers.runner import StageRunner
from memstream.consumers.stages import Deps, Work, delivered_before
from memstream.schemas.errors import PermanentError

T = TypeVar("T")


class One:
    """One nats-py message of a pull batch, with the interface of faststream's message that
    ``StageRunner`` uses (body, raw_message, ack, nack(delay=), reject, in_progress)."""

    __slots__ = ("raw_message",)

    def __init__(self, raw: Any) -> None:
        self.raw_message = raw

    @property
    def body(self) -> bytes:
        data: bytes = self.raw_message.data
        return data

    async def ack(self) -> None:
        await self.raw_message.ack()

    async def nack(self, delay: float | None = None) -> None:
        await self.raw_message.nak(delay=delay)

    async def reject(self) -> None:
        await self.raw_message.term()

    async def in_progress(self) -> None:
        await self.raw_message.in_progress()


Decode = Callable[[Deps, bytes, str], T]  # raises PermanentError for a message that cannot pass
BatchWork = Callable[[Deps, list[T]], Awaitable[int]]  # (deps, decoded batch) -> outputs
# (deps, decoded batch) -> the rest of the batch's work: what ``begin`` started ahead (in a
# helper process) runs while the batch before is finished
Begin = Callable[[Deps, list[T]], Callable[[], Awaitable[int]]]


@dataclass(frozen=True)
class BatchStage(Generic[T]):
    decode: Decode[T]
    work: BatchWork[T]
    single: Work  # the same stage for one message: the fallback
    begin: Begin[T] | None = None


# how long an idle stage loop's fetch waits for a first message (a message that arrives
# meanwhile is delivered at once; nothing is slower under load). A stop waits for the fetch
# under way to end, not to strand what its request still delivers: at 1 s every worker stop
# took 0.85 s more. Idle, the loops ask the server 4 times a second instead of once.
FETCH_WAIT_S = 0.25


@dataclass
class Overlap:
    """How a batch begun ahead shares the pipeline with the one before it (``PullLoops``):
    its work sets ``head_done`` once what the next batch reads is written (its rows committed;
    see consumers/chains.py), and the next batch's work starts then; the rest of this batch
    (its index write, events and ack) waits in ``after_before`` for the batch before to have
    finished, so events and acks keep stream order."""

    head_done: asyncio.Event
    before: asyncio.Task[None] | None
    msgs: Sequence[One]
    renew_s: float

    async def after_before(self) -> None:
        """Wait until the batch before has finished (acked or gone to singles), renewing this
        batch's ack deadlines meanwhile."""
        if self.before is None:
            return
        while not self.before.done():
            done, _ = await asyncio.wait({self.before}, timeout=self.renew_s)
            if not done:
                with contextlib.suppress(Exception):  # NATS away: back after ack_wait
                    await asyncio.gather(*(m.in_progress() for m in self.msgs))


# the overlap of the batch this task finishes (set by ``PullLoops`` for a stage that begins
# its batches ahead); None: the batch runs alone
OVERLAP: contextvars.ContextVar[Overlap | None] = contextvars.ContextVar("overlap", default=None)


@dataclass
class Begun:
    """A pull batch decoded, its work started (``BatchRunner.begin``), to be finished."""

    msgs: list[One]
    good: list[tuple[One, Any]]
    singles: list[One]
    rest: Callable[[], Awaitable[int]] | None


class BatchRunner(StageRunner):
    """Runs one stage over whole pull batches under the contract of the module docstring."""

    def __init__(self, name: str, deps: Deps, stage: BatchStage[Any]) -> None:
        super().__init__(name, deps, stage.single)
        self.stage = stage

    def begin(self, raws: Sequence[Any]) -> Begun:
        """Decode the batch and start its work (``BatchStage.begin``, else nothing yet)."""
        msgs = [One(r) for r in raws]
        good: list[tuple[One, Any]] = []
        singles: list[One] = []
        for msg in msgs:
            try:
                good.append((msg, self.stage.decode(self.deps, msg.body, msg.raw_message.subject)))
            except PermanentError:
                singles.append(msg)
        rest = None
        if good and self.stage.begin is not None:
            rest = self.stage.begin(self.deps, [v for _, v in good])
        return Begun(msgs, good, singles, rest)

    async def batch(self, raws: Sequence[Any]) -> None:
        await self.finish(self.begin(raws))

    async def finish(self, begun: Begun) -> None:
        msgs, good, singles = begun.msgs, begun.good, begun.singles
        m = self.metrics
        started = time.perf_counter()
        m.batches += 1
        m.processed += len(msgs)
        m.redelivered += sum(delivered_before(msg) for msg in msgs)
        m.enter()
        try:
            if good:
                try:
                    outputs = await self._attempt_batch(good, begun.rest)
                except Exception as exc:  # noqa: BLE001 - any failure of the batch: isolate by singles
                    log.warning(  # the error's type only: a message could quote a value
                        "stage.batch_split",
                        stage=self.name,
                        size=len(good),
                        reason=type(exc).__name__,
                    )
                    singles = msgs  # all of them, in stream order
                else:
                    await asyncio.gather(*(msg.ack() for msg, _ in good))
                    m.acked += len(good)
                    m.outputs += outputs
            for msg in singles:
                await self.one(msg)
        finally:
            elapsed = time.perf_counter() - started
            m.busy_s += elapsed
            m.leave()
            if self.deps.telemetry is not None:
                self.deps.telemetry.stage_handled(self.name, elapsed, len(msgs))

    async def _attempt_batch(
        self, good: list[tuple[One, Any]], rest: Callable[[], Awaitable[int]] | None = None
    ) -> int:
        """The batch call, held through an outage as ``StageRunner._attempt`` holds one
        message, every message's ack deadline renewed, as during a call that runs long."""
        values = [v for _, v in good]
        return await hold(
            rest or (lambda: self.stage.work(self.deps, values)),
            self.deps.settings.stage.outage_hold_s,
            lambda: asyncio.gather(*(msg.in_progress() for msg, _ in good)),
            self._held,
            self.deps.settings.stage.ack_wait_s / 3,
        )


class PullLoops:
    """One pull loop per stage on plain nats-py (``Pull``): each fetch returns at once with
    whatever is waiting (up to ``batch_size``; faststream's batch mode would wait for a full
    batch or its timeout, adding that wait to every turn's latency), and the batch is handled
    as a unit. One batch at a time per stage: per-session order holds (DESIGN.md section 8:
    no concurrent handlers on a pull consumer)."""

    def __init__(
        self,
        nc: Any,
        runners: dict[str, tuple[str, str, BatchRunner]],
        size: int,
        ack_wait_s: float = 30.0,
        heal: Callable[[str], Awaitable[None]] | None = None,
    ):
        self.nc, self.runners, self.size = nc, runners, size
        self.ack_wait_s = ack_wait_s
        # re-creates a stage's consumer the server says is gone (``consumers/healing.py``)
        self.heal = heal
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False

    async def start(self) -> None:
        for stage, (stream, durable, runner) in self.runners.items():
            sub = await self._bind(stream, durable, runner)
            self._tasks[stage] = asyncio.create_task(
                self._supervised(stage, stream, durable, runner, sub)
            )

    async def _bind(self, stream: str, durable: str, runner: BatchRunner) -> Pull:
        """The stage's puller; the requests the server refuses count in the stage's
        ``refused`` (``memstream_stage_refused_total``)."""
        metrics = runner.metrics

        def refused() -> None:
            metrics.refused += 1

        return await Pull.bind(self.nc, stream, durable, on_refused=refused)

    async def _supervised(
        self, stage: str, stream: str, durable: str, runner: BatchRunner, sub: Pull
    ) -> None:
        """``_loop``, started again on a new subscription if it fails. Every failure a loop
        expects (a fetch, a batch) is handled inside it; one it does not (a defect) would
        otherwise end the stage's only loop while the worker runs on, its turns waiting for
        ever with nothing said. Logged with its traceback, the loop comes back after a
        pause; the batches it had in hand are delivered again after ``ack_wait``."""
        backoff = Backoff(0.5, 5.0)
        while True:
            try:
                await self._loop(stage, sub, runner)
                return
            except Exception:  # noqa: BLE001 - logged, and the loop started again
                if self._stopping:
                    return
                log.exception("stage.loop_failed", stage=stage)
            while not self._stopping:
                await asyncio.sleep(backoff.next())
                try:
                    sub = await self._bind(stream, durable, runner)
                    break
                except Exception as exc:  # noqa: BLE001 - NATS away: try again
                    log.debug("stage.rebind_failed", stage=stage, reason=type(exc).__name__)
            if self._stopping:
                return

    async def _loop(self, stage: str, sub: Pull, runner: BatchRunner) -> None:
        backoff = Backoff(0.2, 2.0)
        # A stage that starts its batches ahead (``BatchStage.begin``: extraction and
        # redaction in the helper process) fetches and begins the next batch while this one
        # finishes, full or not: the next batch's preparation then overlaps this one's dedupe
        # and store instead of adding to the cycle (at 500 turns/s with batches of ~20 turns
        # it halved publish-to-recallable p50; at 50 and 150 turns/s it was no worse:
        # docs/benchmarks.md). Batches still finish one at a time, in stream order.
        ahead = runner.stage.begin is not None
        renew_s = self.ack_wait_s / 3
        finishing: asyncio.Task[None] | None = None
        overlap: Overlap | None = None
        unfinished: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping:
                if sub.gone and self.heal is not None:
                    sub.gone = False
                    await self.heal(stage)
                try:
                    msgs = await sub.fetch(self.size, wait_s=FETCH_WAIT_S)
                except TimeoutError:
                    continue
                except Exception as exc:  # noqa: BLE001 - NATS away or reconnecting: fetch again soon
                    log.debug("stage.fetch_failed", stage=stage, reason=type(exc).__name__)
                    await asyncio.sleep(backoff.next())
                    continue
                backoff.reset()
                if self._stopping:  # stopped while fetching: hand them back at once
                    with contextlib.suppress(Exception):
                        await asyncio.gather(*(m.nak() for m in msgs))
                    break
                try:
                    begun = runner.begin(msgs)
                except Exception:  # noqa: BLE001 - as a failed batch: the messages are redelivered
                    log.exception("stage.batch_error", stage=stage)
                    continue
                if finishing is not None and overlap is not None:
                    behind = time.perf_counter()
                    await self._behind(finishing, overlap.head_done, begun, renew_s, sub)
                    runner.deps.stepped("behind", behind)
                if ahead:
                    overlap = Overlap(asyncio.Event(), finishing, begun.msgs, renew_s)
                    finishing = asyncio.create_task(self._finish(stage, runner, begun, overlap))
                    unfinished.add(finishing)
                    finishing.add_done_callback(unfinished.discard)
                else:
                    await self._renewing_waiting(self._finish(stage, runner, begun), sub, renew_s)
            if unfinished:
                await asyncio.gather(*unfinished, return_exceptions=True)
        finally:
            # Cancelled after the grace of ``stop`` (a batch held through an outage): the
            # batches it started go too, their messages delivered again after ``ack_wait``.
            # Without the subscription, closing the connection does not wait for messages a
            # fetch under way had delivered (nats-py's drain waits until they are taken).
            for task in unfinished:
                task.cancel()
            await sub.close()

    @staticmethod
    async def _behind(
        finishing: asyncio.Task[None],
        head_done: asyncio.Event,
        begun: Begun,
        renew_s: float,
        sub: Pull | None = None,
    ) -> None:
        """Wait until the batch before ``begun`` has written what ``begun`` reads
        (``head_done``) or has finished. It may be held through an outage for longer than
        ``ack_wait``: ``begun``'s messages have their deadline renewed meanwhile, as the held
        batch's are, so they are not delivered again behind it; and so do the messages
        that arrived in ``sub`` and no fetch has returned yet (``Pull.waiting``)."""
        headed = asyncio.ensure_future(head_done.wait())
        try:
            while True:
                done, _ = await asyncio.wait(
                    {finishing, headed}, timeout=renew_s, return_when=asyncio.FIRST_COMPLETED
                )
                if done:
                    return
                with contextlib.suppress(Exception):  # NATS away: back after ack_wait
                    await asyncio.gather(
                        *(m.in_progress() for m in begun.msgs),
                        *(m.in_progress() for m in (sub.waiting if sub else ())),
                    )
        finally:
            headed.cancel()

    @staticmethod
    async def _renewing_waiting(work: Awaitable[None], sub: Pull, renew_s: float) -> None:
        """``work`` (a batch of a stage that does not begin ahead), with the messages that
        arrived in ``sub`` and no fetch has returned yet renewed every ``renew_s`` while it
        runs: the batch renews its own (``BatchRunner``), and the loop fetches nothing until
        it is done."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=renew_s)
                if done:
                    return task.result()
                waiting = list(sub.waiting)
                if waiting:
                    with contextlib.suppress(Exception):  # NATS away: back after ack_wait
                        await asyncio.gather(*(m.in_progress() for m in waiting))
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    @staticmethod
    async def _finish(
        stage: str, runner: BatchRunner, begun: Begun, overlap: Overlap | None = None
    ) -> None:
        OVERLAP.set(overlap)  # this task's own context: seen by the batch's work only
        try:
            await runner.finish(begun)
        except Exception:  # noqa: BLE001 - the loop outlives any batch; the messages are redelivered
            log.exception("stage.batch_error", stage=stage)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop fetching: a fetch under way ends within ``FETCH_WAIT_S`` and hands back what it
        got (cancelling it could strand delivered messages until ``ack_wait``); a batch in hand
        is finished. After ``grace_s`` the loops are cancelled."""
        self._stopping = True
        if self._tasks:
            _, late = await asyncio.wait(self._tasks.values(), timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

"""One stage message under the ack / retry / dead-letter contract.

Every stage handler follows it:
- success: outputs are durable (PubAck received / rows committed), then ack;
- ``PermanentError`` (including a payload that does not decode): publish to
  ``mem.dlq.<stage>`` with the reason in headers, then term;
- an outage (a server away: consumers/outage.py): hold the message and try again every
  0.5-2 s, renewing its ack deadline, for up to ``stage.outage_hold_s`` (no delivery used);
- ``TransientError``: nack with a growing delay; past ``max_deliver`` it goes to
  the dead-letter subject too. Nothing is dropped silently.
"""

from __future__ import annotations

import time
from typing import Any

from memstream.consumers.logs import log
from memstream.consumers.metrics import category_of
from memstream.consumers.outage import Backoff, hold, is_outage
from memstream.consumers.stagemetrics import StageMetrics
from memstream.consumers.stages import Deps, Work, delivered_before
from memstream.schemas.errors import PermanentError, TransientError
from memstream.schemas.subjects import (
    DLQ_BODY_HEADER,
    DLQ_DELIVERIES_HEADER,
    DLQ_REASON_HEADER,
    DLQ_STAGE_HEADER,
    DLQ_SUBJECT_HEADER,
    MSG_ID_HEADER,
)

_DLQ_HEADROOM = 4096  # bytes the dead-letter headers may take beside the body


class StageRunner:
    """Runs one stage's work function under the ack / retry / dead-letter contract."""

    def __init__(self, name: str, deps: Deps, work: Work) -> None:
        self.name, self.deps, self.work = name, deps, work
        self.metrics = deps.metrics.setdefault(name, StageMetrics())

    async def __call__(self, msg: Any) -> None:  # faststream NatsMessage
        started = time.perf_counter()
        self.metrics.processed += 1
        self.metrics.redelivered += delivered_before(msg)
        self.metrics.batches += 1
        self.metrics.enter()
        try:
            await self.one(msg)
        finally:
            elapsed = time.perf_counter() - started
            self.metrics.busy_s += elapsed
            self.metrics.leave()
            if self.deps.telemetry is not None:
                self.deps.telemetry.stage_handled(self.name, elapsed)

    async def one(self, msg: Any) -> None:
        """One message under the contract: ack, hold, retry or dead-letter it."""
        raw = msg.raw_message
        delivered = raw.metadata.num_delivered if raw.metadata else 1
        try:
            outputs = await self._attempt(msg)
        except PermanentError as exc:
            await self._dead_letter(msg, str(exc), category_of(exc))
        except TransientError as exc:
            await self._retry(msg, delivered, f"{type(exc).__name__}: {exc}", is_outage(exc))
        except Exception as exc:  # noqa: BLE001 - the stage middleware's one catch-all: retry, then dead-letter
            outage = is_outage(exc)
            reason = f"unexpected {type(exc).__name__}"
            await self._retry(msg, delivered, reason, outage, "internal_error")
            if not outage:
                log.exception("stage.error", stage=self.name, subject=raw.subject)
        else:
            await msg.ack()
            self.metrics.acked += 1
            self.metrics.outputs += outputs
            log.debug("stage.done", stage=self.name, subject=raw.subject, outputs=outputs)

    async def _attempt(self, msg: Any) -> int:
        """The work, held through an outage (consumers/outage.py): the ack deadline is renewed
        before each try, so the retries use no delivery, and during a try that runs long."""
        return await hold(
            lambda: self.work(self.deps, msg.body, msg.raw_message.subject),
            self.deps.settings.stage.outage_hold_s,
            msg.in_progress,
            self._held,
            self.deps.settings.stage.ack_wait_s / 3,
        )

    def _held(self, exc: BaseException, first: bool) -> None:
        if first:
            log.warning("stage.outage_hold", stage=self.name, reason=type(exc).__name__)
        self.metrics.held += 1
        self.metrics.last_error = f"outage: {type(exc).__name__}"

    async def _retry(
        self,
        msg: Any,
        delivered: int,
        reason: str,
        outage: bool = False,
        category: str = "retries_exhausted",
    ) -> None:
        self.metrics.last_error = reason
        if delivered >= self.deps.settings.stage.max_deliver:
            await self._dead_letter(
                msg, f"gave up after {delivered} deliveries: {reason}", category
            )
            return
        if outage:  # past the hold budget: one delivery used, back soon
            delay = Backoff(1.0, 2.0).next()
        else:
            delays = self.deps.settings.stage.retry_delays_s or [1.0]
            delay = delays[min(delivered - 1, len(delays) - 1)]
        self.metrics.retried += 1
        log.warning(
            "stage.retry", stage=self.name, delivered=delivered, delay_s=delay, reason=reason
        )
        await msg.nack(delay=delay)

    async def _dead_letter(self, msg: Any, reason: str, category: str = "internal_error") -> None:
        raw = msg.raw_message
        seq = raw.metadata.sequence.stream if raw.metadata else 0
        headers = {
            DLQ_REASON_HEADER: reason[:1000],
            DLQ_DELIVERIES_HEADER: str(raw.metadata.num_delivered if raw.metadata else 1),
            DLQ_STAGE_HEADER: self.name,
            DLQ_SUBJECT_HEADER: raw.subject,
            MSG_ID_HEADER: f"dlq:{self.name}:{raw.subject}:{seq}",
        }
        body = msg.body
        if len(body) + _DLQ_HEADROOM > self.deps.max_payload:
            # a body at the size limit cannot travel with the headers: the reason is kept,
            # the body is not (it could never be replayed through a stage anyway)
            headers[DLQ_BODY_HEADER] = f"dropped: {len(body)} bytes, over max_payload"
            body = b""
        await self.deps.js.publish(
            self.deps.subjects.dlq(self.name), body, headers=headers, timeout=5.0
        )
        await msg.reject()  # term: the dead-letter copy is durable now
        self.metrics.dead_lettered += 1
        if self.deps.telemetry is not None:
            self.deps.telemetry.dead_lettered(self.name, category)
        self.metrics.last_error = reason[:200]
        log.warning("stage.dead_lettered", stage=self.name, subject=raw.subject, reason=reason)

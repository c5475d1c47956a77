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

import random

import nats.errors
import nats.js.errors

from memstream.schemas.errors import StorageUnavailable

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

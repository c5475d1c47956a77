"""A durable pull consumer's fetches, on nats-py's public API (``PullLoops``' subscription).

Every request asks with ``no_wait``: the server delivers what it has and ends the request,
so a fetch returns at once with whatever is waiting instead of waiting for a full batch; a
fetch that finds nothing adds an expiry, and the server waits that long for the first
message. A request can still outlive its fetch (the fetch stops waiting before the server
ends it: a full consumer sends no end; a slow link): what it delivers later waits in the
client, in ``Pull.waiting``, and the next fetch returns it first. While the loop waits
instead of fetching (behind a batch held by an outage or an optimize) those messages have
their ack deadline renewed with the batches', or JetStream would deliver them again after
``ack_wait`` and the loop handle them twice (seen in a 30,000-turn ingest run on nats-py's
own ``fetch``, which keeps them in a private queue: docs/benchmarks.md, "twentieth session").

Each request has a reply subject of its own under ``Pull.inbox``, so a status message (no
messages, request expired, a conflict) says which request it ends: an old request's end is
never taken for the end of this fetch's request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

from memstream.consumers.logs import log

# what a status header says (JetStream's pull protocol)
HEARTBEAT, NO_MESSAGES, EXPIRED = "100", "404", "408"
# a request whose expiry passed ends by 408 from the server; past this margin over its
# expiry a fetch stops waiting for it (a reconnect loses the request and its 408)
_EXPIRY_MARGIN_S = 0.1
# a refusal that lasts (the consumer deleted: every request refused) is a warning at most
# this often for one status and reason, with how many came since, not one a fetch
REFUSAL_WARNING_EVERY_S = 60.0


class Pull:
    """Fetches from one durable pull consumer: ``await Pull.bind(nc, stream, durable)``."""

    def __init__(
        self,
        nc: Any,
        stream: str,
        durable: str,
        prefix: str = "$JS.API",
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self._nc = nc
        self.stream, self.durable = stream, durable
        self._next = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        # the subject every request of this puller is answered on: ``<inbox>.<request>``
        self.inbox = nc.new_inbox()
        self._ids = itertools.count()
        self._sub: Any = None
        self.waiting: collections.deque[Any] = collections.deque()
        self._asked: str | None = None  # the request a fetch waits on
        self._over = False  # ... and the server has said it is over
        self._changed = asyncio.Event()
        self.refused = 0  # requests the server refused (any status but 404/408)
        # a refusal said the consumer is gone (deleted under a request: 409; none to ask:
        # 503): the stage loop asks its ``Healer`` to re-create it, and clears this
        self.gone = False
        self._on_refused = on_refused  # the stage's counter (``memstream_stage_refused``)
        # (status, reason) -> when last warned of, and how many came since
        self._warned: dict[tuple[str, str], float] = {}
        self._unwarned: collections.Counter[tuple[str, str]] = collections.Counter()

    @classmethod
    async def bind(
        cls, nc: Any, stream: str, durable: str, on_refused: Callable[[], None] | None = None
    ) -> Pull:
        pull = cls(nc, stream, durable, on_refused=on_refused)
        pull._sub = await nc.subscribe(f"{pull.inbox}.*", cb=pull._arrived)
        return pull

    async def _arrived(self, msg: Any) -> None:
        status = (msg.headers or {}).get("Status")
        if status == HEARTBEAT:
            return
        if status in (NO_MESSAGES, EXPIRED):
            if msg.subject.rsplit(".", 1)[-1] == self._asked:
                self._over = True
        elif status:
            # a refusal (409: the consumer's max_ack_pending reached, a leader change, the
            # consumer deleted under the request; 503: no consumer to ask) ends the request
            # too, but the fetch waits out its timeout: asking again at once would only spin
            # while the condition lasts
            self._refused(status, msg.headers.get("Description") or "")
        else:
            self.waiting.append(msg)
        self._changed.set()

    def _refused(self, status: str, reason: str) -> None:
        """Count a refusal, and warn of it unless this one was warned of lately: a stage
        whose consumer is gone takes nothing, and the operator must hear why."""
        self.refused += 1
        if status == "503" or (status == "409" and "deleted" in reason.lower()):
            self.gone = True
        if self._on_refused is not None:
            self._on_refused()
        key, now = (status, reason), time.monotonic()
        last = self._warned.get(key)
        if last is not None and now - last < REFUSAL_WARNING_EVERY_S:
            self._unwarned[key] += 1
            return
        self._warned[key] = now
        log.warning(
            "pull.request_refused",
            stream=self.stream,
            consumer=self.durable,
            status=status,
            reason=reason,
            times=self._unwarned.pop(key, 0) + 1,
        )

    def _take(self, batch: int, into: list[Any]) -> None:
        while self.waiting and len(into) < batch:
            into.append(self.waiting.popleft())

    async def _ask(self, batch: int, expires_s: float | None, deadline: float) -> None:
        """Ask for up to ``batch`` messages with ``no_wait``: the server delivers what it has
        and ends the request (404, or nothing more once the batch is full); with
        ``expires_s`` it first waits that long for at least one (408 when none came). Wait
        until the request is over, ``batch`` messages are waiting, or ``deadline``."""
        token = str(next(self._ids))
        body: dict[str, Any] = {"batch": batch, "no_wait": True}
        if expires_s is not None:
            body["expires"] = int(expires_s * 1e9)
        self._asked, self._over = token, False
        reply = f"{self.inbox}.{token}"
        await self._nc.publish(self._next, json.dumps(body).encode(), reply=reply)
        while not (self._over or len(self.waiting) >= batch):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def fetch(self, batch: int, wait_s: float) -> list[Any]:
        """Up to ``batch`` messages: at once when any are waiting (in the client, or on the
        server); else the first that arrive within ``wait_s``, with whatever the server has
        by then. Raises ``TimeoutError`` when none came."""
        start = time.monotonic()
        msgs: list[Any] = []
        self._take(batch, msgs)
        if len(msgs) < batch:
            await self._ask(batch - len(msgs), None, start + wait_s)
            self._take(batch, msgs)
        if msgs:
            return msgs
        left = wait_s - (time.monotonic() - start)
        if left <= _EXPIRY_MARGIN_S:
            raise TimeoutError
        await self._ask(batch, left - _EXPIRY_MARGIN_S, start + wait_s)
        self._take(batch, msgs)
        if not msgs:
            raise TimeoutError
        return msgs

    async def close(self) -> None:
        """Stop receiving, and hand back at once what arrived and no fetch returned (nak): it
        is delivered again now rather than after ``ack_wait``."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        left, self.waiting = list(self.waiting), collections.deque()
        with contextlib.suppress(Exception):
            await asyncio.gather(*(m.nak() for m in left))

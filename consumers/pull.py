"""A durable pull consumer's fetches, on nats-py's public API (``PullLoops``' subscription).

A pull request can outlive the fetch that sent it: a fetch returns with the first messages,
and the request goes on delivering until its batch is full or it expires. Those messages
wait in the client until the next fetch, and while the loop waits instead of fetching
(behind a batch held by an outage or an optimize) they must have their ack deadline renewed,
or JetStream delivers them again after ``ack_wait`` and the loop handles them twice (seen in
a 30,000-turn ingest run: docs/benchmarks.md, "twentieth session"). nats-py's own ``fetch``
keeps them in a private queue; here they land in ``Pull.waiting``, which the loop renews.

Each request has a reply subject of its own under one inbox, so a status message (no
messages, request expired, a conflict) says which request it ends: an old lingering
request's end is never taken for the end of this fetch's request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import time
from typing import Any

from memstream.consumers.logs import log

# what a status header says (JetStream's pull protocol)
HEARTBEAT, NO_MESSAGES, EXPIRED = "100", "404", "408"
# a request whose expiry passed ends by 408 from the server; past this margin over its
# expiry a fetch stops waiting for it (a reconnect loses the request and its 408)
_EXPIRY_MARGIN_S = 0.1


class Pull:
    """Fetches from one durable pull consumer: ``await Pull.bind(nc, stream, durable)``."""

    def __init__(self, nc: Any, stream: str, durable: str, prefix: str = "$JS.API") -> None:
        self._nc = nc
        self._next = f"{prefix}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._ids = itertools.count()
        self._sub: Any = None
        self.waiting: collections.deque[Any] = collections.deque()
        self._asked: str | None = None  # the request a fetch waits on
        self._over = False  # ... and the server has said it is over
        self._changed = asyncio.Event()

    @classmethod
    async def bind(cls, nc: Any, stream: str, durable: str) -> Pull:
        pull = cls(nc, stream, durable)
        pull._sub = await nc.subscribe(f"{pull._inbox}.*", cb=pull._arrived)
        return pull

    async def _arrived(self, msg: Any) -> None:
        status = (msg.headers or {}).get("Status")
        if status == HEARTBEAT:
            return
        if status in (NO_MESSAGES, EXPIRED):
            if msg.subject.rsplit(".", 1)[-1] == self._asked:
                self._over = True
        elif status:
            # a conflict (409: the consumer's max_ack_pending reached, a leader change, the
            # consumer deleted) ends the request too, but the fetch waits out its timeout:
            # asking again at once would only spin while the condition lasts
            log.debug("pull.request_refused", status=status, reason=msg.headers.get("Description"))
        else:
            self.waiting.append(msg)
        self._changed.set()

    def _take(self, batch: int, into: list[Any]) -> None:
        while self.waiting and len(into) < batch:
            into.append(self.waiting.popleft())

    async def _request(self, batch: int, expires_s: float | None) -> None:
        token = str(next(self._ids))
        body: dict[str, Any] = {"batch": batch}
        if expires_s is None:
            body["no_wait"] = True
        else:
            body["expires"] = int(expires_s * 1e9)
        self._asked, self._over = token, False
        reply = f"{self._inbox}.{token}"
        await self._nc.publish(self._next, json.dumps(body).encode(), reply=reply)

    async def _until(self, done: Any, deadline: float) -> None:
        """Wait until ``done()`` or ``deadline`` (monotonic)."""
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def fetch(self, batch: int, wait_s: float) -> list[Any]:
        """Up to ``batch`` messages, at once when any are waiting (in the client, or on the
        server: one request with ``no_wait``); else the first that arrive within ``wait_s``
        (a lingering request, which may go on delivering into ``waiting`` after this returns).
        Raises ``TimeoutError`` when none came."""
        start = time.monotonic()
        msgs: list[Any] = []
        self._take(batch, msgs)
        if len(msgs) < batch:
            need = batch - len(msgs)
            await self._request(need, None)
            await self._until(lambda: self._over or len(self.waiting) >= need, start + wait_s)
            self._take(batch, msgs)
        if msgs:
            return msgs
        left = wait_s - (time.monotonic() - start)
        if left <= _EXPIRY_MARGIN_S:
            raise TimeoutError
        await self._request(batch, left - _EXPIRY_MARGIN_S)
        await self._until(lambda: self._over or bool(self.waiting), start + wait_s)
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

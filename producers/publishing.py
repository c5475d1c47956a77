"""Publishing turns, the SDK client's write path: ``PublishResult``, ``PublishCallback`` and
``Publishing``, the methods of ``MemoryClient`` that build a ``TurnEvent`` and publish it to
JetStream, waiting for the PubAck or in the background with retries.

Separate from ``client.py`` (the connection, recall and the management commands, all core NATS
request-reply) because this path is JetStream's, with an ack to check and a fire-and-forget
mode that must never raise into the agent. ``MemoryClient`` mixes it in and supplies the
connection.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.errors import Error as NatsError

from memstream.producers.errors import MemoryClientError, PublishError
from memstream.schemas.events import Message, MetaValue, Role, TurnEvent
from memstream.schemas.subjects import MSG_ID_HEADER, Subjects, msg_id


@dataclass(frozen=True)
class PublishResult:
    event_id: str
    stream: str
    seq: int
    duplicate: bool


RETRY_PAUSE_MAX_S = 5.0  # the longest pause between two tries of a background publish

# called once with (result, None) or (None, error) when a ``wait=False`` publish is done
PublishCallback = Callable[[PublishResult | None, Exception | None], object]


class Publishing:
    """Mixed into ``MemoryClient``, which sets these attributes and supplies ``connect``."""

    tenant: str
    user: str | None
    agent: str | None
    subjects: Subjects
    publish_timeout: float
    publish_failures: int
    _js: Any
    _pending: set[asyncio.Task[Any]]
    retry_for_s: float

    def closes(self) -> tuple[int, int]:
        raise NotImplementedError

    async def connect(self) -> object:
        raise NotImplementedError

    def make_turn(
        self,
        messages: Sequence[Message | dict[str, Any] | tuple[str, str]],
        *,
        session: str = "default",
        user: str | None = None,
        agent: str | None = None,
        event_id: str | None = None,
        metadata: dict[str, MetaValue] | None = None,
        occurred_at: datetime | None = None,
        **fields: Any,
    ) -> TurnEvent:
        """Build a TurnEvent; messages may be Message, dicts, or (role, content) pairs."""
        msgs = [
            Message(role=Role(m[0]), content=m[1])
            if isinstance(m, tuple)
            else m
            if isinstance(m, Message)
            else Message.model_validate(m)
            for m in messages
        ]
        extra: dict[str, Any] = {
            k: v for k, v in (("event_id", event_id), ("occurred_at", occurred_at)) if v is not None
        }
        return TurnEvent(
            tenant=self.tenant,
            user=user or self.user,
            agent=agent or self.agent,
            session=session,
            messages=msgs,
            metadata=metadata or {},
            **extra,
            **fields,
        )

    async def publish(self, event: TurnEvent) -> PublishResult:
        """Publish one event and wait for the PubAck."""
        await self.connect()
        subject = self.subjects.turns(event.tenant, event.owner, event.session)
        try:
            ack = await self._js.publish(
                subject,
                event.model_dump_json().encode(),
                headers={MSG_ID_HEADER: msg_id(event.tenant, event.event_id)},
                timeout=self.publish_timeout,
            )
        except (TimeoutError, NatsError, OSError) as exc:
            raise PublishError(
                f"turn {event.event_id} was not stored: {type(exc).__name__}"
            ) from exc
        return PublishResult(event.event_id, ack.stream, ack.seq, bool(ack.duplicate))

    async def publish_turn(
        self,
        messages: Sequence[Message | dict[str, Any] | tuple[str, str]],
        *,
        wait: bool = True,
        on_done: PublishCallback | None = None,
        **kwargs: Any,
    ) -> PublishResult | None:
        """Publish a turn. ``wait=False``: return at once, never raise (counted on failure);
        ``on_done(result, error)`` is then called once with the outcome, after the retries
        (an exception it raises is ignored)."""
        event = self.make_turn(messages, **kwargs)
        if wait:
            return await self.publish(event)
        task = asyncio.create_task(self._publish_quietly(event, on_done, self.closes()))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return None

    async def _publish_quietly(
        self, event: TurnEvent, on_done: PublishCallback | None, begun: tuple[int, int]
    ) -> None:
        """Publish in the background, trying again while NATS is away (seed 001: queue and
        retry, never lose the turn to a short outage) for ``retry_for_s``, at least three
        times, and no longer once the client is closing. Each try carries the same message
        id, so a turn stored by a try whose ack was lost is not stored twice."""
        error: MemoryClientError | None = None
        give_up = time.monotonic() + self.retry_for_s  # ``begun``: ``closes()`` when asked
        for attempt in itertools.count():
            try:
                result = await self.publish(event)
            except MemoryClientError as exc:
                error = exc
                if self.closes() != begun or (attempt >= 2 and time.monotonic() >= give_up):
                    break
                await asyncio.sleep(min(0.2 * 2**attempt, RETRY_PAUSE_MAX_S))
                continue
            _report(on_done, result, None)
            return
        self.publish_failures += 1
        _report(on_done, None, error)


def _report(
    on_done: PublishCallback | None, result: PublishResult | None, error: Exception | None
) -> None:
    if on_done is None:
        return
    try:
        on_done(result, error)
    except Exception:  # noqa: BLE001 (the caller's callback never breaks the background publish)
        return

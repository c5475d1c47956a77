"""How far the pipeline has got with a session's turns (for ``flush`` and for showing turns
not yet processed), read from JetStream's own bookkeeping: no state of our own.

- A turn is *extracted* once the extract consumer's ack floor reached its stream sequence
  (every turn at or below the floor has been acked, which extract does only after its
  candidates are durable in ``MEM_STAGES``), or the consumer holds nothing pending at all.
- Candidates are *stored and indexed* once ``MEM_STAGES`` (a work queue: acked messages are
  removed) holds nothing for the caller's owner: the store stage acks only after the row is
  written and the index point upserted (or kept for the reconciler when the index is down).
  A stage subject names the candidate's owner, so the count is one server-side count over
  that owner's subjects, and says nothing about the tenant's other owners.

Both are conservative: another session of the same owner still in flight makes a flush
wait for it too, never return early.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from memstream.producers.client import MemoryClient, MemoryClientError
from memstream.schemas.events import TurnEvent
from memstream.schemas.ids import owner_key


@dataclass(frozen=True)
class Progress:
    last_seq: int  # the session's newest turn in MEM_TURNS (0: none)
    extracted_through: int  # the extract consumer's ack floor
    extract_idle: bool  # the extract consumer has nothing pending or unacked
    held_in_stages: int  # candidates of the owner still between redact and store

    @property
    def turns_extracted(self) -> bool:
        return self.extract_idle or self.last_seq <= self.extracted_through

    @property
    def done(self) -> bool:
        return self.turns_extracted and self.held_in_stages == 0

    def pending(self) -> dict[str, int | bool]:
        return {
            "turns_waiting_for_extract": not self.turns_extracted,
            "candidates_in_stages": self.held_in_stages,
        }


async def _js(mem: MemoryClient) -> Any:
    try:
        return await mem.jetstream()
    except MemoryClientError:
        raise
    except (NatsError, OSError, TimeoutError) as exc:
        raise MemoryClientError("the memory service is unreachable") from exc


async def progress(mem: MemoryClient, owner: str, session: str) -> Progress:
    """Where the pipeline is with ``mem.tenant``'s session ``session`` of ``owner`` (the
    turn subject's owner token); the candidates counted are those of ``mem``'s owner."""
    js = await _js(mem)
    s = mem.subjects
    mine = s.stage_owner_filter(mem.tenant, owner_key(mem.user, mem.agent))
    try:
        try:
            last = (
                await js.get_last_msg(s.stream("turns"), s.turns(mem.tenant, owner, session))
            ).seq
        except NotFoundError:
            last = 0
        info = await js.consumer_info(s.stream("turns"), s.durable("extract"))
        stages = await js.stream_info(s.stream("stages"), subjects_filter=mine)
    except (NatsError, OSError, TimeoutError) as exc:
        raise MemoryClientError("the pipeline's progress cannot be read") from exc
    held = sum((stages.state.subjects or {}).values()) if stages.state.messages else 0
    return Progress(
        last_seq=int(last or 0),
        extracted_through=int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0,
        extract_idle=not info.num_pending and not info.num_ack_pending,
        held_in_stages=held,
    )


async def turns_after(
    mem: MemoryClient, owner: str, session: str, after_seq: int, limit: int = 100
) -> list[tuple[int, TurnEvent]]:
    """The session's turns with a stream sequence above ``after_seq`` (oldest first)."""
    js = await _js(mem)
    s = mem.subjects
    subject = s.turns(mem.tenant, owner, session)
    out: list[tuple[int, TurnEvent]] = []
    seq = after_seq + 1
    try:
        while len(out) < limit:
            try:
                msg = await js.get_msg(s.stream("turns"), seq=seq, subject=subject, next=True)
            except NotFoundError:
                break
            # not a turn event: the extract stage dead-letters it
            with contextlib.suppress(ValueError):
                out.append((msg.seq, TurnEvent.model_validate_json(msg.data or b"")))
            seq = msg.seq + 1
    except (NatsError, OSError, TimeoutError) as exc:
        raise MemoryClientError("the session's turns cannot be read") from exc
    return out


async def wait_processed(
    mem: MemoryClient, session: str, owner: str | None = None, within_s: float = 30.0
) -> Progress:
    """Wait until every turn published to ``session`` so far is processed and recallable, or
    ``within_s`` seconds pass; returns the last ``Progress`` (``done`` says which)."""
    who = owner or mem.user or mem.agent or "_"
    deadline = time.monotonic() + within_s
    delay = 0.02
    while True:
        state = await progress(mem, who, session)
        left = deadline - time.monotonic()
        if state.done or left <= 0:
            return state
        await asyncio.sleep(min(delay, left))
        if mem.closed:  # closed while waiting: reading on would open a connection again
            raise MemoryClientError("the client was closed")
        delay = min(delay * 1.5, 0.25)

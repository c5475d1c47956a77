"""``memstream dlq list|replay``: look at what a stage gave up on, and send it back.

A dead-lettered message keeps its body and, in headers, the stage, the reason and the subject
it came from. ``replay`` publishes each back to that subject (a fresh ``Nats-Msg-Id``, so the
duplicate window does not drop it) and deletes it from the dead-letter stream once the PubAck
arrived. Every write downstream is idempotent, so replaying twice changes nothing. Only the
namespace's own turn and stage subjects are accepted as targets: a header naming anything else
(``mem.events.*``, another namespace, a request subject) is refused and the message stays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeout

from memstream.consumers.natsconn import nats_options
from memstream.producers.connection import servers
from memstream.schemas.owners import belongs_to as belongs_to  # commands.py imports it here
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import (
    DLQ_REASON_HEADER,
    DLQ_STAGE_HEADER,
    DLQ_SUBJECT_HEADER,
    MSG_ID_HEADER,
    Subjects,
)


async def dead_letters(js: Any, s: Subjects, stage: str | None, limit: int) -> list[Any]:
    """Up to ``limit`` dead-lettered messages (oldest first), without consuming them."""
    return await stored(js, s.stream("dlq"), s.dlq(stage), limit)


async def stored(js: Any, stream: str, subject: str, limit: int) -> list[Any]:
    """Up to ``limit`` messages of ``stream`` on ``subject`` (oldest first), unconsumed."""
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    out: list[Any] = []
    try:
        while len(out) < limit:
            try:
                out.append(await sub.next_msg(timeout=0.5))
            except NatsTimeout:
                break
    finally:
        await sub.unsubscribe()
    return out


async def run(a: argparse.Namespace, settings: Settings, nats_url: str) -> int:
    s = Subjects(settings.namespace)
    nc = await nats.connect(servers(nats_url), **nats_options(settings))
    js = nc.jetstream()
    try:
        msgs = await dead_letters(js, s, a.stage, a.limit)
        if a.action == "list":
            for m in msgs:
                h = m.headers or {}
                row = {
                    "seq": m.metadata.sequence.stream,
                    "stage": h.get(DLQ_STAGE_HEADER),
                    "subject": h.get(DLQ_SUBJECT_HEADER),
                    "reason": h.get(DLQ_REASON_HEADER),
                    "bytes": len(m.data),
                }
                print(json.dumps(row))
            print(f"{len(msgs)} dead-lettered message(s)")
            return 0
        replayed = refused = 0
        for m in msgs:
            subject = (m.headers or {}).get(DLQ_SUBJECT_HEADER)
            if not subject or not s.replayable(subject):
                refused += 1  # kept in the dead-letter stream, for a person to look at
                continue
            await js.publish(subject, m.data, headers={MSG_ID_HEADER: f"replay:{uuid.uuid4()}"})
            await js.delete_msg(s.stream("dlq"), m.metadata.sequence.stream)
            replayed += 1
        print(f"replayed {replayed} message(s)")
        if refused:
            print(
                f"refused {refused} message(s) whose {DLQ_SUBJECT_HEADER} is not a turn or "
                "stage subject of this namespace (left in the dead-letter stream)"
            )
        return 0
    finally:
        await nc.close()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dlq", help="list or replay dead-lettered messages")
    p.add_argument("action", choices=["list", "replay"])
    p.add_argument("--stage", default=None, help="one stage (default: all)")
    p.add_argument("--limit", type=int, default=1000)

    def main(a: argparse.Namespace) -> int:
        from memstream.producers.client import discover_nats_url

        settings = Settings()
        return asyncio.run(run(a, settings, settings.nats_url or discover_nats_url()))

    p.set_defaults(func=main)

"""The dead-letter stream as the console handles it: ``DeadLetter`` (one message there, its
reason redacted) and ``DeadLetters``, the console backend's methods that list, inspect, replay
and discard them.

Separate from ``backend.py`` (the connection, the overview, memories, events and the audit)
because this is the part that handles the pipeline's failed messages: it reads their bodies and
sends them back into the pipeline, which nothing else in the console does. ``ConsoleBackend``
mixes it in and supplies the stream reads, the redaction and the audit.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nats.errors import Error as NatsError

from memstream.console.errors import ConsoleError
from memstream.schemas.owners import tenant_of
from memstream.schemas.subjects import (
    DLQ_DELIVERIES_HEADER,
    DLQ_REASON_HEADER,
    DLQ_STAGE_HEADER,
    DLQ_SUBJECT_HEADER,
    MSG_ID_HEADER,
    Subjects,
)

SHOWN_CHARS = 256 * 1024  # of a dead letter's body


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    stage: str
    subject: str
    reason: str  # redacted
    deliveries: str
    at: datetime
    size: int
    tenant: str | None


class DeadLetters:
    """Mixed into ``ConsoleBackend``, which supplies the members that raise here."""

    @property
    def subjects(self) -> Subjects:
        raise NotImplementedError

    @property
    def js(self) -> Any:
        raise NotImplementedError

    async def _read(self, subject: str, stream: str, limit: int, start_seq: int = 0) -> list[Any]:
        raise NotImplementedError

    async def redact(self, items: list[tuple[str | None, str]]) -> list[tuple[str, dict[str, int]]]:
        raise NotImplementedError

    async def audit(self, action: str, tenant: str | None, **detail: Any) -> None:
        raise NotImplementedError

    def _dead_letter(
        self, headers: dict[str, str] | None, data: bytes, seq: int, at: datetime, reason: str
    ) -> DeadLetter:
        h = headers or {}
        tenant = tenant_of(data)
        return DeadLetter(
            seq=seq,
            stage=h.get(DLQ_STAGE_HEADER, "?"),
            subject=h.get(DLQ_SUBJECT_HEADER, "?"),
            reason=reason,
            deliveries=h.get(DLQ_DELIVERIES_HEADER, "?"),
            at=at,
            size=len(data),
            tenant=tenant,
        )

    async def dead_letters(self, stage: str | None, limit: int = 200) -> list[DeadLetter]:
        """The newest ``limit`` dead letters (of one stage, or all), newest first."""
        s = self.subjects
        try:
            info = await self.js.stream_info(s.stream("dlq"), subjects_filter=s.dlq(stage))
        except (NatsError, TimeoutError) as exc:
            raise ConsoleError("the dead-letter stream cannot be read") from exc
        if not info.state.subjects:
            return []
        msgs = (await self._read(s.dlq(stage), s.stream("dlq"), limit=10_000))[-limit:]
        reasons = await self.redact(
            [(tenant_of(m.data or b""), (m.headers or {}).get(DLQ_REASON_HEADER, "")) for m in msgs]
        )
        out = [
            self._dead_letter(
                m.headers, m.data or b"", m.metadata.sequence.stream, m.metadata.timestamp, r
            )
            for m, (r, _) in zip(msgs, reasons, strict=True)
        ]
        return out[::-1]

    async def _get(self, seq: int) -> tuple[DeadLetter, bytes]:
        try:
            raw = await self.js.get_msg(self.subjects.stream("dlq"), seq)
        except (NatsError, TimeoutError) as exc:
            raise ConsoleError(
                f"dead letter {seq} does not exist (replayed or discarded?)"
            ) from exc
        data = raw.data or b""
        reason = (raw.headers or {}).get(DLQ_REASON_HEADER, "")
        ((redacted, _),) = await self.redact([(tenant_of(data), reason)])
        at = raw.time or datetime.now(UTC)
        return self._dead_letter(raw.headers, data, seq, at, redacted), data

    async def dead_letter(self, seq: int) -> tuple[DeadLetter, str, dict[str, int]]:
        """One dead letter, its body redacted (pretty JSON when it decodes) and the counts of
        what was redacted."""
        letter, data = await self._get(seq)
        text = data.decode("utf-8", errors="replace")
        with contextlib.suppress(ValueError):
            text = json.dumps(json.loads(data), indent=2, ensure_ascii=False)
        ((body, counts),) = await self.redact([(letter.tenant, text[:SHOWN_CHARS])])
        return letter, body, counts

    async def replay(self, seq: int) -> DeadLetter:
        """Publish a dead letter back to its subject (fresh ``Nats-Msg-Id``, so the duplicate
        window does not drop it), then delete it from the dead-letter stream."""
        letter, data = await self._get(seq)
        s = self.subjects
        # only back into the pipeline's streams: a forged header must not make the console
        # send a command or a recall
        if not letter.subject.startswith((f"{s.prefix}.turns.", f"{s.prefix}.stage.")):
            raise ConsoleError(f"dead letter {seq} names no pipeline subject to replay to")
        try:
            await self.js.publish(
                letter.subject, data, headers={MSG_ID_HEADER: f"replay:{uuid.uuid4()}"}
            )
            await self.js.delete_msg(self.subjects.stream("dlq"), seq)
        except (NatsError, TimeoutError) as exc:
            raise ConsoleError(f"replay of {seq} failed: {type(exc).__name__}") from exc
        await self.audit("dlq.replay", letter.tenant, seq=seq, stage=letter.stage)
        return letter

    async def discard(self, seq: int) -> DeadLetter:
        letter, _ = await self._get(seq)
        try:
            await self.js.delete_msg(self.subjects.stream("dlq"), seq)
        except (NatsError, TimeoutError) as exc:
            raise ConsoleError(f"discard of {seq} failed: {type(exc).__name__}") from exc
        await self.audit("dlq.discard", letter.tenant, seq=seq, stage=letter.stage)
        return letter

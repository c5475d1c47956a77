"""The turn event agents publish on ``mem.turns.<tenant>.<owner>.<session>``."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    field_validator,
)

# Ids are free text (any character is safe in subjects: see memstream.schemas.subjects) but
# for control characters, which are refused: Postgres cannot store NUL, and the id functions
# join parts with control separators (memstream.schemas.ids). Bounded so one event cannot
# carry megabytes of identifiers.
_NO_CONTROL = r"^[^\x00-\x1f\x7f-\x9f]*$"
Ident = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_NO_CONTROL)]
OptIdent = Ident | None
Tag = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_NO_CONTROL)]
MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=_NO_CONTROL)]


def without_nul(text: str) -> str:
    """Free text loses its NUL characters: they carry no meaning in a message, and Postgres
    refuses them in text and jsonb (SQLSTATE 22021 / 22P05)."""
    return text.replace("\x00", "") if "\x00" in text else text


# Free text (contents, queries, metadata values): normalised, never refused for a NUL.
Text = Annotated[str, AfterValidator(without_nul)]


def _json_without_nul(value: JsonValue) -> JsonValue:
    """A JSON value with NUL removed from every string in it, keys included."""
    if isinstance(value, str):
        return without_nul(value)
    if isinstance(value, list):
        return [_json_without_nul(v) for v in value]
    if isinstance(value, dict):
        return {without_nul(k): _json_without_nul(v) for k, v in value.items()}
    return value


# Metadata values are JSON: structured values such as seed 004's task_context are allowed, and
# the redact stage redacts every string inside them.
MetaValue = Annotated[JsonValue, AfterValidator(_json_without_nul)]
MAX_METADATA_CHARS = 16_000


def _bounded(value: dict[str, JsonValue]) -> dict[str, JsonValue]:
    if len(json.dumps(value, default=str)) > MAX_METADATA_CHARS:
        raise ValueError(f"metadata is over {MAX_METADATA_CHARS:,} characters as JSON")
    return value


# Metadata as it comes in: every candidate of a turn carries a copy, and the redact stage
# scans each string, so it is bounded (64 keys, 16,000 characters as JSON); stored records
# are read back as ``dict[str, MetaValue]``, unbounded.
Metadata = Annotated[dict[MetaKey, MetaValue], Field(max_length=64), AfterValidator(_bounded)]
# A tenant credential: never shown in a repr, a log line or a reply.
ApiKey = Annotated[str | None, Field(default=None, repr=False, max_length=200)]


class Role(StrEnum):
    """Who wrote a message. Only ``user`` and final ``assistant`` messages become memories."""

    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"
    REASONING = "reasoning"
    MEMORY = "memory"  # memories recalled into the prompt: never re-stored


class Message(BaseModel):
    """One message of a turn."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: Annotated[Text, StringConstraints(max_length=1_000_000)] = ""
    timestamp: datetime | None = None
    sender: OptIdent = None
    # An assistant message that only calls tools, or an intermediate (non-final) one.
    tool_calls: list[dict[str, JsonValue]] = Field(default_factory=list)
    final: bool = True


class TurnEvent(BaseModel):
    """A conversation turn: the unit agents publish.

    ``event_id`` is the idempotency key (sent as ``Nats-Msg-Id``): a retried
    publish of the same event is stored once.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    event_id: Ident = Field(default_factory=lambda: str(uuid.uuid4()))
    tenant: Ident
    app: OptIdent = None
    project: OptIdent = None
    user: OptIdent = None
    agent: OptIdent = None
    session: Ident = "default"
    turn_id: OptIdent = None
    messages: Annotated[list[Message], Field(min_length=1, max_length=1000)]
    metadata: Metadata = Field(default_factory=dict)
    tags: Annotated[list[Tag], Field(max_length=32)] = Field(default_factory=list)
    occurred_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @field_validator("occurred_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    @property
    def owner(self) -> str:
        """The owner token of the subject: the user if any, else the agent."""
        return self.user or self.agent or "_"

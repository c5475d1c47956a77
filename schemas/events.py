"""The turn event agents publish on ``mem.turns.<tenant>.<owner>.<session>``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StringConstraints, field_validator

SCHEMA_VERSION = 1

# Ids are free text (any character is safe in subjects: see memstream.schemas.subjects),
# bounded so one event cannot carry megabytes of identifiers.
Ident = Annotated[str, StringConstraints(min_length=1, max_length=200)]
OptIdent = Annotated[str, StringConstraints(min_length=1, max_length=200)] | None
# Metadata values: JSON (structured values such as seed 004's task_context are allowed; the
# redact stage redacts every string inside them).
MetaValue = JsonValue
Tag = Annotated[str, StringConstraints(min_length=1, max_length=64)]
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
    content: Annotated[str, StringConstraints(max_length=1_000_000)] = ""
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
    metadata: dict[str, MetaValue] = Field(default_factory=dict)
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

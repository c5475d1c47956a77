"""Memories: the candidates stages hand each other and the stored record."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from memstream.schemas.events import Ident, Metadata, MetaValue, OptIdent, Tag, Text
from memstream.schemas.ids import owner_key

# The longest memory text a candidate may carry: an episode is cut at 8,000 characters and a
# typed sentence at 2,000; an explicit ``remember`` takes up to 50,000. A larger candidate on
# a stage subject is refused (dead-lettered with the reason), so no stage works on megabytes.
MAX_CANDIDATE_CHARS = 50_000


def dated(text: str, when: datetime) -> str:
    """``[8 May 2023] text``: the text a memory's dense vector is made of (the date as words,
    so questions naming a month or year match). A check for a stored memory that a text
    duplicates embeds the text dated the same way: the same text undated scores ~0.8 against
    its own dated vector, under any near-duplicate threshold."""
    return f"[{when.day} {when:%B %Y}] {text}"


class MemoryType(StrEnum):
    EPISODE = "episode"
    PROFILE = "profile"
    PREFERENCE = "preference"
    RULE = "rule"
    DECISION = "decision"
    FACT = "fact"
    FIX = "fix"
    TODO = "todo"
    TASK_BLUEPRINT = "task_blueprint"
    SKILL_HEURISTIC = "skill_heuristic"
    DOMAIN_PATTERN = "domain_pattern"
    LESSON_LEARNED = "lesson_learned"


class Scope(StrEnum):
    RUN = "run"
    SESSION = "session"
    USER = "user"
    PROJECT = "project"
    GLOBAL = "global"


# scopes other owners of the tenant may read (docs/memory-model.md)
SHARED_SCOPES = frozenset({Scope.PROJECT, Scope.GLOBAL})
# scopes whose memories end with their session or run (TTL, end of run)
SESSION_BOUND = frozenset({Scope.RUN, Scope.SESSION})

Unit = Annotated[float, Field(ge=0.0, le=1.0)]


class Owner(BaseModel):
    """Whose memory it is. Every read and write is filtered by tenant and owner."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: Ident
    user: OptIdent = None
    agent: OptIdent = None

    @property
    def key(self) -> str:
        key: str = owner_key(self.user, self.agent)
        return key


class Candidate(BaseModel):
    """A memory candidate, as it travels extract -> redact -> dedupe -> store."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    candidate_id: str
    owner: Owner
    app: OptIdent = None
    project: OptIdent = None
    session: Ident
    type: MemoryType = MemoryType.EPISODE
    scope: Scope = Scope.USER
    content: Annotated[Text, StringConstraints(max_length=MAX_CANDIDATE_CHARS)]
    salience: Unit = 0.5
    confidence: Unit = 1.0
    importance: Unit = 0.5
    source_event_id: Ident
    occurred_at: datetime
    metadata: Metadata = Field(default_factory=dict)
    # Filled by redact: counts by placeholder type. Never the values.
    redactions: dict[str, int] = Field(default_factory=dict)
    redacted: bool = False
    pinned: bool = False
    expires_at: datetime | None = None
    tags: list[Tag] = Field(default_factory=list)
    # Filled by redact: the dense vector of the dated, redacted content, which dedupe searches
    # with and store indexes, instead of each embedding the same text again. Optional: a
    # candidate without it is embedded where needed (docs/ingest.md, wire schema).
    vector: list[float] | None = Field(default=None, max_length=4096)
    # Filled by redact: the id of its redaction key (``pipeline.redact.key_id``, never the
    # key) and of the model that made ``vector``: dedupe and store refuse a candidate redacted
    # with another key (its placeholders would not match theirs) and embed again a vector of
    # another model.
    key_id: str | None = Field(default=None, max_length=64)
    vector_model: str | None = Field(default=None, max_length=64)


class MemoryRecord(BaseModel):
    """A stored memory, as recall and the management commands return it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    tenant: str
    user: str | None = None
    agent: str | None = None
    app: str | None = None
    project: str | None = None
    session: str
    type: MemoryType
    scope: Scope
    content: str
    content_hash: str
    salience: float = 0.5
    confidence: float = 1.0
    importance: float = 0.5
    pinned: bool = False
    access_count: int = 0
    source_event_ids: list[str] = Field(default_factory=list)
    metadata: dict[str, MetaValue] = Field(default_factory=dict)
    occurred_at: datetime
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None = None
    deleted_at: datetime | None = None
    indexed: bool = False
    last_accessed_at: datetime | None = None
    fact_key: str | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    superseded_by: str | None = None
    tags: list[str] = Field(default_factory=list)


class MemoryEvent(BaseModel):
    """Published on ``mem.events.<tenant>``: what happened to a memory, never its content."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    kind: str  # stored, merged, forgotten, erased, expired, pinned, unpinned, superseded ...
    tenant: str
    memory_id: str | None = None
    user: str | None = None  # the owner (ids only, never content)
    agent: str | None = None
    type: MemoryType | None = None
    source_event_id: str | None = None
    at: datetime
    detail: dict[str, MetaValue] = Field(default_factory=dict)

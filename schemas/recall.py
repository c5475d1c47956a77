"""Recall request and reply (``mem.recall``, core request-reply)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memstream.schemas.events import ApiKey, Ident, MetaValue, OptIdent, Tag, Text
from memstream.schemas.memory import MemoryType, Scope


class Method(StrEnum):
    KEYWORD = "keyword"
    VECTOR = "vector"
    HYBRID = "hybrid"


class Context(StrEnum):
    """Which of the owner's memories to search."""

    ALL = "all"  # everything of the owner
    SESSION = "session"  # only the request's session
    RESOURCES = "resources"  # shared knowledge: project and global scopes


MAX_QUERY_CHARS = 10_000
MAX_HITS = 100  # top_k = -1 returns every hit above the threshold, at most this many


class Caller(BaseModel):
    """Who asks: the tenant's credential and the owner. Every request on ``mem.recall`` and
    ``mem.cmd.*`` starts with these fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    tenant: Ident
    api_key: ApiKey = None  # the tenant's credential (required when the server says so)
    user: OptIdent = None
    agent: OptIdent = None
    # the caller's project: reads also see its ``project``-scope memories (docs/memory-model.md)
    project: OptIdent = None

    @model_validator(mode="after")
    def _owner(self) -> Caller:
        if not (self.user or self.agent):
            raise ValueError("a command needs an owner: user and/or agent")
        return self


class RecallRequest(Caller):
    """What an agent asks. The server adds the tenant and owner filters; the caller can
    narrow them (types, scopes, session, time range, tags) but never widen them: every filter
    is AND-ed with the owner scope."""

    session: OptIdent = None
    query: Annotated[Text, Field(min_length=1, max_length=MAX_QUERY_CHARS)]
    top_k: Annotated[int, Field(ge=-1, le=MAX_HITS)] = 10  # -1: all above the threshold
    method: Method = Method.HYBRID
    context: Context = Context.ALL
    types: list[MemoryType] = Field(default_factory=list)
    scopes: list[Scope] = Field(default_factory=list)
    tags: Annotated[list[Tag], Field(max_length=32)] = Field(default_factory=list)
    occurred_from: datetime | None = None
    occurred_to: datetime | None = None
    score_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0  # the "radius"
    token_budget: Annotated[int, Field(ge=1)] | None = None  # trim hits to fit ~this many tokens
    cache: bool = True  # use the shared query cache
    # count an access on the caller's own hits: a search that is no read by the caller (a
    # commit's duplicate check) must not rank those memories up as if they were used
    touch: bool = True
    # record this read in the tenant's audit trail (``memory_events``) under this kind, with
    # the caller and the ids returned, never the query (a cached answer is recorded too)
    activity: Literal["agent_memory_query", "memory_recall"] | None = None

    @model_validator(mode="after")
    def _owner(self) -> RecallRequest:
        if not (self.user or self.agent):
            raise ValueError("recall needs an owner: user and/or agent")
        if self.top_k == 0:
            raise ValueError("top_k must be 1..100, or -1 for every hit above the threshold")
        if self.context is Context.SESSION and not self.session:
            raise ValueError("context 'session' needs a session")
        return self

    @property
    def limit(self) -> int:
        return MAX_HITS if self.top_k == -1 else self.top_k


class Hit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    text: str
    type: MemoryType
    scope: Scope
    score: float  # the fused score: min-max normalised per query, for ranking
    # an absolute relevance in 0..1 that means the same across queries (a threshold can cut
    # on it; pipeline/fuse.py `calibrated`); None when the reply came from a fallback
    calibrated: float | None = None
    session: str
    user: str | None = None
    agent: str | None = None
    source_event_ids: list[str] = Field(default_factory=list)
    metadata: dict[str, MetaValue] = Field(default_factory=dict)
    occurred_at: datetime
    created_at: datetime
    pinned: bool = False
    tags: list[str] = Field(default_factory=list)


class RecallReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    ok: Literal[True] = True
    hits: list[Hit]
    method: Method
    # Legs that failed and were left out (e.g. ["vector"]); empty when all answered.
    degraded: list[str] = Field(default_factory=list)
    cached: bool = False
    truncated: bool = False  # hits were dropped to fit the token budget
    # the worker's time in ms: "total", "search" (until the hits were chosen), and the parts
    # that ran: "embed" (query embedding), "dense" and "keyword" (the legs' searches),
    # "fetch" (reading the hits' records)
    timings_ms: dict[str, float] = Field(default_factory=dict)

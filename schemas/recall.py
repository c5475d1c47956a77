"""Recall request and reply (``mem.recall``, core request-reply)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memstream.schemas.events import Ident, MetaValue, OptIdent
from memstream.schemas.memory import MemoryType, Scope


class Method(StrEnum):
    KEYWORD = "keyword"
    VECTOR = "vector"
    HYBRID = "hybrid"


class RecallRequest(BaseModel):
    """What an agent asks. The server adds the tenant and owner filters; the
    caller can narrow them (types, scopes, session) but never widen them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    tenant: Ident
    user: OptIdent = None
    agent: OptIdent = None
    session: OptIdent = None
    query: Annotated[str, Field(min_length=1, max_length=10_000)]
    top_k: Annotated[int, Field(ge=1, le=100)] = 10
    method: Method = Method.HYBRID
    types: list[MemoryType] = Field(default_factory=list)
    scopes: list[Scope] = Field(default_factory=list)
    score_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0

    @model_validator(mode="after")
    def _owner(self) -> RecallRequest:
        if not (self.user or self.agent):
            raise ValueError("recall needs an owner: user and/or agent")
        return self


class Hit(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    text: str
    type: MemoryType
    scope: Scope
    score: float
    session: str
    user: str | None = None
    agent: str | None = None
    source_event_ids: list[str] = Field(default_factory=list)
    metadata: dict[str, MetaValue] = Field(default_factory=dict)
    occurred_at: datetime
    created_at: datetime


class RecallReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    ok: Literal[True] = True
    hits: list[Hit]
    method: Method
    # Legs that failed and were left out (e.g. ["vector"]); empty when all answered.
    degraded: list[str] = Field(default_factory=list)
    timings_ms: dict[str, float] = Field(default_factory=dict)

"""The wire shapes of seeds 000 and 003's memory routes (``memories.py`` serves them): the
requests, with every check a request must pass before any call is made, the replies, and the
seed's ``memory_type`` names for memstream's types.

Separate from the routes because they are the contract a client sees (the OpenAPI schema),
which holds whatever the handlers do to answer a search, an add or a flush.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from memstream.gateway.models import Body, ChatSession, Id
from memstream.schemas.memory import MemoryType

SeedScope = Literal["current_chat", "resources", "all_user_memory"]
SeedType = Literal["episode", "profile", "agent_case", "agent_skill", "unprocessed_message"]

SEED_TYPE: dict[MemoryType, SeedType] = {
    MemoryType.EPISODE: "episode",
    MemoryType.PROFILE: "profile",
    MemoryType.PREFERENCE: "profile",
    MemoryType.FACT: "profile",
    MemoryType.RULE: "profile",
    MemoryType.DECISION: "agent_case",
    MemoryType.FIX: "agent_case",
    MemoryType.TODO: "agent_case",
    MemoryType.TASK_BLUEPRINT: "agent_case",
    MemoryType.LESSON_LEARNED: "agent_case",
    MemoryType.SKILL_HEURISTIC: "agent_skill",
    MemoryType.DOMAIN_PATTERN: "agent_skill",
}
PROFILE_TYPES = frozenset(t for t, s in SEED_TYPE.items() if s == "profile")


class Caller(Body):
    user_id: Id
    # optional in the schema so that a missing key is 401 (not 422), like a wrong one
    user_key: str | None = Field(None, repr=False, description="the API key (a secret)")
    app_id: Id = "default"
    project_id: Id = "default"
    agent_id: Id | None = None


class SearchRequest(Caller):
    conversation_id: Id | None = None
    query: Annotated[str, StringConstraints(min_length=1, max_length=10_000)]
    scope: Annotated[list[SeedScope], Field(min_length=1, max_length=3)] = [
        "current_chat",
        "resources",
    ]
    top_k: int = Field(default=8, description="1..100, or -1 for every result above the radius")
    method: Literal["keyword", "vector", "hybrid", "agentic"] = "hybrid"
    radius: Annotated[float, Field(ge=0, le=1)] | None = None
    include_profile: bool = True
    enable_llm_rerank: bool = True
    filters: dict[str, Any] | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v != -1 and not 1 <= v <= 100:
            raise ValueError("top_k must be 1..100, or -1 for every result above the radius")
        return v

    @model_validator(mode="after")
    def _chat(self) -> SearchRequest:
        if len(set(self.scope)) != len(self.scope):
            raise ValueError("scope lists a scope twice")
        if "current_chat" in self.scope and not self.conversation_id:
            raise ValueError("scope current_chat needs conversation_id")
        return self


class SearchResult(BaseModel):
    id: str
    session_id: str
    text: str
    score: float | None = Field(description="calibrated relevance 0..1 (null: unprocessed turn)")
    rank_score: float | None = Field(description="the fused score the ranking used (per query)")
    source_scope: SeedScope
    memory_type: SeedType
    resource_uri: str | None = None
    user_id: str | None = None
    agent_id: str | None = None
    created_at: datetime | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)


class SearchResponse(BaseModel):
    results: list[SearchResult]
    method: str
    agentic: str | None = None
    rerank: str | None = None
    degraded: list[str] = Field(default_factory=list)
    filters: dict[str, Any] = Field(
        default_factory=dict, description="per scope: the composed filter applied"
    )


class AddMessage(Body):
    sender_id: Id
    role: Literal["user", "assistant", "system", "tool"]
    timestamp: Annotated[int, Field(ge=1, le=32_503_680_000_000, description="Unix epoch ms")]
    content: Annotated[str, StringConstraints(max_length=1_000_000)]


class AddRequest(Caller):
    session_id: ChatSession
    messages: Annotated[list[AddMessage], Field(min_length=1, max_length=1000)]

    @model_validator(mode="after")
    def _monotonic(self) -> AddRequest:
        stamps = [m.timestamp for m in self.messages]
        if stamps != sorted(stamps):
            raise ValueError("message timestamps must not decrease")
        return self


class AddResponse(BaseModel):
    status: Literal["accepted"] = "accepted"
    session_id: str
    event_id: str
    stream_seq: int
    duplicate: bool = Field(description="this add was already stored (a retry): nothing new")


class FlushRequest(Caller):
    session_id: ChatSession
    timeout_s: Annotated[float, Field(gt=0, le=120)] | None = None


class FlushResponse(BaseModel):
    status: Literal["flushed", "pending"]
    session_id: str
    waited_ms: float
    pending: dict[str, int | bool]

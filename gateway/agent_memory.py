"""Seed 004: ``/api/agent-memory/commit|query|list|peer-query|pending-review``.

Auth: ``Authorization: Bearer <key>``. ``agent_name`` is the memstream *agent* (a key bound
to an agent only serves that agent; the user, if the key is bound to one, is the key's).
The four tiers are memstream memory types of the same names. ``task_context`` is stored as
structured metadata (its strings are redacted like the content).

- ``commit``: exact duplicates (same agent, type and normalised content) are one memory;
  near duplicates are the agent's memories of the same tier whose embedding cosine is >= 0.9
  (the seed's Voyage distance < 0.2, on memstream's static embedding): the existing memory
  is kept, returned with ``duplicate_detected: true`` and given the commit's task_context (the
  seed's UPDATE). The duplicate check counts no access: it is no read by the agent.
- ``query`` (limit <= 20) counts an access on every result and is recorded in the audit trail
  (``agent_memory_query``; a peer read is ``peer_memory_query``, recorded by the worker's
  ``peer_query``). Its composite score is the seed's
  ``relevance * 0.625 + access_frequency * 0.25 + outcome * 0.125``, where relevance is
  memstream's fused hybrid score (the seed's normalised RRF: memstream fuses the keyword and
  dense legs linearly, which ranks better than RRF on LoCoMo: docs/recall.md), access_frequency is
  ``min(1, ln(1 + access_count) / ln(21))`` and outcome is success 1, partial 0.5, failed or
  none 0.
- ``list`` (limit <= 100, offset): newest first, no scoring.
- ``peer-query`` (limit <= 10): a literal ``target_agent``, read-only: no access counted, and
  results carry no access counts.
- ``pending-review?since={"agent": "ISO time", ...}``: memories created per agent since then;
  a time that is not ISO-8601 (Unix seconds, a date alone) is 422.

Limits above the maximum get 422.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Query
from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from memstream.gateway.errors import ApiError, ErrorBody
from memstream.gateway.identity import BearerIdentity, Root
from memstream.gateway.models import Body, Id
from memstream.producers.client import CommandError, MemoryClient
from memstream.producers.errors import RecallError
from memstream.schemas.errors import ErrorCode, describe
from memstream.schemas.memory import MemoryRecord, MemoryType, Scope, dated
from memstream.schemas.recall import MAX_QUERY_CHARS, Method

router = APIRouter(prefix="/api/agent-memory", tags=["agent memory (seed 004)"])

Tier = Literal["task_blueprint", "skill_heuristic", "domain_pattern", "lesson_learned"]
# what these routes read unless a request names one tier: the learnings, never the agent's
# conversation episodes, profiles or facts (a peer would read an agent's raw conversation)
TIERS = [MemoryType(t) for t in get_args(Tier)]
Text = Annotated[str, StringConstraints(min_length=1, max_length=10_000)]
NEAR_DUPLICATE_COSINE = 0.9
OUTCOME = {"success": 1.0, "partial": 0.5, "failed": 0.0}
ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (401, 403, 422, 503)}


class TaskContext(Body):
    task_description: Annotated[str, StringConstraints(max_length=10_000)]
    skills_used: Annotated[
        list[Annotated[str, StringConstraints(max_length=200)]], Field(max_length=100)
    ]
    outcome: Literal["success", "partial", "failed"]
    mission_namespace: Id | None = None


class CommitRequest(Body):
    agent_name: Id
    content: Annotated[str, StringConstraints(min_length=1, max_length=50_000)]
    memory_type: Tier
    task_context: TaskContext | None = None


class CommitResponse(BaseModel):
    memory_id: str
    duplicate_detected: bool


class QueryRequest(Body):
    agent_name: Id
    query: Text
    memory_type: Tier | None = None
    limit: Annotated[int, Field(ge=1, le=20)] = 10


class ListRequest(Body):
    agent_name: Id
    memory_type: Tier | None = None
    limit: Annotated[int, Field(ge=1, le=100)] = 20
    offset: Annotated[int, Field(ge=0, le=1_000_000)] = 0


class PeerQueryRequest(Body):
    target_agent: Id
    query: Text
    memory_type: Tier | None = None
    limit: Annotated[int, Field(ge=1, le=10)] = 5
    agent_name: Id | None = Field(None, description="the caller, when the key names no agent")


class AgentMemoryRecord(BaseModel):
    memory_id: str
    agent_name: str | None
    content: str
    memory_type: str
    task_context: dict[str, Any] | None = None
    access_count: int
    created_at: datetime


class AgentMemoryResult(AgentMemoryRecord):
    score: float = Field(description="the composite score")
    relevance: float = Field(description="memstream's fused hybrid score")


class PeerMemoryResult(BaseModel):
    memory_id: str
    agent_name: str | None
    content: str
    memory_type: str
    task_context: dict[str, Any] | None = None
    created_at: datetime
    relevance: float


class MemoriesResponse(BaseModel):
    memories: list[AgentMemoryRecord]
    next_offset: int | None = None


class QueryResponse(BaseModel):
    memories: list[AgentMemoryResult]


class PeerResponse(BaseModel):
    memories: list[PeerMemoryResult]


class PendingResponse(BaseModel):
    counts: dict[str, int]


def _context(meta: dict[str, Any]) -> dict[str, Any] | None:
    tc = meta.get("task_context")
    return tc if isinstance(tc, dict) else None


def _record(m: MemoryRecord) -> AgentMemoryRecord:
    return AgentMemoryRecord(
        memory_id=m.id,
        agent_name=m.agent,
        content=m.content,
        memory_type=m.type.value,
        task_context=_context(dict(m.metadata)),
        access_count=m.access_count,
        created_at=m.created_at,
    )


def composite(relevance: float, access_count: int, outcome: str | None) -> float:
    frequency = min(1.0, math.log1p(access_count) / math.log(21))
    return relevance * 0.625 + frequency * 0.25 + OUTCOME.get(outcome or "", 0.0) * 0.125


async def commit_learning(
    mem: MemoryClient, content: str, tier: MemoryType, task_context: TaskContext | None
) -> CommitResponse:
    """Store a learning of ``mem``'s owner, deduplicated against its own memories of the
    tier; a duplicate takes the commit's task context (the seed's UPDATE). The HTTP route and
    the MCP tool both commit through here."""
    meta: dict[str, Any] = {}
    if task_context is not None:
        meta["task_context"] = task_context.model_dump(exclude_none=True)
        meta["outcome"] = task_context.outcome
    near = await _near_duplicate(mem, content, tier)
    if near is not None and await _refresh(mem, near, meta):
        return CommitResponse(memory_id=near, duplicate_detected=True)
    reply = await mem.command(
        "remember", content=content, type=tier, scope=Scope.USER, metadata=meta
    )
    if reply.memory is None:
        raise ApiError(500, "internal", "the memory was not returned")
    duplicate = bool(reply.detail.get("duplicate"))
    if duplicate:
        await _refresh(mem, reply.memory, meta)
    return CommitResponse(memory_id=reply.memory.id, duplicate_detected=duplicate)


async def _near_duplicate(mem: MemoryClient, content: str, tier: MemoryType) -> str | None:
    """The owner's own memory of this tier that the content duplicates, if any. The search
    is no read by the agent: it counts no access (``touch``). The content is dated as a
    memory committed now is (``dated``): stored vectors are of dated text, and the same
    words undated scored 0.78 against their own memory, so only the worker's own exact and
    near-duplicate checks ever found one."""
    try:
        near = await mem.recall(
            dated(content, datetime.now(UTC))[:MAX_QUERY_CHARS],
            top_k=5,
            method=Method.VECTOR,
            types=[tier],
            cache=False,
            touch=False,
        )
    except RecallError as exc:
        if exc.code not in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT):
            raise
        # the vector index away or slow: the learning is stored without this check (the
        # seed's "commit still proceeds, dedup is skipped"); remember's own exact and
        # near-duplicate checks still run, and the reconciler indexes it later
        return None
    for h in near.hits:
        # only a memory of this very owner and scope is this learning already: one shared
        # by another owner (a user with the same agent) is not the agent's to hold it, and
        # one of a session or run would expire with it
        own = (h.user, h.agent) == (mem.user, mem.agent) and h.scope is Scope.USER
        if own and (h.calibrated or 0.0) >= NEAR_DUPLICATE_COSINE:
            return h.id
    return None


async def _refresh(mem: MemoryClient, found: str | MemoryRecord, meta: dict[str, Any]) -> bool:
    """Give the duplicate ``found`` the commit's task context (a commit without one leaves
    the stored one). Idempotent: a duplicate that holds it already is not written. Only the
    owner's own memory: the worker's ``update`` acts within ``mem``'s owner alone, so another
    owner's memory is never changed. False when the memory is gone (forgotten since the
    search) or is not the owner's."""
    try:
        m = await mem.get(found) if isinstance(found, str) else found
        if not meta or all(m.metadata.get(k) == v for k, v in meta.items()):
            return True
        await mem.command("update", id=m.id, content=m.content, metadata={**m.metadata, **meta})
    except CommandError as exc:
        if exc.code is not ErrorCode.NOT_FOUND:
            raise
        return False
    return True


@router.post("/commit", response_model=CommitResponse, responses=ERRORS)
async def commit(req: CommitRequest, ident: BearerIdentity, root: Root) -> CommitResponse:
    """Store a learning of the agent (seed 004), deduplicated against its own memories."""
    mem = ident.client(root, agent=req.agent_name)
    return await commit_learning(mem, req.content, MemoryType(req.memory_type), req.task_context)


@router.post("/query", response_model=QueryResponse, responses=ERRORS)
async def query(req: QueryRequest, ident: BearerIdentity, root: Root) -> QueryResponse:
    """The agent's own memories for a query, by composite score; counts an access on each."""
    mem = ident.client(root, agent=req.agent_name)
    types = [MemoryType(req.memory_type)] if req.memory_type else TIERS
    # no shared cache: a cached answer would count no access; the worker records the read
    # in the audit trail (the seed's agent_memory_query activity)
    reply = await mem.recall(
        req.query, top_k=req.limit, types=types, cache=False, activity="agent_memory_query"
    )
    own = [h for h in reply.hits if (h.user, h.agent) == (mem.user, mem.agent)]
    records = await asyncio.gather(*(mem.get(h.id) for h in own))
    out = []
    for h, m in zip(own, records, strict=True):
        rec = _record(m)
        outcome = m.metadata.get("outcome") if m.metadata else None
        out.append(
            AgentMemoryResult(
                **rec.model_dump(),
                score=round(composite(h.score, m.access_count, str(outcome or "")), 6),
                relevance=h.score,
            )
        )
    out.sort(key=lambda r: r.score, reverse=True)
    return QueryResponse(memories=out)


@router.post("/list", response_model=MemoriesResponse, responses=ERRORS)
async def list_memories(req: ListRequest, ident: BearerIdentity, root: Root) -> MemoriesResponse:
    """The agent's memories, newest first, paginated."""
    mem = ident.client(root, agent=req.agent_name)
    types = [MemoryType(req.memory_type)] if req.memory_type else TIERS
    reply = await mem.list_memories(types=types, limit=req.limit, offset=req.offset, own=True)
    return MemoriesResponse(
        memories=[_record(m) for m in reply.memories], next_offset=reply.next_offset
    )


@router.post("/peer-query", response_model=PeerResponse, responses=ERRORS)
async def peer_query(req: PeerQueryRequest, ident: BearerIdentity, root: Root) -> PeerResponse:
    """Another agent's memories (a literal name), read-only: no access is counted."""
    mem: MemoryClient = ident.client(root, agent=req.agent_name)
    types = [MemoryType(req.memory_type)] if req.memory_type else TIERS
    reply = await mem.command(
        "peer_query", target_agent=req.target_agent, query=req.query, top_k=req.limit, types=types
    )
    hits = reply.recall.hits if reply.recall else []
    return PeerResponse(
        memories=[
            PeerMemoryResult(
                memory_id=h.id,
                agent_name=h.agent,
                content=h.text,
                memory_type=h.type.value,
                task_context=_context(dict(h.metadata)),
                created_at=h.created_at,
                relevance=h.score,
            )
            for h in hits
            if h.agent == req.target_agent
        ]
    )


# an ISO-8601 date and time, extended format (the seed's ISO-datetime): pydantic alone also
# reads Unix seconds ("1700000000") and a date alone as times, which a client meant otherwise
_ISO_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2})?", re.IGNORECASE
)


def _iso_time(value: Any) -> Any:
    if not (isinstance(value, str) and _ISO_TIME.fullmatch(value)):
        raise PydanticCustomError(
            "iso_time", "not an ISO-8601 date and time, e.g. 2026-07-04T12:00:00Z"
        )
    return value


IsoTime = Annotated[datetime, BeforeValidator(_iso_time)]
_SINCE = TypeAdapter(dict[Annotated[str, StringConstraints(min_length=1, max_length=200)], IsoTime])


@router.get("/pending-review", response_model=PendingResponse, responses=ERRORS)
async def pending_review(
    ident: BearerIdentity,
    root: Root,
    since: Annotated[
        str,
        Query(
            min_length=2,
            max_length=20_000,
            description='a JSON map {"agent": "ISO time", ...} ("*": every agent)',
        ),
    ],
) -> PendingResponse:
    """Memories created per agent since the given times."""
    try:
        raw = json.loads(since)
    except ValueError:
        raise ApiError(422, "validation_error", "since: not JSON") from None
    if not isinstance(raw, dict) or not raw or len(raw) > 100:
        raise ApiError(422, "validation_error", "since: a JSON map of 1..100 agents to ISO times")
    try:
        parsed = _SINCE.validate_python(raw)
    except ValidationError as exc:
        raise ApiError(422, "validation_error", "since: " + describe(exc)) from None
    aware = {a: t if t.tzinfo else t.replace(tzinfo=UTC) for a, t in parsed.items()}
    # counts over the tenant's agents: the caller is the key's owner, or a service owner
    # for a tenant-wide key
    mem = ident.client(root, user=None if ident.user or ident.agent else "_service")
    return PendingResponse(counts=await mem.pending_review(aware))

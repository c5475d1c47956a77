"""Seed 002: ``/api/v1/memory/remember``, ``/recall``, ``/facts``, ``/facts/{id}/update``,
and ``/runs/{run_id}/end`` (the end of a run, which the seed's run scope needs).

Auth: ``Authorization: Bearer <key>``. ``client_id`` is the memstream *user* (its string
form) within the key's tenant: a key bound to a user only serves that ``client_id``; a
tenant-wide key (``memstream keys create --tenant T``) serves every client of the tenant.
Seed 002's ``zep_session_id`` ("client_<id>") is the memstream session of a client's
memories unless the request names one.

- ``remember``: ``memory_type`` event -> ``episode``, reflection -> ``lesson_learned``,
  decision -> ``decision``; ``salience_hint`` is the importance; at 0.7 or more the memory
  is also promoted to a fact (``fact_id`` in the reply). ``stored_in`` is honest: ``postgres``
  always, ``qdrant`` only when the vector index took it (when it is down, the memory is kept
  and indexed later by the reconciler).
- scopes: ``run`` memories live in session ``run:<run_id>`` (``run_id`` required) and are
  erased by ``POST /runs/{run_id}/end``; ``session`` memories expire 24 h after creation
  (``MEMSTREAM_TTL_S``); ``user`` memories are the client's; ``project`` and ``global`` are
  shared with the project / tenant.
- ``recall``: ``source`` is ``fact`` for facts, ``memory`` otherwise (seed 002's ``zep``);
  ``similarity_score`` is the calibrated score (0..1, absolute); ``cached`` is the workers'
  shared query cache.
- facts: ``subject_type:subject_id:fact_type`` is the fact's key: a second fact with the same
  key, or ``/facts/{id}/update``, closes the current version (``valid_to``) and opens a new one.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import AliasChoices, BaseModel, Field, StringConstraints, field_validator

from memstream.gateway.errors import ApiError, ErrorBody, not_found
from memstream.gateway.identity import BearerIdentity, Identity, Root
from memstream.gateway.models import Body, Id
from memstream.producers.client import CommandError, MemoryClient
from memstream.schemas.errors import ErrorCode
from memstream.schemas.memory import MemoryRecord, MemoryType, Scope

router = APIRouter(prefix="/api/v1/memory", tags=["memory gateway (seed 002)"])

ClientId = Annotated[int, Field(ge=0, le=2**63 - 1)] | Id
Unit = Annotated[float, Field(ge=0, le=1)]
Scalar = str | int | float | bool | None
PROMOTE_AT = 0.7
CLOSED = "this version is closed already: update the current one"
TYPES = {
    "event": MemoryType.EPISODE,
    "reflection": MemoryType.LESSON_LEARNED,
    "decision": MemoryType.DECISION,
}
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (401, 403, 404, 422, 503)
}


# the metadata keys the gateway sets on a remembered memory
RESERVED = frozenset({"client_id", "seed_memory_type", "salience", "run_id"})


class RememberRequest(Body):
    content: Annotated[str, StringConstraints(min_length=1, max_length=50_000)]
    client_id: ClientId
    memory_type: Literal["event", "reflection", "decision"] = "event"
    memory_scope: Literal["run", "session", "user", "project", "global"] = "user"
    # the API contract's name, and the one its scenarios use ("POST ... with salience_score
    # >= 0.7"): either is taken
    salience_hint: Unit = Field(
        0.5, validation_alias=AliasChoices("salience_hint", "salience_score")
    )
    # what the memory's metadata holds besides: the wire's 64 keys less the gateway's own,
    # which a caller's may not overwrite (RESERVED)
    metadata: Annotated[dict[str, Scalar], Field(max_length=64 - len(RESERVED))] = Field(
        default_factory=dict
    )
    run_id: Id | None = None
    session_id: Id | None = None

    @field_validator("metadata")
    @classmethod
    def _not_reserved(cls, v: dict[str, Scalar]) -> dict[str, Scalar]:
        if taken := sorted(RESERVED & set(v)):
            raise ValueError(f"{', '.join(taken)}: set by the gateway, not the caller")
        return v


class RememberResponse(BaseModel):
    memory_id: str
    stored_in: list[str]
    zep_session_id: str = Field(description="the memstream session the memory is in")
    duplicate: bool
    fact_id: str | None = Field(None, description="set when salience >= 0.7 promoted it")
    expires_at: datetime | None = None


class RecallResult(BaseModel):
    id: str
    content: str
    similarity_score: float
    source: Literal["memory", "fact"]
    scope: str
    created_at: datetime


class RecallResponse(BaseModel):
    query: str
    results: list[RecallResult]
    result_count: int
    cached: bool
    degraded: list[str] = Field(default_factory=list)


class FactRequest(Body):
    subject_type: Literal["user", "workflow", "engagement"]
    subject_id: Id
    fact_type: Literal["preference", "constraint", "identity"]
    content: Annotated[str, StringConstraints(min_length=1, max_length=10_000)]
    salience_score: Unit = 0.8
    client_id: ClientId | None = None


class FactUpdateRequest(Body):
    content: Annotated[str, StringConstraints(min_length=1, max_length=10_000)]
    client_id: ClientId | None = None


class FactResponse(BaseModel):
    fact_id: str
    zep_fact_id: str | None = Field(None, description="no Zep here: always null")
    key: str
    content: str
    valid_from: datetime | None
    valid_to: datetime | None
    previous_fact_id: str | None = None
    previous_valid_to: datetime | None = None


class RunEndResponse(BaseModel):
    run_id: str
    ended: bool
    expired: int = Field(description="run memories erased")


def _client(root: MemoryClient, ident: Identity, client_id: int | str | None) -> MemoryClient:
    return ident.client(root, None if client_id is None else str(client_id))


def _session(req: RememberRequest) -> str:
    if req.memory_scope == "run":
        if not req.run_id:
            raise ApiError(422, "validation_error", "run_id: required for memory_scope run")
        return f"run:{req.run_id}"
    return req.session_id or f"client_{req.client_id}"


async def _promote(
    mem: MemoryClient, m: MemoryRecord, content: str, salience: float
) -> MemoryRecord:
    """The fact a memory of salience >= 0.7 is promoted to: its text as sent, and the
    memory's scope, session and expiry, so that a run's or a session's fact answers no
    recall that excludes those scopes, and goes with its run or session."""
    reply = await mem.command(
        "fact_put",
        key=f"memory:{m.id}",
        value=content,
        labelled=False,
        scope=m.scope,
        session=m.session,
        expires_at=m.expires_at,
        importance=salience,
    )
    if reply.memory is None:
        raise ApiError(500, "internal", "the fact was not returned")
    return reply.memory


@router.post("/remember", status_code=201, response_model=RememberResponse, responses=ERRORS)
async def remember(req: RememberRequest, ident: BearerIdentity, root: Root) -> RememberResponse:
    """Store a memory (seed 002); salience >= 0.7 also makes it a fact."""
    mem = _client(root, ident, req.client_id)
    session = _session(req)
    meta: dict[str, Any] = {
        **req.metadata,
        "client_id": str(req.client_id),
        "seed_memory_type": req.memory_type,
        "salience": req.salience_hint,
    }
    if req.run_id:
        meta["run_id"] = req.run_id
    reply = await mem.command(
        "remember",
        content=req.content,
        type=TYPES[req.memory_type],
        scope=Scope(req.memory_scope),
        session=session,
        importance=req.salience_hint,
        metadata=meta,
    )
    m = reply.memory
    if m is None:
        raise ApiError(500, "internal", "the memory was not returned")
    fact_id = None
    if req.salience_hint >= PROMOTE_AT:
        fact_id = (await _promote(mem, m, req.content, req.salience_hint)).id
    return RememberResponse(
        memory_id=m.id,
        stored_in=["postgres", "qdrant"] if m.indexed else ["postgres"],
        zep_session_id=session,
        duplicate=bool(reply.detail.get("duplicate")),
        fact_id=fact_id,
        expires_at=m.expires_at,
    )


def _scopes(raw: list[str]) -> list[Scope]:
    """``scopes`` as repeated parameters, a JSON list (``["user","global"]``, as seed 002
    writes it) or comma-separated."""
    names: list[str] = []
    for item in raw:
        item = item.strip()
        if item.startswith("["):
            try:
                parsed = json.loads(item)
            except ValueError:
                raise ApiError(422, "validation_error", "scopes: not a JSON list") from None
            if not isinstance(parsed, list) or not all(isinstance(x, str) for x in parsed):
                raise ApiError(422, "validation_error", "scopes: a list of scope names")
            names += parsed
        elif item:
            names += [p.strip() for p in item.split(",") if p.strip()]
    try:
        return list(dict.fromkeys(Scope(n) for n in names))
    except ValueError:
        raise ApiError(
            422, "validation_error", "scopes: each is one of run, session, user, project, global"
        ) from None


@router.get("/recall", response_model=RecallResponse, responses=ERRORS)
async def recall(
    ident: BearerIdentity,
    root: Root,
    query: Annotated[str, Query(min_length=1, max_length=10_000)],
    client_id: Annotated[str, Query(min_length=1, max_length=200)],
    k: Annotated[int, Query(ge=1, le=100)] = 10,
    scopes: Annotated[list[str], Query(max_length=10)] = [],  # noqa: B006 - FastAPI reads it
) -> RecallResponse:
    """Memories and facts that match ``query`` (seed 002)."""
    mem = _client(root, ident, client_id)
    wanted = _scopes(scopes)
    # seed 002: every memory operation is in the events table, a recall too (the workers
    # write the row, for an answer from the cache as well)
    reply = await mem.recall(query, top_k=k, scopes=wanted, activity="memory_recall")
    results = [
        RecallResult(
            id=h.id,
            content=h.text,
            similarity_score=h.calibrated if h.calibrated is not None else h.score,
            source="fact" if h.type is MemoryType.FACT else "memory",
            scope=h.scope.value,
            created_at=h.created_at,
        )
        for h in reply.hits
    ]
    # seed 002 ranks by similarity_score: the best k are memstream's (fused ranking), in the
    # order of their calibrated score
    results.sort(key=lambda r: r.similarity_score, reverse=True)
    return RecallResponse(
        query=query,
        results=results,
        result_count=len(results),
        cached=reply.cached,
        degraded=list(reply.degraded),
    )


@router.post("/facts", status_code=201, response_model=FactResponse, responses=ERRORS)
async def create_fact(req: FactRequest, ident: BearerIdentity, root: Root) -> FactResponse:
    """A fact with temporal validity; one with the same subject and type supersedes it."""
    client_id = req.client_id
    if (
        client_id is None
        and req.subject_type == "user"
        and ident.user is None
        and ident.agent is None
    ):
        client_id = req.subject_id  # a tenant-wide key: the fact is its subject's, a client's
    mem = _client(root, ident, client_id)
    key = f"{req.subject_type}:{req.subject_id}:{req.fact_type}"
    reply = await mem.command(
        "fact_put", key=key, value=req.content, labelled=False, importance=req.salience_score
    )
    return await _fact_response(mem, key, reply.memory, reply.detail.get("superseded"))


async def _fact_response(
    mem: MemoryClient, key: str, new: MemoryRecord | None, previous: Any
) -> FactResponse:
    if new is None:
        raise ApiError(500, "internal", "the fact was not returned")
    previous_to = None
    if isinstance(previous, str):
        chain = await mem.fact_history(key)
        previous_to = next((m.valid_to for m in chain if m.id == previous), None)
    return FactResponse(
        fact_id=new.id,
        key=key,
        content=new.content,
        valid_from=new.valid_from,
        valid_to=new.valid_to,
        previous_fact_id=previous if isinstance(previous, str) else None,
        previous_valid_to=previous_to,
    )


@router.post("/facts/{fact_id}/update", response_model=FactResponse, responses=ERRORS)
async def update_fact(
    fact_id: Id,
    req: FactUpdateRequest,
    ident: BearerIdentity,
    root: Root,
) -> FactResponse:
    """Close the fact's current version (``valid_to`` = now) and open a new one."""
    mem = _client(root, ident, req.client_id)
    try:
        uuid.UUID(fact_id)
    except ValueError:
        raise not_found("no such fact") from None  # memory ids are UUIDs
    try:
        old = await mem.get(fact_id)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such fact") from None
        raise
    key = old.fact_key or (old.metadata.get("fact_key") if old.metadata else None)
    if old.type is not MemoryType.FACT or not isinstance(key, str):
        raise not_found("no such fact")
    if old.valid_to is not None or old.superseded_by is not None:
        raise ApiError(409, "conflict", CLOSED)
    try:
        reply = await mem.command(
            "fact_update",
            key=key,
            value=req.content,
            labelled=False,
            importance=old.importance,
            scope=old.scope,
            session=old.session,
            expires_at=old.expires_at,
            supersedes=old.id,  # closed by another update since it was read: 409, not a fork
        )
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise ApiError(409, "conflict", CLOSED) from None
        raise
    return await _fact_response(mem, key, reply.memory, reply.detail.get("superseded"))


@router.post("/runs/{run_id}/end", response_model=RunEndResponse, responses=ERRORS)
async def end_run(
    run_id: Id,
    request: Request,
    ident: BearerIdentity,
    root: Root,
    client_id: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> RunEndResponse:
    """End a run: its run-scoped memories expire now (they are erased, with their turns)."""
    mem = _client(root, ident, client_id)
    counts = await mem.forget_owner(session=f"run:{run_id}")
    return RunEndResponse(run_id=run_id, ended=True, expired=int(counts.get("memories", 0)))

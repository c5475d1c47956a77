"""Seed 000 and seed 003: ``POST /memories/search``, ``/memories/add``, ``/memories/flush``.

The key is ``user_key`` in the body (as seed 000 writes it). ``user_id`` must be the key's
user when the key is bound to one; the tenant is always the key's.

Search, per requested scope (all answered in one call, each result tagged ``source_scope``):

- ``current_chat``: recall context ``session``, session ``chat:<conversation_id>``;
  scope filter ``{"session_id": {"in": ["chat:<conversation_id>"]}}``.
- ``resources``: recall context ``resources``: ``project`` and ``global`` memories, shared
  by the project / tenant; scope filter ``{"scope": {"in": ["project", "global"]}}``.
- ``all_user_memory``: recall context ``all``: everything of the owner; no scope filter.

``top_k`` applies per scope; a memory found by an earlier scope is not repeated by a later one.
``current_chat`` also returns the turns accepted but not processed yet, as
``unprocessed_message`` results (``score`` null) after the memories.

``memory_type`` mapping (memstream type -> seed type; ``SEED_TYPE`` in ``memories_shapes.py``)::

    episode                                              -> episode
    profile, preference, fact, rule                      -> profile
    decision, fix, todo, task_blueprint, lesson_learned  -> agent_case
    skill_heuristic, domain_pattern                      -> agent_skill
    a turn not processed yet                             -> unprocessed_message

``method``: ``keyword``, ``vector``, ``hybrid`` as memstream's recall; ``agentic`` (an LLM that
plans several searches upstream) runs as ``hybrid`` here, reported in the reply as
``"agentic": "ran_as_hybrid"``. ``radius``: results whose calibrated ``score`` (absolute,
0..1, see docs/recall.md) is below it are dropped. ``include_profile`` false drops the
``profile`` types. ``enable_llm_rerank``: no reranker is configured: accepted, reported as
``"rerank": "not_configured"``, a no-op.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from nats.errors import MaxPayloadError

from memstream.gateway import filters as flt
from memstream.gateway.errors import ApiError, ErrorBody, forbidden
from memstream.gateway.identity import Identity, identity_of, root_client
from memstream.gateway.memories_shapes import (
    PROFILE_TYPES,
    SEED_TYPE,
    AddRequest,
    AddResponse,
    Caller,
    FlushRequest,
    FlushResponse,
    SearchRequest,
    SearchResponse,
    SearchResult,
    SeedScope,
)
from memstream.producers.client import MemoryClient, PublishError
from memstream.producers.progress import progress, turns_after, wait_processed
from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import MemoryType, Scope
from memstream.schemas.recall import Method, RecallReply

router = APIRouter(tags=["memories (seeds 000, 003)"])

MAX_CANDIDATES = 100
STAGE_LOOKBACK = 2000  # stream sequences below the extract floor searched for in-flight turns


async def _caller(request: Request, body: Caller) -> tuple[Identity, MemoryClient]:
    ident = await identity_of(request, body.user_key)
    if ident.user is not None and body.user_id != ident.user:
        raise forbidden("the key is bound to another user")
    user: str | None
    agent: str | None
    if body.agent_id is not None:  # seed 003: agent_id, when present, is the owner searched
        user, agent = ident.user, body.agent_id
    else:
        user, agent = body.user_id, ident.agent
    return ident, ident.client(root_client(request), user, agent)


SCOPE_FILTER: dict[str, Any] = {"resources": {"scope": {"in": ["project", "global"]}}}
SEED_TYPE_NAMES = {t.value: name for t, name in SEED_TYPE.items()}


async def _scope(
    mem: MemoryClient, req: SearchRequest, scope: SeedScope, tenant: str
) -> tuple[list[SearchResult], list[str], dict[str, Any] | None]:
    session = f"chat:{req.conversation_id}" if scope == "current_chat" else None
    scope_filter = {"session_id": {"in": [session]}} if session else SCOPE_FILTER.get(scope)
    composed = flt.compose(req.filters, scope_filter)
    narrowing = req.filters is not None or req.radius is not None
    want = MAX_CANDIDATES if req.top_k == -1 else req.top_k
    must = flt.narrowing(composed, SEED_TYPE_NAMES)
    types = set(MemoryType) if req.include_profile else set(MemoryType) - PROFILE_TYPES
    if must.types is not None:
        types &= {t for t in MemoryType if t.value in must.types}
    scopes = [x for x in Scope if must.scopes is None or x.value in must.scopes]
    reply = RecallReply(hits=[], method=Method.HYBRID)
    if types and scopes:  # else no memory can match: only unprocessed turns may
        reply = await mem.recall(
            req.query,
            top_k=MAX_CANDIDATES if narrowing else want,
            session=session,
            method=Method.HYBRID if req.method == "agentic" else Method(req.method),
            context={"current_chat": "session", "resources": "resources"}.get(scope, "all"),
            types=[] if types == set(MemoryType) else sorted(types),
            scopes=[] if must.scopes is None else scopes,
            tags=sorted(must.tags),
            project=req.project_id,  # its project-scope memories are shared with the caller
        )
    out: list[SearchResult] = []
    for h in reply.hits:
        score = h.calibrated if h.calibrated is not None else h.score
        if req.radius is not None and score < req.radius:
            continue
        if not flt.matches(composed, flt.fields_of(h, SEED_TYPE.get(h.type, "episode"))):
            continue
        out.append(
            SearchResult(
                id=h.id,
                session_id=h.session,
                text=h.text,
                score=score,
                rank_score=h.score,
                source_scope=scope,
                memory_type=SEED_TYPE.get(h.type, "episode"),
                resource_uri=f"memstream://{tenant}/memories/{h.id}"
                if scope == "resources"
                else None,
                user_id=h.user,
                agent_id=h.agent,
                created_at=h.created_at,
                metadata=dict(h.metadata),
                tags=list(h.tags),
            )
        )
        if len(out) >= want:
            break
    if session is not None and len(out) < want:  # top_k counts them too
        turns = await _unprocessed(mem, session, composed, {h.id for h in reply.hits})
        out += turns[: want - len(out)]
    return out, list(reply.degraded), composed


async def _unprocessed(
    mem: MemoryClient,
    session: str,
    composed: dict[str, Any] | None,
    seen: set[str],
) -> list[SearchResult]:
    """The session's turns the pipeline has not turned into memories yet."""
    owner = mem.user or mem.agent or "_"
    state = await progress(mem, owner, session)
    if state.done:
        return []
    # a turn above the extract floor is unprocessed; with candidates still in the stages, a
    # recent turn below it may be too (the stages hold recent work: look a bounded way back)
    after = (
        max(0, state.extracted_through - STAGE_LOOKBACK)
        if state.held_in_stages
        else state.extracted_through
    )
    turns = await turns_after(mem, owner, session, after, limit=MAX_CANDIDATES)
    if state.held_in_stages and turns:
        # past the extract floor the turn may be stored already: its memory names it
        stored = await mem.list_memories(session=session, limit=100)
        done_events = {e for m in stored.memories for e in m.source_event_ids}
        turns = [
            (s, t) for s, t in turns if s > state.extracted_through or t.event_id not in done_events
        ]
    out: list[SearchResult] = []
    for _, t in turns:
        # the session's subject is the user's (or the agent's): it also carries the turns of
        # the user with an agent, and of the agent with a user, which are other owners
        # (docs/memory-model.md: (alice) does not see (alice, helper)), so each turn's own
        # owner must be the caller's
        if (t.tenant, t.user, t.agent) != (mem.tenant, mem.user, mem.agent):
            continue
        text = "\n".join(
            f"{m.sender or m.role.value}: {m.content.strip()}"
            for m in t.messages
            if m.role in (Role.USER, Role.ASSISTANT) and m.content.strip()
        )
        item = {
            "id": t.event_id,
            "session_id": t.session,
            "memory_type": "unprocessed_message",
            "type": "unprocessed_message",
            "scope": "session",
            "user_id": t.user,
            "agent_id": t.agent,
            "pinned": False,
            "tags": list(t.tags),
            "metadata": dict(t.metadata),
        }
        if not text or t.event_id in seen or not flt.matches(composed, item):
            continue
        out.append(
            SearchResult(
                id=t.event_id,
                session_id=t.session,
                text=text,
                score=None,
                rank_score=None,
                source_scope="current_chat",
                memory_type="unprocessed_message",
                user_id=t.user,
                agent_id=t.agent,
                created_at=t.occurred_at,
                metadata=dict(t.metadata),
                tags=list(t.tags),
            )
        )
    return out


ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorBody},
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    422: {"model": ErrorBody},
    503: {"model": ErrorBody},
}


@router.post("/memories/search", response_model=SearchResponse, responses=ERRORS)
async def search(request: Request, req: SearchRequest) -> SearchResponse:
    """Search the requested scopes in one call (seeds 000 and 003)."""
    if req.filters is not None:
        flt.validate(req.filters)
    ident, mem = await _caller(request, req)
    answers = await asyncio.gather(*(_scope(mem, req, s, ident.tenant) for s in req.scope))
    results: list[SearchResult] = []
    seen: set[str] = set()
    degraded: list[str] = []
    applied: dict[str, Any] = {}
    for scope, (found, deg, composed) in zip(req.scope, answers, strict=True):
        for r in found:
            if r.id not in seen:
                seen.add(r.id)
                results.append(r)
        degraded += [d for d in deg if d not in degraded]
        if composed:
            applied[scope] = composed
    return SearchResponse(
        results=results,
        method="hybrid" if req.method == "agentic" else req.method,
        agentic="ran_as_hybrid" if req.method == "agentic" else None,
        rerank="not_configured" if req.enable_llm_rerank else None,
        degraded=degraded,
        filters=applied,
    )


def _event_id(ident: Identity, mem: MemoryClient, req: AddRequest, idem: str | None) -> str:
    """The idempotency key of an add: its owner, app, project and session, and the
    ``Idempotency-Key`` header with what the messages say, or else the messages whole
    (their timestamps, the turn's position, included). A retried add maps to the same event
    (with the header, even if it stamps its messages anew): JetStream drops the copy within
    its duplicate window, and beyond it the same memories are derived again (exact dedupe
    keeps one). A header reused for another turn, or a turn sent again to another session
    or project, is another event: taken for a retry, it was dropped, and lost."""
    owner = f"{mem.user or ''}\x1e{mem.agent or ''}"
    where = (req.app_id, req.project_id, req.session_id)
    if idem:
        said = [m.model_dump(exclude={"timestamp"}) for m in req.messages]
        return derived_id("http-add", ident.tenant, owner, *where, _digest(said), "key", idem)
    return derived_id(
        "http-add", ident.tenant, owner, *where, _digest([m.model_dump() for m in req.messages])
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@router.post("/memories/add", response_model=AddResponse, status_code=202, responses=ERRORS)
async def add(
    request: Request,
    req: AddRequest,
    idempotency_key: Annotated[
        str | None, Header(max_length=200, description="retries with this key store once")
    ] = None,
) -> AddResponse:
    """Accept one conversation turn; answers once it is durable in JetStream (seed 000)."""
    ident, mem = await _caller(request, req)
    event = TurnEvent(
        event_id=_event_id(ident, mem, req, idempotency_key),
        tenant=ident.tenant,
        app=req.app_id,
        project=req.project_id,
        user=mem.user,
        agent=mem.agent,
        session=req.session_id,
        messages=[
            Message(
                role=Role(m.role),
                content=m.content,
                timestamp=datetime.fromtimestamp(m.timestamp / 1000, UTC),
                sender=m.sender_id,
            )
            for m in req.messages
        ],
        occurred_at=datetime.fromtimestamp(req.messages[-1].timestamp / 1000, UTC),
    )
    try:
        res = await mem.publish(event)
    except PublishError as exc:
        if isinstance(exc.__cause__, MaxPayloadError):
            raise ApiError(413, "too_large", "the turn exceeds the bus's message size") from None
        raise
    return AddResponse(
        session_id=req.session_id,
        event_id=res.event_id,
        stream_seq=res.seq,
        duplicate=res.duplicate,
    )


@router.post(
    "/memories/flush",
    response_model=FlushResponse,
    responses={**ERRORS, 202: {"model": FlushResponse, "description": "timed out: still pending"}},
)
async def flush(request: Request, req: FlushRequest, response: Response) -> FlushResponse:
    """Wait until every turn added to the session so far is processed and recallable
    (200 ``flushed``), or until the timeout (202 ``pending``, saying what is left)."""
    _, mem = await _caller(request, req)
    timeout = req.timeout_s or request.app.state.config.flush_timeout_s
    started = time.monotonic()
    state = await wait_processed(mem, req.session_id, within_s=timeout)
    waited = time.monotonic() - started
    if not state.done:
        response.status_code = 202
    return FlushResponse(
        status="flushed" if state.done else "pending",
        session_id=req.session_id,
        waited_ms=round(waited * 1000, 1),
        pending=state.pending(),
    )

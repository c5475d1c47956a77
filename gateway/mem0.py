"""A Mem0-compatible API: the subset of Mem0's hosted platform that ``mem0ai``'s
``MemoryClient`` and ``AsyncMemoryClient`` call for memories, so that code written for them
works against memstream by changing only ``host`` (docs/integrations.md).

Auth: ``Authorization: Token <key>`` with memstream keys (``Bearer`` works too); the tenant is
the key's, and a key bound to a user or agent acts only as that owner (``identity.py``).

Entities: ``user_id`` and ``agent_id`` are memstream's owner (exactly: memories added with
``user_id`` alone and with ``user_id`` + ``agent_id`` belong to two owners); ``run_id`` is the
session ``run:<run_id>`` (else the session is ``mem0``); ``app_id`` is recorded on the turn and
in the memory's metadata.

Served (the client's paths):

- ``GET /v1/ping/``;
- ``POST /v3/memories/add/``: the messages are published as one turn; the pipeline extracts,
  redacts, dedupes and stores asynchronously; the reply carries the turn's ``event_id``
  (``status: PENDING``). ``infer: false`` stores each user/assistant message as it is, now;
- ``POST /v3/memories/search/`` (``query``, ``filters``, ``top_k``, ``threshold`` on the
  calibrated score), ``POST /v3/memories/`` (get-all, ``page`` / ``page_size``);
- ``GET``, ``PUT`` (``text``, ``metadata``), ``DELETE /v1/memories/{id}/``,
  ``GET /v1/memories/{id}/history/`` and ``DELETE /v1/memories/`` (one owner, or one run).

Filters: seed 003's language (``filters.py``: ``AND``, ``OR``, ``eq``/``ne``/``in``/``nin``)
over ``user_id``, ``agent_id``, ``run_id``, ``app_id``, ``id``, ``type``, ``scope``, metadata
keys. The owners a filter names (each ``OR`` branch's ``user_id``/``agent_id``) are searched
one by one and the whole filter is checked on every result. Operators and fields memstream
cannot evaluate (``gte``, ``contains``, ``*``, ``categories``, dates) are a 422, never a silently
different answer. Everything else Mem0's client can call (graph, webhooks, exports, projects,
entities, batch, feedback, profiles, events) is a 501 ``not_implemented``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic import ValidationError as PydanticValidationError

from memstream.gateway import filters as flt
from memstream.gateway.errors import ApiError, ErrorBody, field_errors, not_found, unauthorized
from memstream.gateway.identity import Identity, Root, resolver
from memstream.gateway.models import has_nul
from memstream.producers.client import CommandError, MemoryClient
from memstream.schemas.errors import ErrorCode
from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import MemoryRecord, MemoryType
from memstream.schemas.recall import Hit

router = APIRouter(tags=["Mem0-compatible API"])

Id = Annotated[str, StringConstraints(min_length=1, max_length=200)]
ENTITIES = ("user_id", "agent_id", "run_id", "app_id")
UNSUPPORTED_FIELDS = ("categories", "created_at", "updated_at", "keywords", "expiration_date")
MAX_OWNERS = 10  # owners one filter may name
MAX_LISTED = 5000  # memories get-all reads per owner (count is exact up to this)
DEFAULT_SESSION = "mem0"
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (401, 403, 404, 422, 501, 503)
}


def not_implemented(what: str) -> ApiError:
    return ApiError(
        501, "not_implemented", f"memstream's Mem0-compatible API does not serve {what}"
    )


async def token_identity(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="`Token <key>` (memstream keys create)")
    ] = None,
) -> Identity:
    """The identity of ``Authorization: Token <key>`` (Mem0's scheme) or ``Bearer <key>``."""
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() not in ("token", "bearer") or not key.strip():
        raise unauthorized("send Authorization: Token <key>")
    return await resolver(request).resolve(key.strip())


class _Loose(BaseModel):
    """Mem0 bodies: unknown fields are refused (a field memstream would ignore could change
    the answer), values never appear in errors."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class Mem0Message(_Loose):
    role: Literal["user", "assistant", "system", "tool"]
    content: Annotated[str, StringConstraints(max_length=1_000_000)]
    name: Id | None = None


class AddBody(_Loose):
    messages: Annotated[list[Mem0Message], Field(min_length=1, max_length=1000)]
    user_id: Id | None = None
    agent_id: Id | None = None
    run_id: Id | None = None
    app_id: Id | None = None
    filters: dict[str, Any] | None = None
    metadata: Annotated[dict[str, Any], Field(max_length=64)] | None = None
    infer: bool = True
    timestamp: Annotated[int, Field(ge=1, le=32_503_680_000)] | None = None
    version: str | None = None
    output_format: str | None = None
    async_mode: bool | None = None


class SearchBody(_Loose):
    query: Annotated[str, StringConstraints(min_length=1, max_length=10_000)]
    filters: dict[str, Any] | None = None
    top_k: Annotated[int, Field(ge=1, le=100)] = 10
    threshold: Annotated[float, Field(ge=0, le=1)] | None = None
    rerank: bool | None = None
    keyword_search: bool | None = None
    fields: list[str] | None = None
    version: str | None = None


class GetAllBody(_Loose):
    filters: dict[str, Any] | None = None
    version: str | None = None


class UpdateBody(_Loose):
    text: Annotated[str, StringConstraints(min_length=1, max_length=50_000)] | None = None
    metadata: Annotated[dict[str, Any], Field(max_length=64)] | None = None
    timestamp: int | float | str | None = None
    expiration_date: str | None = None


class Mem0Memory(BaseModel):
    id: str
    memory: str
    user_id: str | None
    agent_id: str | None
    app_id: str | None
    run_id: str | None
    hash: str
    metadata: dict[str, Any]
    categories: list[str] = Field(default_factory=list)
    created_at: datetime
    updated_at: datetime | None
    expiration_date: datetime | None = None
    immutable: bool = False
    score: float | None = None
    memory_type: str = Field(description="memstream's memory type")
    scope: str = Field(description="memstream's scope")


class Page(BaseModel):
    count: int
    next: str | None
    previous: str | None
    results: list[Mem0Memory]


# --- filters -> owners ----------------------------------------------------------------------


def _check(f: Any) -> None:
    """Seed 003's language, minus what memstream cannot evaluate for Mem0's fields."""
    if not isinstance(f, dict):
        return
    for k, v in f.items():
        if k in ("AND", "OR"):
            for sub in v:
                _check(sub)
            continue
        if k in UNSUPPORTED_FIELDS:
            raise ApiError(422, "validation_error", f"filters: {k} is not supported here")
        if isinstance(v, dict) and len(v) == 1 and next(iter(v)) not in flt.OPS:
            op = next(iter(v))
            raise ApiError(
                422,
                "validation_error",
                f"filters: {k}: operator {op!r} is not supported (eq, ne, in, nin)",
            )
        if k in ENTITIES and v == "*":
            raise ApiError(422, "validation_error", f"filters: {k}: wildcards are not supported")
        if k == "metadata" and isinstance(v, dict):
            raise ApiError(
                422, "validation_error", "filters: metadata: write metadata keys as fields"
            )


def validate_filters(f: dict[str, Any] | None) -> None:
    if f is None:
        return
    _check(f)
    flt.validate(f)


Conj = dict[str, str]


def _and(a: list[Conj], b: list[Conj]) -> list[Conj]:
    out = []
    for x in a:
        for y in b:
            if all(x[k] == y[k] for k in x.keys() & y.keys()):  # else: impossible
                out.append({**x, **y})
    return out


def conjunctions(f: dict[str, Any] | None) -> list[Conj]:
    """The filter's ``user_id``/``agent_id`` equalities in disjunctive form: one dict per
    branch that can hold (``[{}]``: the filter names no owner)."""
    if not f:
        return [{}]
    acc: list[Conj] = [{}]
    for k, v in f.items():
        part: list[Conj]
        if k == "AND":
            part = [{}]
            for sub in v:
                part = _and(part, conjunctions(sub))
        elif k == "OR":
            part = [c for sub in v for c in conjunctions(sub)]
        elif k in ("user_id", "agent_id"):
            op, arg = next(iter(v.items())) if isinstance(v, dict) else ("eq", v)
            if op == "eq" and isinstance(arg, str):
                part = [{k: arg}]
            elif op == "in":
                part = [{k: str(x)} for x in arg if isinstance(x, str)]
            else:
                part = [{}]
        else:
            part = [{}]
        acc = _and(acc, part)
        if len(acc) > MAX_OWNERS * 4:
            raise ApiError(422, "validation_error", "filters: name at most 10 owners")
    return acc


def owners(ident: Identity, f: dict[str, Any] | None) -> list[tuple[str | None, str | None]]:
    """The owners to read: one per branch of the filter, each checked against the key."""
    found: list[tuple[str | None, str | None]] = []
    for c in conjunctions(f):
        o = ident.owner(c.get("user_id"), c.get("agent_id"))
        if o not in found:
            found.append(o)
    if len(found) > MAX_OWNERS:
        raise ApiError(422, "validation_error", "filters: name at most 10 owners")
    return found


# --- memstream -> Mem0 shapes ---------------------------------------------------------------


def _run_of(session: str) -> str | None:
    return session[4:] if session.startswith("run:") else None


def _app_of(metadata: dict[str, Any], app: str | None = None) -> str | None:
    value = app or metadata.get("app_id")
    return value if isinstance(value, str) else None


def _item(
    id_: str,
    user: str | None,
    agent: str | None,
    session: str,
    type_: MemoryType,
    scope: str,
    pinned: bool,
    tags: list[str],
    metadata: dict[str, Any],
    app: str | None,
) -> dict[str, Any]:
    """The fields a filter sees."""
    meta = {**metadata, "run_id": _run_of(session), "app_id": _app_of(metadata, app)}
    return {
        "id": id_,
        "session_id": session,
        "memory_type": type_.value,
        "type": type_.value,
        "scope": scope,
        "user_id": user,
        "agent_id": agent,
        "pinned": pinned,
        "tags": tags,
        "metadata": meta,
    }


def _md5(text: str) -> str:
    """Mem0's ``hash``: the MD5 of the memory's text (not a security measure)."""
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def of_record(m: MemoryRecord) -> Mem0Memory:
    return Mem0Memory(
        id=m.id,
        memory=m.content,
        user_id=m.user,
        agent_id=m.agent,
        app_id=_app_of(dict(m.metadata), m.app),
        run_id=_run_of(m.session),
        hash=_md5(m.content),
        metadata=dict(m.metadata),
        created_at=m.created_at,
        updated_at=m.updated_at,
        expiration_date=m.expires_at,
        memory_type=m.type.value,
        scope=m.scope.value,
    )


def of_hit(h: Hit) -> Mem0Memory:
    return Mem0Memory(
        id=h.id,
        memory=h.text,
        user_id=h.user,
        agent_id=h.agent,
        app_id=_app_of(dict(h.metadata)),
        run_id=_run_of(h.session),
        hash=_md5(h.text),
        metadata=dict(h.metadata),
        created_at=h.created_at,
        updated_at=None,
        score=h.calibrated if h.calibrated is not None else h.score,
        memory_type=h.type.value,
        scope=h.scope.value,
    )


def record_matches(f: dict[str, Any] | None, m: MemoryRecord) -> bool:
    item = _item(
        m.id,
        m.user,
        m.agent,
        m.session,
        m.type,
        m.scope.value,
        m.pinned,
        list(m.tags),
        dict(m.metadata),
        m.app,
    )
    return flt.matches(f, item)


def hit_matches(f: dict[str, Any] | None, h: Hit) -> bool:
    item = _item(
        h.id,
        h.user,
        h.agent,
        h.session,
        h.type,
        h.scope.value,
        h.pinned,
        list(h.tags),
        dict(h.metadata),
        None,
    )
    return flt.matches(f, item)


async def _owned(mem: MemoryClient, memory_id: str) -> MemoryRecord:
    """One memory the key's owner may read; 404 otherwise (another owner's is not found)."""
    try:
        return await mem.get(memory_id)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise


def _ident_client(ident: Identity, root: MemoryClient) -> MemoryClient:
    """The key's own owner (a Mem0 call on one memory names no entity)."""
    if ident.user is None and ident.agent is None:
        raise ApiError(
            422,
            "validation_error",
            "a tenant-wide key names no owner: use a key bound to a user or agent here",
        )
    return ident.client(root)


# --- routes ---------------------------------------------------------------------------------

AuthId = Annotated[Identity, Depends(token_identity)]


@router.get("/v1/ping/", responses=ERRORS)
async def ping(ident: AuthId) -> dict[str, Any]:
    """The client's key check on construction."""
    return {
        "status": "ok",
        "message": "memstream",
        "org_id": ident.tenant,
        "project_id": "default",
        "user_email": None,
    }


def _entities(body: AddBody) -> dict[str, str]:
    found = {k: v for k in ENTITIES if isinstance(v := getattr(body, k), str)}
    for k, v in (body.filters or {}).items():
        if k in ENTITIES and isinstance(v, str):
            found.setdefault(k, v)
        elif k not in ENTITIES:
            raise ApiError(
                422, "validation_error", f"filters: add takes only {', '.join(ENTITIES)}"
            )
    return found


@router.post("/v3/memories/add/", responses=ERRORS)
async def add(body: AddBody, ident: AuthId, root: Root) -> dict[str, Any]:
    """Add messages: one turn through the pipeline (asynchronous), or as-is with ``infer``
    false."""
    if has_nul(body.model_dump()):
        raise ApiError(422, "validation_error", "text must not contain NUL characters")
    ent = _entities(body)
    mem = ident.client(root, ent.get("user_id"), ent.get("agent_id"))
    session = f"run:{ent['run_id']}" if "run_id" in ent else DEFAULT_SESSION
    metadata: dict[str, Any] = dict(body.metadata or {})
    if "app_id" in ent:
        metadata["app_id"] = ent["app_id"]
    at = datetime.fromtimestamp(body.timestamp, UTC) if body.timestamp else datetime.now(UTC)
    owner = f"{mem.user or ''}\x1e{mem.agent or ''}"
    digest = hashlib.sha256(
        json.dumps([body.model_dump(mode="json"), session], sort_keys=True).encode()
    ).hexdigest()
    event_id = derived_id("mem0-add", ident.tenant, owner, session, digest)
    if not body.infer:
        results = []
        for m in body.messages:
            if m.role in ("user", "assistant") and m.content.strip():
                rec = await mem.remember(
                    m.content, session=session, metadata=metadata, type=MemoryType.FACT
                )
                results.append({"id": rec.id, "memory": rec.content, "event": "ADD"})
        return {"results": results, "status": "SUCCEEDED", "event_id": event_id}
    try:
        event = _turn(ident, mem, ent, body, event_id, session, metadata, at)
    except PydanticValidationError as exc:
        raise ApiError(422, "validation_error", field_errors(exc.errors())) from None
    res = await mem.publish(event)
    return {
        "message": "Memory processing has been queued for background execution",
        "status": "PENDING",
        "event_id": res.event_id,
    }


def _turn(
    ident: Identity,
    mem: MemoryClient,
    ent: dict[str, str],
    body: AddBody,
    event_id: str,
    session: str,
    metadata: dict[str, Any],
    at: datetime,
) -> TurnEvent:
    return TurnEvent(
        event_id=event_id,
        tenant=ident.tenant,
        app=ent.get("app_id"),
        user=mem.user,
        agent=mem.agent,
        session=session,
        messages=[
            Message(role=Role(m.role), content=m.content, timestamp=at, sender=m.name)
            for m in body.messages
        ],
        metadata=metadata,
        occurred_at=at,
    )


@router.post("/v3/memories/search/", responses=ERRORS)
async def search(body: SearchBody, ident: AuthId, root: Root) -> dict[str, Any]:
    """Search the owners the filters name (the key's own by default)."""
    validate_filters(body.filters)
    found: list[Mem0Memory] = []
    narrowing = body.filters is not None or body.threshold is not None
    for user, agent in owners(ident, body.filters):
        mem = ident.client(root, user, agent)
        reply = await mem.recall(body.query, top_k=100 if narrowing else body.top_k)
        for h in reply.hits:
            out = of_hit(h)
            if body.threshold is not None and (out.score or 0.0) < body.threshold:
                continue
            if hit_matches(body.filters, h):
                found.append(out)
    found.sort(key=lambda m: m.score or 0.0, reverse=True)
    return {"results": [m.model_dump(mode="json") for m in found[: body.top_k]]}


async def _all_of(mem: MemoryClient) -> list[MemoryRecord]:
    out: list[MemoryRecord] = []
    offset: int | None = 0
    while offset is not None and len(out) < MAX_LISTED:
        reply = await mem.list_memories(limit=100, offset=offset)
        out += reply.memories
        offset = reply.next_offset
    return out


@router.post("/v3/memories/", response_model=Page, responses=ERRORS)
async def get_all(
    request: Request,
    ident: AuthId,
    root: Root,
    body: GetAllBody | None = None,
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
    page_size: Annotated[int, Query(ge=1, le=100)] = 100,
) -> Page:
    """Every memory of the owners the filters name, newest first, one page."""
    filters = body.filters if body else None
    validate_filters(filters)
    rows: list[MemoryRecord] = []
    for user, agent in owners(ident, filters):
        rows += await _all_of(ident.client(root, user, agent))
    seen: set[str] = set()
    kept = []
    for m in sorted(rows, key=lambda r: r.created_at, reverse=True):
        if m.id not in seen and record_matches(filters, m):
            seen.add(m.id)
            kept.append(of_record(m))
    start = (page - 1) * page_size
    base = str(request.url.remove_query_params(["page", "page_size"]))
    sep = "&" if "?" in base else "?"
    more = start + page_size < len(kept)
    return Page(
        count=len(kept),
        next=f"{base}{sep}page={page + 1}&page_size={page_size}" if more else None,
        previous=f"{base}{sep}page={page - 1}&page_size={page_size}" if page > 1 else None,
        results=kept[start : start + page_size],
    )


MemoryId = Annotated[str, StringConstraints(min_length=1, max_length=200)]


@router.get("/v1/memories/{memory_id}/", response_model=Mem0Memory, responses=ERRORS)
async def get_one(memory_id: MemoryId, ident: AuthId, root: Root) -> Mem0Memory:
    """One memory of the key's owner."""
    return of_record(await _owned(_ident_client(ident, root), memory_id))


@router.put("/v1/memories/{memory_id}/", response_model=Mem0Memory, responses=ERRORS)
async def update(memory_id: MemoryId, body: UpdateBody, ident: AuthId, root: Root) -> Mem0Memory:
    """New text and/or metadata; the memory keeps its id and is redacted and re-indexed."""
    if body.timestamp is not None:
        raise ApiError(422, "validation_error", "timestamp: changing it is not supported")
    if body.expiration_date is not None:
        raise ApiError(422, "validation_error", "expiration_date: not supported on update")
    if body.text is None and body.metadata is None:
        raise ApiError(422, "validation_error", "send text and/or metadata")
    if has_nul(body.model_dump()):
        raise ApiError(422, "validation_error", "text must not contain NUL characters")
    mem = _ident_client(ident, root)
    old = await _owned(mem, memory_id)
    if old.fact_key is not None:
        raise ApiError(409, "conflict", "a versioned fact changes with fact_update")
    fields: dict[str, Any] = {"id": memory_id, "content": body.text or old.content}
    if body.metadata is not None:
        fields["metadata"] = body.metadata
    try:
        reply = await mem.command("update", **fields)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise
    if reply.memory is None:
        raise ApiError(500, "internal", "the memory was not returned")
    return of_record(reply.memory)


@router.delete("/v1/memories/{memory_id}/", responses=ERRORS)
async def delete_one(
    memory_id: MemoryId,
    ident: AuthId,
    root: Root,
    delete_linked: Annotated[bool, Query()] = False,
) -> dict[str, str]:
    """Forget one memory: gone from search, get and get-all at once."""
    mem = _ident_client(ident, root)
    try:
        await mem.forget(memory_id)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise
    return {"message": "Memory deleted successfully!"}


KIND_EVENT = {"stored": "ADD", "updated": "UPDATE", "forgotten": "DELETE"}


@router.get("/v1/memories/{memory_id}/history/", responses=ERRORS)
async def history(memory_id: MemoryId, ident: AuthId, root: Root) -> list[dict[str, Any]]:
    """What happened to one memory, oldest first (ADD, UPDATE, DELETE). memstream's audit
    holds no text, so only the latest entry carries the memory's current text."""
    mem = _ident_client(ident, root)
    try:
        reply = await mem.command("history", id=memory_id)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise
    m = reply.memory
    if m is None:
        raise ApiError(500, "internal", "the memory was not returned")
    events = [e for e in reply.detail.get("events", []) if e.get("kind") in KIND_EVENT]
    out = []
    for i, e in enumerate(events):
        last = i == len(events) - 1
        out.append(
            {
                "id": derived_id("mem0-history", m.id, str(i), str(e.get("at"))),
                "memory_id": m.id,
                "input": [],
                "old_memory": None,
                "new_memory": m.content if last else None,
                "user_id": m.user,
                "agent_id": m.agent,
                "event": KIND_EVENT[e["kind"]],
                "metadata": dict(m.metadata),
                "created_at": e.get("at"),
                "updated_at": e.get("at"),
            }
        )
    return out


@router.delete("/v1/memories/", responses=ERRORS)
async def delete_all(
    ident: AuthId,
    root: Root,
    user_id: Annotated[str | None, Query(max_length=200)] = None,
    agent_id: Annotated[str | None, Query(max_length=200)] = None,
    run_id: Annotated[str | None, Query(max_length=200)] = None,
    app_id: Annotated[str | None, Query(max_length=200)] = None,
    filters: Annotated[str | None, Query(max_length=10_000)] = None,
) -> dict[str, Any]:
    """Erase one owner's memories (or one run's), with their raw turns."""
    ent = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id, "app_id": app_id}
    if filters:
        ent.update({k: v for k, v in _query_filters(filters).items() if ent.get(k) is None})
    if ent["app_id"] is not None:
        raise ApiError(422, "validation_error", "app_id: delete_all by app is not supported")
    if ent["user_id"] is None and ent["agent_id"] is None and ent["run_id"] is None:
        raise ApiError(422, "validation_error", "delete_all: name user_id, agent_id or run_id")
    mem = ident.client(root, ent["user_id"], ent["agent_id"])
    session = f"run:{ent['run_id']}" if ent["run_id"] else None
    counts = await mem.forget_owner(session=session)
    return {"message": "Memories deleted successfully!", "deleted": counts.get("memories", 0)}


def _query_filters(raw: str) -> dict[str, str]:
    """``filters`` as httpx sends a dict in a query string: JSON, or a Python dict's repr
    (string keys and values only: parsed, never evaluated)."""
    text = raw.strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        try:
            parsed = json.loads(text.replace("'", '"'))
        except ValueError:
            raise ApiError(422, "validation_error", "filters: not a JSON object") from None
    if not isinstance(parsed, dict) or not all(
        k in ENTITIES and isinstance(v, str) for k, v in parsed.items()
    ):
        raise ApiError(
            422, "validation_error", f"filters: delete_all takes only {', '.join(ENTITIES)}"
        )
    return parsed


# --- what is not served ---------------------------------------------------------------------

UNSERVED = {
    "/v1/batch/": "batch updates and deletes",
    "/v1/exports/{rest:path}": "memory exports",
    "/v1/summary/": "summaries",
    "/v1/entities/{rest:path}": "entities",
    "/v2/entities/{rest:path}": "entities and profiles",
    "/v2/profiles/{rest:path}": "profiles",
    "/v1/feedback/": "feedback",
    "/v1/event/{rest:path}": "event polling (use memstream's flush)",
    "/v1/webhooks/{rest:path}": "webhooks",
    "/api/v1/webhooks/{rest:path}": "webhooks",
    "/api/v1/orgs/{rest:path}": "organizations and projects",
    "/v1/{rest:path}": "this Mem0 endpoint (graph, v1/v2 memory routes and others)",
    "/v2/{rest:path}": "this Mem0 endpoint",
    "/v3/{rest:path}": "this Mem0 endpoint",
}


def _unserved(what: str) -> Any:
    async def route() -> None:
        raise not_implemented(what)

    return route


for _path, _what in UNSERVED.items():
    router.add_api_route(
        _path,
        _unserved(_what),
        methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
        responses=ERRORS,
    )

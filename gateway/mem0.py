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
- ``DELETE /v1/memories/`` (one owner, or one run);
- ``GET``, ``PUT`` (``text``, ``metadata``), ``DELETE /v1/memories/{id}/`` and
  ``GET /v1/memories/{id}/history/``: the routes on one memory (``mem0_memory.py``).

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
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import ValidationError as PydanticValidationError

from memstream.gateway.errors import ApiError, ErrorBody, unauthorized
from memstream.gateway.identity import Identity, Root, resolver
from memstream.gateway.mem0_shapes import (
    ENTITIES,
    AddBody,
    GetAllBody,
    Mem0Memory,
    Page,
    SearchBody,
    hit_matches,
    of_hit,
    of_record,
    owners,
    record_matches,
    validate_filters,
)
from memstream.gateway.models import has_nul
from memstream.producers.client import MemoryClient
from memstream.schemas.errors import describe
from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import MemoryRecord, MemoryType

router = APIRouter(tags=["Mem0-compatible API"])

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
                rec = await mem.remember(  # infer=False keeps each message as it is
                    m.content,
                    session=session,
                    metadata=metadata,
                    type=MemoryType.FACT,
                    fold_near_duplicates=False,
                )
                results.append({"id": rec.id, "memory": rec.content, "event": "ADD"})
        return {"results": results, "status": "SUCCEEDED", "event_id": event_id}
    try:
        event = _turn(ident, mem, ent, body, event_id, session, metadata, at)
    except PydanticValidationError as exc:
        raise ApiError(422, "validation_error", describe(exc)) from None
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

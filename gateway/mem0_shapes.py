"""The Mem0-compatible API's wire shapes (the bodies ``mem0ai`` 2.2.1 sends, the memory it
reads) and its filters: which owners a filter names, and whether a memory satisfies it
(``mem0.py`` serves the routes)."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from memstream.gateway import filters as flt
from memstream.gateway.errors import ApiError
from memstream.gateway.identity import Identity
from memstream.schemas.memory import MemoryRecord, MemoryType
from memstream.schemas.recall import Hit

Id = Annotated[str, StringConstraints(min_length=1, max_length=200)]
ENTITIES = ("user_id", "agent_id", "run_id", "app_id")
UNSUPPORTED_FIELDS = ("categories", "created_at", "updated_at", "keywords", "expiration_date")
MAX_OWNERS = 10  # owners one filter may name


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

"""The Qdrant server adapter's layout (storage/qdrant_server.py): what a point's payload
holds, which fields are indexed, and the server filters a ``VectorFilter`` becomes (whose
points a read may see, what narrows it, which points BM25's IDF is computed over)."""

from __future__ import annotations

from typing import Any

from qdrant_client import models

from memstream.schemas.errors import ConfigurationError
from memstream.storage.ports import IdfScope, Record, VectorFilter, VectorPoint, payload_fields

SPARSE_NAME = "bm25"
KEYWORD_FIELDS = ("user", "agent", "session", "type", "scope", "project", "tags")
FLOAT_FIELDS = ("occurred_at", "expires_at")
BOOL_FIELDS = ("pinned",)


def payload(p: VectorPoint) -> dict[str, Any]:
    """Everything in the point but the vectors; absent values are stored as null."""
    return {**payload_fields(p), "record": dict(p.record)}


def match_value(key: str, value: str) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


def _empty(key: str) -> models.IsEmptyCondition:
    return models.IsEmptyCondition(is_empty=models.PayloadField(key=key))


def _owner_conditions(flt: VectorFilter) -> tuple[list[models.Condition], list[models.Condition]]:
    """(must, must_not) for whose points ``flt`` reads (``VectorFilter``'s owner rules); an
    unset user or agent of the owner matches only points without one."""
    must: list[models.Condition] = [match_value("tenant", flt.tenant)]
    if flt.peer:
        must.append(_empty("user"))
        if flt.agent is not None:
            must.append(match_value("agent", flt.agent))
        must_not: list[models.Condition] = [_empty("agent")]
        if flt.exclude_agent is not None:
            must_not.append(match_value("agent", flt.exclude_agent))
        return must, must_not
    if flt.user is None and flt.agent is None:
        return must, []
    own = models.Filter(
        must=[
            match_value(key, value) if value is not None else _empty(key)
            for key, value in (("user", flt.user), ("agent", flt.agent))
        ]
    )
    if not flt.shared:
        return [*must, own], []
    shared: list[models.Condition] = [own, match_value("scope", "global")]
    if flt.project is not None:
        shared.append(
            models.Filter(
                must=[match_value("scope", "project"), match_value("project", flt.project)]
            )
        )
    return [*must, models.Filter(should=shared)], []


def server_filter(flt: VectorFilter) -> models.Filter:
    """Whose points (``_owner_conditions``); every other field of ``flt`` narrows (AND);
    expired points are hidden."""
    must, must_not = _owner_conditions(flt)
    if flt.session is not None:
        must.append(match_value("session", flt.session))
    if flt.types:
        any_type = models.MatchAny(any=[t.value for t in flt.types])
        must.append(models.FieldCondition(key="type", match=any_type))
    if flt.scopes:
        any_scope = models.MatchAny(any=[s.value for s in flt.scopes])
        must.append(models.FieldCondition(key="scope", match=any_scope))
    must += [match_value("tags", tag) for tag in flt.tags]  # one condition per tag: all of them
    if flt.occurred_from is not None or flt.occurred_to is not None:
        span = models.Range(gte=flt.occurred_from, lte=flt.occurred_to)
        must.append(models.FieldCondition(key="occurred_at", range=span))
    if flt.now is not None:  # a null or missing expires_at never matches the range: kept
        expired = models.Range(lte=flt.now)
        must_not.append(models.FieldCondition(key="expires_at", range=expired))
    return models.Filter(must=must, must_not=must_not or None)


def idf_corpus(flt: VectorFilter, scope: IdfScope) -> models.Filter | None:
    """The points BM25's IDF is computed over: the tenant (default), the tenant narrowed to
    the owner (user and/or agent) the filter names, or the whole collection (``None``).
    Session, type, time and tag filters never change the statistics."""
    if scope == "collection":
        return None
    must: list[models.Condition] = [match_value("tenant", flt.tenant)]
    if scope == "owner":
        for key, value in (("user", flt.user), ("agent", flt.agent)):
            if value is not None:
                must.append(match_value(key, value))
    return models.Filter(must=must)


def stored_record(payload: dict[str, Any] | None) -> Record:
    record = (payload or {}).get("record")
    return record if isinstance(record, dict) else {}


def has_bm25(info: models.CollectionInfo) -> bool:
    sparse = info.config.params.sparse_vectors or {}
    params = sparse.get(SPARSE_NAME)
    if params is not None and params.modifier != models.Modifier.IDF:
        raise ConfigurationError(
            f"sparse vector {SPARSE_NAME!r} exists without the IDF modifier: drop it "
            "(delete_vector_name) and run ensure() again, then re-upsert the memories"
        )
    return params is not None

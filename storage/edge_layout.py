"""How a memory's point looks in the Qdrant Edge shard, and how a ``VectorFilter`` becomes the
engine's filter (``storage/qdrant_edge.py`` holds the shard and its calls).

Payload: every field of ``VectorPoint`` but the vectors, plus the point's owner keys ``o_t``,
``o_u``, ``o_a``, ``o_ua`` and ``o_x`` (``owner_key``; every search filters on one); ``record``
is one JSON string, handed back by ``fetch`` and searches with records."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import qdrant_edge as qe

from memstream.storage.ports import (
    Record,
    RecordHit,
    VectorFilter,
    VectorPoint,
    payload_fields,
    visible,
)

# the owner key fields by what the filter names (``owner_key``)
OWNER_FIELDS = {"t": "o_t", "u": "o_u", "a": "o_a", "ua": "o_ua"}
# the key of the point's exact owner (its own kind): own reads match the owner exactly, so a
# user-only caller never sees the user's memories with an agent (``o_u`` holds both)
EXACT_FIELD = "o_x"
KEYWORD_FIELDS = (
    *OWNER_FIELDS.values(),
    EXACT_FIELD,
    "user",
    "agent",
    "session",
    "type",
    "scope",
    "project",
    "tags",
)
FLOAT_FIELDS = ("occurred_at", "expires_at")
BOOL_FIELDS = ("pinned",)


def owner_kind(user: str | None, agent: str | None) -> str:
    if user is not None and agent is not None:
        return "ua"
    return "u" if user is not None else "a" if agent is not None else "t"


@lru_cache(maxsize=8192)  # built for both legs of every search
def owner_key(tenant: str, user: str | None, agent: str | None) -> str:
    """The key of a tenant, or of a tenant's user, agent or user-and-agent: BLAKE2b-88 of the
    unambiguous JSON ``[kind, tenant, user?, agent?]``, 15 characters of base64url. Kept in
    its own scalar field per kind (``OWNER_FIELDS``), because a filtered dense search checks
    the value of every point it visits and the engine keeps keyword values of up to 15 bytes
    inline: a longer value, or a list of values, makes every filtered search markedly slower
    (docs/benchmarks.md). A collision would need a
    second preimage of an 88-bit hash, and is harmless: ``fetch`` checks the tenant of every
    record, recall the user and agent, searches with records all three."""
    parts = [owner_kind(user, agent), tenant, *(v for v in (user, agent) if v is not None)]
    digest = hashlib.blake2b(json.dumps(parts).encode(), digest_size=11).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()  # 11 bytes: 15 characters


def owner_payload(tenant: str, user: str | None, agent: str | None) -> dict[str, str]:
    """The owner keys a point of this owner carries (one per kind it has)."""
    keys = {OWNER_FIELDS["t"]: owner_key(tenant, None, None)}
    if user is not None:
        keys[OWNER_FIELDS["u"]] = owner_key(tenant, user, None)
    if agent is not None:
        keys[OWNER_FIELDS["a"]] = owner_key(tenant, None, agent)
    if user is not None and agent is not None:
        keys[OWNER_FIELDS["ua"]] = owner_key(tenant, user, agent)
    keys[EXACT_FIELD] = owner_key(tenant, user, agent)
    return keys


def payload(p: VectorPoint) -> dict[str, Any]:
    """Everything in the point but the vectors; absent values are stored as null. The record
    is one JSON string: the engine converts a Python dict key by key, which took half of a
    point's conversion, and a string at once (``stored_record`` reads both forms)."""
    return {
        **owner_payload(p.tenant, p.user, p.agent),
        **payload_fields(p),
        "record": json.dumps(p.record, separators=(",", ":")),
    }


def match_value(key: str, value: str) -> qe.FieldCondition:
    return qe.FieldCondition(key, match=qe.MatchValue(value))


def _owner_conditions(flt: VectorFilter) -> tuple[list[Any], list[Any]]:
    """(must, must_not) for whose points ``flt`` reads (``VectorFilter``'s owner rules): one
    exact owner key, a tenant key with ``should`` over the owner and the shared scopes, an
    agent (or tenant) key without a user for peer reads, or the tenant key alone."""
    tenant_key = match_value(OWNER_FIELDS["t"], owner_key(flt.tenant, None, None))
    if flt.peer:
        kind = "a" if flt.agent is not None else "t"
        must: list[Any] = [
            match_value(OWNER_FIELDS[kind], owner_key(flt.tenant, None, flt.agent)),
            qe.IsEmptyCondition("user"),
        ]
        must_not: list[Any] = [qe.IsEmptyCondition("agent")]
        if flt.exclude_agent is not None:
            must_not.append(match_value("agent", flt.exclude_agent))
        return must, must_not
    if flt.user is None and flt.agent is None:
        return [tenant_key], []
    own = match_value(EXACT_FIELD, owner_key(flt.tenant, flt.user, flt.agent))
    if not flt.shared:
        return [own], []
    shared: list[Any] = [own, match_value("scope", "global")]
    if flt.project is not None:
        shared.append(
            qe.Filter(must=[match_value("scope", "project"), match_value("project", flt.project)])
        )
    return [tenant_key, qe.Filter(should=shared)], []


def edge_filter(flt: VectorFilter, may_expire: bool = True) -> qe.Filter:
    """Whose points (``_owner_conditions``); every other field of ``flt`` narrows (AND);
    expired points are hidden. ``may_expire=False`` (no point of the tenant has expired at
    ``flt.now``: ``Expiries``) leaves the expiry condition out: on an unindexed segment it is
    checked on every point visited, a cost each leg pays for nothing when nothing expired."""
    must, must_not = _owner_conditions(flt)
    if flt.session is not None:
        must.append(match_value("session", flt.session))
    if flt.types:
        must.append(qe.FieldCondition("type", match=qe.MatchAny([t.value for t in flt.types])))
    if flt.scopes:
        must.append(qe.FieldCondition("scope", match=qe.MatchAny([s.value for s in flt.scopes])))
    must += [match_value("tags", tag) for tag in flt.tags]  # one condition per tag: all of them
    if flt.occurred_from is not None or flt.occurred_to is not None:
        span = qe.RangeFloat(gte=flt.occurred_from, lte=flt.occurred_to)
        must.append(qe.FieldCondition("occurred_at", range=span))
    if flt.now is not None and may_expire:  # a null expires_at never matches the range: kept
        must_not.append(qe.FieldCondition("expires_at", range=qe.RangeFloat(lte=flt.now)))
    return qe.Filter(must=must, must_not=must_not or None)


def stored_record(payload: dict[str, Any] | None) -> Record:
    """The record of a stored point: a JSON string, or a dict in a shard written before."""
    record = (payload or {}).get("record")
    if isinstance(record, str):
        try:
            record = json.loads(record)
        except ValueError:
            return {}
    return record if isinstance(record, dict) else {}


def owned_hits(hits: Sequence[qe.ScoredPoint], flt: VectorFilter) -> list[RecordHit]:
    """The hits ``flt``'s owner may read, with their records: the payloads are read anyway,
    so the owner is checked exactly here, not only by the engine's keyword filter."""
    out = []
    for h in hits:
        p = h.payload or {}
        if p.get("tenant") == flt.tenant and visible(
            flt, p.get("user"), p.get("agent"), str(p.get("scope")), p.get("project")
        ):
            out.append((str(h.id), float(h.score), stored_record(p)))
    return out

"""The search filter language (seed 003's ``filters``).

A filter is a JSON object:

- ``{"AND": [f, ...]}``, ``{"OR": [f, ...]}``: every / any of the filters;
- ``{"field": value}``: equality; ``{"field": {"eq": v}}``, ``{"ne": v}``, ``{"in": [v, ...]}``,
  ``{"nin": [v, ...]}``; several fields in one object must all hold.

Fields: ``id``, ``session_id``, ``memory_type`` (the seed's types), ``type`` (memstream's),
``scope``, ``user_id``, ``agent_id``, ``pinned``, ``tags`` (a list: ``eq`` means "has this
tag", ``in`` "has any of these"), and metadata as ``metadata.<key>`` or, for a name that is no
field above, the bare key. Values are strings, numbers, booleans or null.

Filters are checked in the gateway on each scope's candidates (the best 100 when a filter or a
radius is given). What every match must meet and recall can apply itself (``narrowing``: a
type, a scope, a tag, in the filter's top-level conjunction) is pushed to the workers too, so
those 100 are the best among the memories that can match, not among all of the owner's; the
scope's own condition is pushed as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memstream.gateway.errors import ApiError
from memstream.schemas.recall import Hit

FIELDS = (
    "id",
    "session_id",
    "memory_type",
    "type",
    "scope",
    "user_id",
    "agent_id",
    "pinned",
    "tags",
)
OPS = ("eq", "ne", "in", "nin")
MAX_DEPTH = 8
MAX_CLAUSES = 200
Scalar = str | int | float | bool | None


def fields_of(h: Hit, memory_type: str) -> dict[str, Any]:
    """The fields a filter sees for ``h``. ``memory_type`` is the surface's own name for the
    type (the seed's, or memstream's where the surface has no other)."""
    return {
        "id": h.id,
        "session_id": h.session,
        "memory_type": memory_type,
        "type": h.type.value,
        "scope": h.scope.value,
        "user_id": h.user,
        "agent_id": h.agent,
        "pinned": h.pinned,
        "tags": list(h.tags),
        "metadata": dict(h.metadata),
    }


def _bad(message: str) -> ApiError:
    return ApiError(422, "validation_error", f"filters: {message}")


def _scalar(v: Any, where: str) -> None:
    if not isinstance(v, str | int | float | bool) and v is not None:
        raise _bad(f"{where}: values must be strings, numbers, booleans or null")


def validate(f: Any, depth: int = 0, count: list[int] | None = None) -> None:
    """Raise a 422 ``ApiError`` unless ``f`` is a filter of the language above."""
    count = count if count is not None else [0]
    count[0] += 1
    if count[0] > MAX_CLAUSES or depth > MAX_DEPTH:
        raise _bad(f"at most {MAX_CLAUSES} clauses, nested at most {MAX_DEPTH} deep")
    if not isinstance(f, dict) or not f:
        raise _bad("a filter is a non-empty JSON object")
    for k, v in f.items():
        if k in ("AND", "OR"):
            if not isinstance(v, list) or not v:
                raise _bad(f"{k} takes a non-empty list of filters")
            for sub in v:
                validate(sub, depth + 1, count)
            continue
        if not isinstance(k, str) or not k or len(k) > 200:
            raise _bad("field names are strings of 1..200 characters")
        if isinstance(v, dict):
            if len(v) != 1 or next(iter(v)) not in OPS:
                raise _bad(f"{k}: a condition is one of {', '.join(OPS)}")
            op, arg = next(iter(v.items()))
            if op in ("in", "nin"):
                if not isinstance(arg, list) or len(arg) > 1000:
                    raise _bad(f"{k}.{op} takes a list (at most 1000 values)")
                for x in arg:
                    _scalar(x, f"{k}.{op}")
            else:
                _scalar(arg, f"{k}.{op}")
        else:
            _scalar(v, k)


def _value(item: Mapping[str, Any], field: str) -> Any:
    if field in FIELDS:
        return item.get(field)
    key = field[len("metadata.") :] if field.startswith("metadata.") else field
    return (item.get("metadata") or {}).get(key)


def _holds(actual: Any, op: str, arg: Any) -> bool:
    if isinstance(actual, list):  # tags: a set membership
        if op == "eq":
            return arg in actual
        if op == "ne":
            return arg not in actual
        hit = any(a in actual for a in arg)
        return hit if op == "in" else not hit
    if op == "eq":
        return bool(actual == arg)
    if op == "ne":
        return bool(actual != arg)
    return (actual in arg) if op == "in" else (actual not in arg)


def matches(f: Mapping[str, Any] | None, item: Mapping[str, Any]) -> bool:
    """True when ``item`` (a result's fields, ``metadata`` a dict) satisfies the filter."""
    if not f:
        return True
    for k, v in f.items():
        if k == "AND":
            if not all(matches(sub, item) for sub in v):
                return False
        elif k == "OR":
            if not any(matches(sub, item) for sub in v):
                return False
        else:
            op, arg = next(iter(v.items())) if isinstance(v, dict) else ("eq", v)
            if not _holds(_value(item, k), op, arg):
                return False
    return True


def compose(
    caller: Mapping[str, Any] | None, scope: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """Seed 003's composition: either filter alone, or ``{"AND": [caller, scope]}``."""
    if caller and scope:
        return {"AND": [dict(caller), dict(scope)]}
    if caller:
        return dict(caller)
    return dict(scope) if scope else None


def _tag(value: str) -> bool:
    """A value recall takes as a tag (``schemas.events.Tag``); another is left to ``matches``."""
    return 0 < len(value) <= 64 and value.isprintable()


@dataclass(frozen=True)
class Narrowing:
    """What every item a filter matches must have: memstream types, scopes (values; None:
    any) and tags (all of them)."""

    types: frozenset[str] | None = None
    scopes: frozenset[str] | None = None
    tags: frozenset[str] = frozenset()

    def __and__(self, other: Narrowing) -> Narrowing:
        def both(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
            return b if a is None else a if b is None else a & b

        return Narrowing(
            both(self.types, other.types), both(self.scopes, other.scopes), self.tags | other.tags
        )


def narrowing(f: Mapping[str, Any] | None, seed_types: Mapping[str, str]) -> Narrowing:
    """The conditions of ``f`` every match must meet that recall can apply itself: ``type``
    and ``memory_type`` (``seed_types``: memstream type -> the surface's name), ``scope``,
    each as ``eq`` or ``in``, and ``tags`` ``eq``, in ``f``'s top-level conjunction (an
    ``OR`` narrows nothing). Recall then ranks only what can match; ``matches`` still
    decides every result."""
    out = Narrowing()
    for k, v in (f or {}).items():
        if k == "AND":
            for sub in v:
                out &= narrowing(sub, seed_types)
            continue
        if k == "OR":
            continue
        op, arg = next(iter(v.items())) if isinstance(v, dict) else ("eq", v)
        if op not in ("eq", "in"):
            continue
        values = frozenset(x for x in ([arg] if op == "eq" else arg) if isinstance(x, str))
        if k == "type":
            out &= Narrowing(types=values)
        elif k == "memory_type":
            out &= Narrowing(types=frozenset(t for t, s in seed_types.items() if s in values))
        elif k == "scope":
            out &= Narrowing(scopes=values)
        elif k == "tags" and op == "eq" and isinstance(arg, str) and _tag(arg):
            out &= Narrowing(tags=frozenset([arg]))
    return out

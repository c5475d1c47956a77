"""How LangGraph's store model maps onto memstream's memories (pure: no I/O).

An item is one memstream memory: its text is what recall searches, its value, namespace and
key ride in the memory's metadata (under ``MARK``), and tags locate it exactly (a hash of each
namespace prefix, and of namespace + key). Namespaces map to owners and scopes:

| namespace | memstream owner | scope |
|---|---|---|
| ``("users", U, ...)`` | user U | user |
| ``("agents", A, ...)`` | agent A | user |
| ``("users", U, "agents", A, ...)`` | user U and agent A | user |
| ``("projects", P, ...)`` | the store's owner, project P | project (shared with P) |
| ``("global", ...)`` | the store's owner | global (shared with the tenant) |
| anything else | the store's owner (the client's user/agent) | user |

Filters and namespace conditions follow LangGraph's own semantics, checked here on what the
workers return.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import Item, MatchCondition, SearchItem

from memstream.schemas.memory import MemoryRecord
from memstream.schemas.recall import Hit

MARK = "langgraph"  # the tag every item carries, and its metadata key


@dataclass(frozen=True)
class Where:
    """Where a namespace lives: the owner (None: the store's own), scope and project."""

    user: str | None
    agent: str | None
    scope: str
    project: str | None


def where(namespace: Sequence[str]) -> Where:
    """The owner and scope a namespace maps to (the table in the module docstring)."""
    ns = tuple(namespace)
    if len(ns) >= 4 and ns[0] == "users" and ns[2] == "agents":
        return Where(ns[1], ns[3], "user", None)
    if len(ns) >= 2 and ns[0] == "users":
        return Where(ns[1], None, "user", None)
    if len(ns) >= 2 and ns[0] == "agents":
        return Where(None, ns[1], "user", None)
    if len(ns) >= 2 and ns[0] == "projects":
        return Where(None, None, "project", ns[1])
    if ns[:1] == ("global",):
        return Where(None, None, "global", None)
    return Where(None, None, "user", None)


def _h(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def prefix_tag(namespace: Sequence[str]) -> str:
    """The tag every item under ``namespace`` (at any depth) carries."""
    return f"lgns:{_h(*namespace)}"


def key_tag(namespace: Sequence[str], key: str) -> str:
    """The tag of exactly one item: this namespace and key."""
    return f"lgkey:{_h(list(namespace), key)}"


def meta_of(m: MemoryRecord | Hit) -> dict[str, Any]:
    """What the store keeps of an item in the memory's metadata ({} for another memory)."""
    meta = m.metadata.get(MARK)
    return meta if isinstance(meta, dict) else {}


def is_current(record: MemoryRecord, meta: dict[str, Any]) -> bool:
    """The stored record already is this item's version (a put that changes nothing)."""
    mine, theirs = meta[MARK], meta_of(record)
    return all(theirs.get(k) == mine[k] for k in ("namespace", "key", "value"))


def to_item(m: MemoryRecord | Hit, ns: tuple[str, ...], key: str) -> Item:
    """The LangGraph item a memory holds, under the namespace and key it was asked by."""
    meta = meta_of(m)
    value = meta.get("value")
    return Item(
        value=value if isinstance(value, dict) else {},
        key=key,
        namespace=ns,
        created_at=datetime.fromtimestamp(stamp(m, "created"), UTC),
        updated_at=datetime.fromtimestamp(stamp(m, "updated"), UTC),
    )


def to_search_item(m: MemoryRecord | Hit, score: float | None) -> SearchItem:
    """A search result: namespace and key as the memory's metadata records them."""
    meta = meta_of(m)
    value = meta.get("value")
    return SearchItem(
        namespace=tuple(str(x) for x in meta.get("namespace", ())),
        key=str(meta.get("key", "")),
        value=value if isinstance(value, dict) else {},
        created_at=datetime.fromtimestamp(stamp(m, "created"), UTC),
        updated_at=datetime.fromtimestamp(stamp(m, "updated"), UTC),
        score=score,
    )


def stamp(m: MemoryRecord | Hit, name: str) -> float:
    """The item's ``created`` or ``updated`` time (epoch seconds), else the memory's."""
    value = meta_of(m).get(name)
    if isinstance(value, int | float) and value > 0:
        return float(value)
    return m.created_at.timestamp()


def text_at(value: Mapping[str, Any], path: str) -> str:
    """The text at a dotted path of the value ("a.b"); lists are joined."""
    cur: Any = value
    for part in path.split("."):
        if isinstance(cur, Mapping):
            cur = cur.get(part.removesuffix("[*]"))
        else:
            return ""
    if isinstance(cur, list):
        return " ".join(str(x) for x in cur if x is not None)
    return "" if cur is None else (cur if isinstance(cur, str) else json.dumps(cur))


def until_wildcard(path: Sequence[str]) -> Iterable[str]:
    """The concrete head of a namespace path: the parts before its first ``*``."""
    for p in path:
        if p == "*":
            return
        yield p


def namespace_matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    """LangGraph's prefix/suffix namespace condition, ``*`` matching any one part."""
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    pairs = zip(ns, path, strict=False)
    if cond.match_type == "suffix":
        pairs = zip(reversed(ns), reversed(path), strict=False)
    return all(p == "*" or k == p for k, p in pairs)


def value_matches(value: Mapping[str, Any], flt: Mapping[str, Any]) -> bool:
    """Every field of a LangGraph search filter holds for the item's value."""
    return all(_compare(value.get(k), v) for k, v in flt.items())


def _compare(actual: Any, wanted: Any) -> bool:
    """LangGraph's filter semantics: equality, nested dicts, and $eq $ne $gt $gte $lt $lte."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(actual, k, v) for k, v in wanted.items())
        return isinstance(actual, dict) and all(
            _compare(actual.get(k), v) for k, v in wanted.items()
        )
    return bool(actual == wanted)


def _operator(actual: Any, op: str, wanted: Any) -> bool:
    if op == "$eq":
        return bool(actual == wanted)
    if op == "$ne":
        return bool(actual != wanted)
    if actual is None:
        return False
    a, b = float(actual), float(wanted)
    if op == "$gt":
        return a > b
    if op == "$gte":
        return a >= b
    if op == "$lt":
        return a < b
    if op == "$lte":
        return a <= b
    raise ValueError(f"unsupported filter operator {op!r}")

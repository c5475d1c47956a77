"""MemstreamStore's pure parts: the namespace -> owner/scope table and LangGraph's filter and
namespace-matching semantics."""

from __future__ import annotations

import pytest
from langgraph.store.base import MatchCondition

from memstream.producers.langgraph_items import (
    Where,
    _compare,
    key_tag,
    namespace_matches,
    prefix_tag,
    where,
)


@pytest.mark.parametrize(
    ("namespace", "expected"),
    [
        (("users", "u1", "memories"), Where("u1", None, "user", None)),
        (("users", "u1"), Where("u1", None, "user", None)),
        (("agents", "a1", "skills"), Where(None, "a1", "user", None)),
        (("users", "u1", "agents", "a1", "x"), Where("u1", "a1", "user", None)),
        (("projects", "apollo", "decisions"), Where(None, None, "project", "apollo")),
        (("global", "faq"), Where(None, None, "global", None)),
        (("memories", "u1"), Where(None, None, "user", None)),
        (("users",), Where(None, None, "user", None)),
    ],
)
def test_namespace_table(namespace: tuple[str, ...], expected: Where) -> None:
    """Each namespace shape maps to the owner and scope the docs' table gives."""
    assert where(namespace) == expected


def test_tags_are_exact_and_bounded() -> None:
    """Tags tell apart namespaces that join to the same string, and fit memstream's 64."""
    assert prefix_tag(("a", "b")) != prefix_tag(("a/b",)) != prefix_tag(("ab",))
    assert key_tag(("a",), "b/c") != key_tag(("a", "b"), "c")
    assert len(key_tag(("x" * 500,), "y" * 500)) <= 64


def test_match_conditions() -> None:
    """Prefix and suffix conditions with `*` wildcards, as LangGraph defines them."""
    ns = ("users", "u1", "memories")
    assert namespace_matches(MatchCondition("prefix", ("users", "*")), ns)
    assert namespace_matches(MatchCondition("suffix", ("memories",)), ns)
    assert not namespace_matches(MatchCondition("prefix", ("agents",)), ns)
    assert not namespace_matches(MatchCondition("suffix", ("u1",)), ns)
    assert not namespace_matches(MatchCondition("prefix", ("users", "u1", "memories", "x")), ns)


def test_filters() -> None:
    """Equality, nested objects and the comparison operators."""
    assert _compare(5, 5) and not _compare(5, 4)
    assert _compare({"a": {"b": 1}, "c": 2}, {"a": {"b": 1}})
    assert _compare(5, {"$gte": 4, "$lt": 6}) and not _compare(3, {"$gt": 3})
    assert _compare("x", {"$ne": "y"}) and not _compare(None, {"$gt": 1})
    with pytest.raises(ValueError, match="unsupported"):
        _compare(1, {"$near": 1})

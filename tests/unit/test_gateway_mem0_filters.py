"""The Mem0 filters' owners (pure): which owners a filter names, checked against the key."""

from __future__ import annotations

import pytest

from memstream.gateway.errors import ApiError
from memstream.gateway.identity import Identity
from memstream.gateway.mem0_shapes import conjunctions, owners, validate_filters

WIDE = Identity("t", None, None, "k")
ALICE = Identity("t", "alice", None, "k")


def test_and_or_become_one_owner_per_branch() -> None:
    """AND merges a branch's equalities; OR gives one owner per branch; in lists expand."""
    f = {"AND": [{"user_id": "u"}, {"OR": [{"agent_id": "a1"}, {"agent_id": {"in": ["a2"]}}]}]}
    assert conjunctions(f) == [
        {"user_id": "u", "agent_id": "a1"},
        {"user_id": "u", "agent_id": "a2"},
    ]
    assert owners(WIDE, f) == [("u", "a1"), ("u", "a2")]
    assert conjunctions({"AND": [{"user_id": "a"}, {"user_id": "b"}]}) == []  # impossible


def test_key_binding_fills_in_and_refuses() -> None:
    """A bound key is the owner when the filter names none, and 403 for another user."""
    assert owners(ALICE, None) == [("alice", None)]
    assert owners(ALICE, {"run_id": "r1"}) == [("alice", None)]
    with pytest.raises(ApiError) as err:
        owners(ALICE, {"OR": [{"user_id": "alice"}, {"user_id": "bob"}]})
    assert err.value.status == 403
    with pytest.raises(ApiError) as err:
        owners(WIDE, {"run_id": "r1"})  # a tenant-wide key with no owner named
    assert err.value.status == 422


@pytest.mark.parametrize(
    "bad",
    [
        {"user_id": "*"},
        {"created_at": {"gte": "2024-01-01"}},
        {"categories": {"in": ["x"]}},
        {"user_id": "u", "memory": {"contains": "tea"}},
        {"metadata": {"topic": "x"}},
        {"AND": []},
    ],
)
def test_what_cannot_be_evaluated_is_a_422(bad: dict[str, object]) -> None:
    """Operators and fields memstream cannot evaluate are refused, never ignored."""
    with pytest.raises(ApiError) as err:
        validate_filters(bad)
    assert err.value.status == 422 and err.value.code == "validation_error"

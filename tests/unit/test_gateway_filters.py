"""The gateway's filter language and the calibrated score (pure functions)."""

from __future__ import annotations

import pytest

from memstream.gateway import filters as flt
from memstream.gateway.errors import ApiError
from memstream.pipeline.fuse import KEYWORD_HALF, calibrated

ITEM = {
    "id": "m1",
    "session_id": "chat:c1",
    "memory_type": "profile",
    "scope": "user",
    "tags": ["a", "b"],
    "metadata": {"channel": "email", "n": 3},
}


@pytest.mark.parametrize(
    ("f", "expected"),
    [
        ({"session_id": "chat:c1"}, True),
        ({"session_id": {"eq": "chat:c2"}}, False),
        ({"session_id": {"in": ["chat:c2", "chat:c1"]}}, True),
        ({"session_id": {"nin": ["chat:c1"]}}, False),
        ({"memory_type": {"ne": "episode"}}, True),
        ({"tags": "a"}, True),
        ({"tags": {"in": ["x", "b"]}}, True),
        ({"tags": {"nin": ["a"]}}, False),
        ({"metadata.channel": "email"}, True),
        ({"channel": "sms"}, False),
        ({"n": {"in": [1, 3]}}, True),
        ({"missing": None}, True),
        ({"AND": [{"scope": "user"}, {"session_id": {"in": ["chat:c1"]}}]}, True),
        ({"AND": [{"scope": "user"}, {"session_id": {"in": ["chat:c9"]}}]}, False),
        ({"OR": [{"scope": "global"}, {"channel": "email"}]}, True),
        ({"OR": [{"scope": "global"}, {"channel": "sms"}]}, False),
        ({"scope": "user", "channel": "sms"}, False),
    ],
)
def test_matches(f, expected) -> None:
    """Equality, eq/ne/in/nin, tags as a set, metadata keys, AND, OR and implicit AND."""
    flt.validate(f)
    assert flt.matches(f, ITEM) is expected


@pytest.mark.parametrize(
    "f",
    [
        {},
        [],
        {"AND": []},
        {"OR": {"a": 1}},
        {"a": {"gt": 1}},
        {"a": {"in": 1}},
        {"a": [1]},
        {"a": {"eq": {"b": 1}}},
        {"a": {"eq": 1, "ne": 2}},
    ],
)
def test_invalid_filters(f) -> None:
    """Empty filters, non-list AND/OR, unknown operators, non-scalar values are refused."""
    with pytest.raises(ApiError) as info:
        flt.validate(f)
    assert info.value.status == 422


def test_depth_and_size_are_bounded() -> None:
    """A filter nested deeper than the limit is refused, not recursed into."""
    f: dict[str, object] = {"a": 1}
    for _ in range(flt.MAX_DEPTH + 2):
        f = {"AND": [f]}
    with pytest.raises(ApiError):
        flt.validate(f)


def test_compose_is_seed_003s_shape() -> None:
    """Caller and scope filters compose as {"AND": [caller, scope]}; either alone stays."""
    scope = {"session_id": {"in": ["chat:c1"]}}
    assert flt.compose({"a": 1}, scope) == {"AND": [{"a": 1}, scope]}
    assert flt.compose(None, scope) == scope
    assert flt.compose({"a": 1}, None) == {"a": 1}
    assert flt.compose(None, None) is None


def test_calibrated_does_not_depend_on_the_other_hits() -> None:
    """A document's calibrated score is the same whatever else the query found (min-max
    fusion would give the best of any query ~1)."""
    w = {"keyword": 0.7, "dense": 0.3}
    alone = calibrated({"keyword": [("d", 2.0)], "dense": [("d", 0.4)]}, w)
    crowded = calibrated(
        {"keyword": [("x", 30.0), ("d", 2.0)], "dense": [("x", 0.9), ("d", 0.4)]}, w
    )
    assert alone["d"] == pytest.approx(crowded["d"])
    assert alone["d"] == pytest.approx(0.7 * 2 / (2 + KEYWORD_HALF) + 0.3 * 0.4)
    assert 0 <= crowded["x"] <= 1


def test_calibrated_renormalises_over_the_legs_that_ran() -> None:
    """One leg alone scores on the full 0..1 range; negative cosines count 0."""
    w = {"keyword": 0.7, "dense": 0.3}
    assert calibrated({"dense": [("d", 0.8), ("e", -0.2)]}, w) == {"d": 0.8, "e": 0.0}
    assert calibrated({"keyword": [("d", KEYWORD_HALF)]}, w)["d"] == pytest.approx(0.5)


def test_narrowing_takes_only_what_every_match_must_have() -> None:
    """Pushed to recall: types (memstream's, or the seed's mapped back), scopes and tags of
    the top-level conjunction; an OR, a ``ne`` or ``nin``, a metadata field narrow nothing;
    two type conditions intersect (none left: no memory can match)."""
    seed = {"decision": "agent_case", "fix": "agent_case", "fact": "profile"}
    n = flt.narrowing(
        {"AND": [{"memory_type": "agent_case"}, {"scope": {"in": ["user", "global"]}}]}, seed
    )
    assert n == flt.Narrowing(
        types=frozenset({"decision", "fix"}), scopes=frozenset({"user", "global"})
    )
    assert flt.narrowing({"OR": [{"type": "fact"}, {"scope": "user"}]}, seed) == flt.Narrowing()
    none = {"type": {"ne": "fact"}, "scope": {"nin": ["run"]}, "metadata.k": "v"}
    assert flt.narrowing(none, seed) == flt.Narrowing()
    assert flt.narrowing({"tags": "blue", "type": {"in": ["fact", "fix"]}}, seed) == (
        flt.Narrowing(types=frozenset({"fact", "fix"}), tags=frozenset({"blue"}))
    )
    both = {"AND": [{"type": "fact"}, {"memory_type": "agent_case"}]}
    assert flt.narrowing(both, seed).types == frozenset()
    assert flt.narrowing({"tags": {"in": ["a", "b"]}}, seed) == flt.Narrowing()
    assert flt.narrowing(None, seed) == flt.Narrowing()

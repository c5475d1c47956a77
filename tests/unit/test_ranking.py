"""Recall's ranking rules (pipeline/ranking.py): leg size, scaling, fusion choice, select."""

from datetime import UTC, datetime
from typing import Any

import pytest

from memstream.pipeline.ranking import (
    PER_LEG,
    WEIGHTS,
    leg_size,
    scored,
    select,
    single,
    tokens,
)
from memstream.schemas.recall import RecallRequest

AT = datetime(2026, 1, 1, tzinfo=UTC).isoformat()


def rec(mid: str, text: str = "some text", sources: list[str] | None = None, **extra: Any):
    return {
        "id": mid,
        "text": text,
        "type": "episode",
        "scope": "user",
        "session": "s",
        "user": "u",
        "source_event_ids": sources if sources is not None else [f"e-{mid}"],
        "occurred_at": AT,
        "created_at": AT,
        **extra,
    }


def req(**kw: Any) -> RecallRequest:
    return RecallRequest(tenant="t", user="u", query="q", **kw)


def test_keyword_outweighs_dense() -> None:
    """The fusion weights favour the keyword leg and add up to one."""
    assert WEIGHTS["keyword"] > WEIGHTS["dense"]
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)


def test_leg_size_has_a_floor_and_grows_with_top_k() -> None:
    """Each leg hands at least PER_LEG candidates to fusion, and twice top_k when more."""
    assert leg_size(1) == PER_LEG
    assert leg_size(PER_LEG) == PER_LEG * 2
    assert leg_size(100) == 200


def test_a_keyword_leg_alone_is_scaled_to_its_best_hit() -> None:
    """BM25 has no fixed scale: the best keyword hit scores 1, the others relative to it."""
    assert single("keyword", [("a", 8.0), ("b", 2.0)]) == [("a", 1.0), ("b", 0.25)]
    assert single("keyword", []) == []


def test_a_dense_leg_alone_keeps_its_cosine_clipped() -> None:
    """A dense score is a cosine: kept as is, clipped to 0..1."""
    assert single("dense", [("a", 0.8), ("b", -0.2), ("c", 1.2)]) == [
        ("a", 0.8),
        ("b", 0.0),
        ("c", 1.0),
    ]


def test_two_legs_are_fused_and_one_leg_is_not() -> None:
    """With both legs the ranking is the weighted min-max fusion (a keyword lead wins over a
    dense lead); with one leg its own scaled scores; calibrated scores come with both."""
    legs = {"keyword": [("k", 10.0), ("d", 2.0)], "dense": [("d", 0.9), ("k", 0.5)]}
    ranked, absolute = scored(legs)
    assert [mid for mid, _ in ranked] == ["k", "d"]
    assert ranked[0][1] == pytest.approx(WEIGHTS["keyword"])
    assert set(absolute) == {"k", "d"} and all(0.0 <= v <= 1.0 for v in absolute.values())
    alone, absolute_alone = scored({"dense": [("d", 0.9)]})
    assert alone == [("d", 0.9)] and absolute_alone == {"d": pytest.approx(0.9)}


def test_select_applies_threshold_collapse_pin_and_top_k() -> None:
    """Hits under the threshold go; a hit whose sources better hits cover goes; pinned hits
    come first; then top_k cuts."""
    ranked = [
        (rec("a", sources=["e1"]), 0.9),
        (rec("b", sources=["e1"]), 0.8),  # covered by a
        (rec("c"), 0.7),
        (rec("p", pinned=True), 0.5),
        (rec("low"), 0.05),
    ]
    hits, truncated = select(ranked, req(top_k=3, score_threshold=0.1))
    assert [h.id for h in hits] == ["p", "a", "c"] and not truncated
    assert hits[1].score == 0.9 and hits[1].calibrated is None


def test_select_stops_at_the_token_budget_and_says_so() -> None:
    """The budget keeps whole hits in rank order and reports that it cut the list."""
    text = "x" * 40  # 11 tokens by the estimate
    assert tokens(text) == 11
    ranked = [(rec(m, text), 1.0 - i / 10) for i, m in enumerate("abc")]
    hits, truncated = select(ranked, req(token_budget=25))
    assert [h.id for h in hits] == ["a", "b"] and truncated
    hits, truncated = select(ranked, req(token_budget=33))
    assert len(hits) == 3 and not truncated


def test_a_hit_over_the_budget_is_skipped_and_shorter_ones_after_it_still_come() -> None:
    """A long episode ranked first that alone exceeds the budget is left out, and the short
    hits ranked after it fill the budget (before, the list ended at it: no hits at all)."""
    ranked = [
        (rec("long", "x" * 3600), 0.9),
        (rec("fix", "pin tzdata to 2024a"), 0.8),
        (rec("pref", "prefers green tea"), 0.7),
    ]
    hits, truncated = select(ranked, req(token_budget=600))
    assert [h.id for h in hits] == ["fix", "pref"] and truncated


def test_select_attaches_calibrated_scores_by_id() -> None:
    """A calibrated score is reported for the hit it was computed for, rounded."""
    hits, _ = select([(rec("a"), 0.5)], req(), {"a": 0.1234567})
    assert hits[0].calibrated == 0.123457

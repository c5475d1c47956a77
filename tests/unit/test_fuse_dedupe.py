"""fuse (RRF) and dedupe keys."""

from datetime import UTC, datetime

from memstream.pipeline.dedupe import key
from memstream.pipeline.fuse import normalise, rrf
from memstream.schemas.memory import Candidate, Owner


def test_rrf_rewards_agreement() -> None:
    """An id ranked well by both legs beats ids ranked first by one leg only."""
    fused = rrf({"a": ["x", "both"], "b": ["y", "both"]}, k=1)
    assert fused[0][0] == "both"


def test_rrf_weights_and_determinism() -> None:
    """Weights tilt the fusion; equal scores keep first-seen order."""
    assert rrf({"a": ["x"], "b": ["y"]}, weights={"b": 2.0})[0][0] == "y"
    assert [i for i, _ in rrf({"a": ["x"], "b": ["y"]})] == ["x", "y"]


def test_normalise_scales_best_to_one() -> None:
    """The best fused hit scores 1.0 and the order is kept."""
    out = normalise([("a", 0.5), ("b", 0.25)])
    assert out == [("a", 1.0), ("b", 0.5)]


def cand(content: str, user: str = "u", tenant: str = "t") -> Candidate:
    return Candidate(
        candidate_id="c",
        owner=Owner(tenant=tenant, user=user),
        session="s",
        content=content,
        source_event_id="e",
        occurred_at=datetime.now(UTC),
    )


def test_exact_duplicates_share_an_id_per_owner() -> None:
    """Case and white-space variants of one text by one owner map to one memory id."""
    assert key(cand("I like  Tea")).memory_id == key(cand("i like tea")).memory_id
    assert key(cand("I like tea", user="v")).memory_id != key(cand("I like tea")).memory_id
    assert key(cand("I like tea", tenant="t2")).memory_id != key(cand("I like tea")).memory_id

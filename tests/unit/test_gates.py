"""The middleware's recall gates (producers/gates.py): pure decisions over values."""

from __future__ import annotations

import pytest

from memstream.producers.gates import (
    GatePolicy,
    TopicState,
    decide,
    is_acknowledgement,
    recalled,
    refers_to_prior_work,
)


@pytest.mark.parametrize(
    "text", ["ok", "Ok, thanks!", "got it", "thank you very much", "👍", "yes"]
)
def test_acknowledgements(text: str) -> None:
    """Short acknowledgements are recognised, emoji included."""
    assert is_acknowledgement(text)


@pytest.mark.parametrize("text", ["ok so where is my bike?", "thanks, now deploy the invoice app"])
def test_not_acknowledgements(text: str) -> None:
    """An acknowledgement followed by a request is a request."""
    assert not is_acknowledgement(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("let's continue the previous task", True),
        ("like last time, use the staging cluster", True),
        ("what did you suggest yesterday?", True),
        ("write a haiku about the sea", False),
    ],
)
def test_prior_work(text: str, expected: bool) -> None:
    """References to earlier work are found; a fresh request is not one."""
    assert refers_to_prior_work(text) is expected


def served(state: TopicState, now: float = 0.0, hits: int = 2) -> TopicState:
    return recalled(state, now, hits, ok=True)


def test_session_start_then_fresh_cache_then_stale() -> None:
    """The first turn recalls; a same-topic follow-up reuses the cache until the window
    or the TTL runs out."""
    policy = GatePolicy(topic_window_turns=3, cache_ttl_s=100)
    first = decide("how does the invoice service deploy?", TopicState(), 0.0, policy)
    assert (first.recall, first.reason) == (True, "session_start")
    state = served(first.state)
    second = decide("does the invoice service deploy on fridays?", state, 10.0, policy)
    assert (second.recall, second.reason) == (False, "cache_fresh")
    third = decide("and the invoice service rollback?", second.state, 20.0, policy)
    assert third.reason == "cache_fresh" and third.state.turns == 3
    full = decide("invoice service rollback steps?", third.state, 30.0, policy)
    assert (full.recall, full.reason) == (True, "cache_stale")
    late = decide("does the invoice service deploy on fridays?", state, 500.0, policy)
    assert (late.recall, late.reason) == (True, "cache_stale")


def test_topic_change_and_low_confidence() -> None:
    """New content words mean a new topic; an empty or failed last recall asks again."""
    state = served(decide("invoice service deploys", TopicState(), 0.0).state)
    change = decide("what should I cook for dinner?", state, 1.0)
    assert (change.recall, change.reason) == (True, "topic_change")
    empty = recalled(decide("invoice service deploys", TopicState(), 0.0).state, 0, 0, ok=True)
    assert decide("invoice service deploys again?", empty, 1.0).reason == "prior_work"
    assert decide("invoice service deploys when?", empty, 1.0).reason == "low_confidence"
    failed = recalled(state, 0.0, 3, ok=False)
    assert decide("invoice service deploys when?", failed, 1.0).reason == "low_confidence"


def test_skips_leave_the_window_alone() -> None:
    """Tool-only turns and acknowledgements never call recall nor count as topic turns."""
    state = served(decide("invoice service deploys", TopicState(), 0.0).state)
    tool = decide(None, state, 1.0)
    assert (tool.recall, tool.reason, tool.state) == (False, "tool_only", state)
    ack = decide("ok thanks", state, 1.0)
    assert (ack.recall, ack.reason, ack.state) == (False, "acknowledgement", state)
    first_ack = decide("thanks!", TopicState(), 0.0)
    assert first_ack.reason == "acknowledgement" and not first_ack.state.seen
    assert decide("where is the invoice service?", first_ack.state, 1.0).reason == "session_start"

"""Recall gates for the agent middleware (seed 001, 2.4): pure functions over values.

Every turn is evaluated, but the memory service is asked only when it is worth it:

| # | condition | decision |
|---|---|---|
| 1 | no user input: the last message is a tool result (a tool-only turn) | skip `tool_only` |
| 2 | a short acknowledgement ("ok thanks", "got it") | skip `acknowledgement` |
| 3 | the session's first turn seen by this middleware | recall `session_start` |
| 4 | a reference to prior work ("continue the previous task") | recall `prior_work` |
| 5 | too few content words shared with the topic window | recall `topic_change` |
| 6 | the last recall found nothing usable | recall `low_confidence` |
| 7 | the cached recall is older than the TTL, or the window is full | recall `cache_stale` |
| 8 | otherwise: a fresh cache hit in the same topic window | skip `cache_fresh` |

On `cache_fresh` the cached memories are injected again, without a call.

No clock, no I/O: the caller passes ``now`` and keeps the returned ``TopicState``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = [
    "ACK_WORDS",
    "Decision",
    "GatePolicy",
    "TopicState",
    "content_words",
    "decide",
    "is_acknowledgement",
    "refers_to_prior_work",
]

Reason = Literal[
    "memory_off",
    "tool_only",
    "acknowledgement",
    "session_start",
    "prior_work",
    "topic_change",
    "low_confidence",
    "cache_stale",
    "cache_fresh",
]

ACK_WORDS = frozenset(
    "ok okay k kk thanks thank you thx ty cheers yes yep yeah yup no nope sure cool great nice "
    "perfect alright fine good got it done understood noted right lgtm agreed sounds makes sense "
    "awesome wonderful excellent much a lot very hi hello hey bye".split()
)
_MAX_ACK_WORDS = 4
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_PRIOR_WORK = re.compile(
    r"\b(previous(ly)?|last (time|week|session|conversation|turn)|earlier|yesterday|"
    r"continue|resume|pick (it )?(back )?up|where (we|i) left|left off|as (before|usual)|"
    r"we (discussed|talked|decided|agreed|said|did)|you (said|told|suggested)|"
    r"remember|recall|again|same as)\b",
    re.IGNORECASE,
)
_STOPWORDS = frozenset(
    "the a an and or but if then so to of in on at by for with from into onto about as is are "
    "was were be been being do does did have has had i you he she it we they me my your our "
    "their its this that these those what which who whom whose when where why how can could "
    "would should will shall may might must not no yes please just also too very there here "
    "some any all each more most other such only own same than now up down out over again "
    "let lets let's tell show give make get".split()
)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def is_acknowledgement(text: str) -> bool:
    """A short acknowledgement: at most four words, every one of them an ack word (emoji and
    punctuation alone count as one too)."""
    words = _words(text)
    if not words:
        return bool(text.strip())  # "👍", "!": something was said, nothing to search for
    return len(words) <= _MAX_ACK_WORDS and all(w in ACK_WORDS for w in words)


def refers_to_prior_work(text: str) -> bool:
    """The input points back at earlier work ("continue the previous task")."""
    return _PRIOR_WORK.search(text) is not None


def content_words(text: str) -> frozenset[str]:
    """The words that carry a topic: lower-cased, three letters or more, no stopwords."""
    return frozenset(w for w in _words(text) if len(w) >= 3 and w not in _STOPWORDS)


@dataclass(frozen=True)
class GatePolicy:
    """``topic_window_turns``: how many user turns one recall serves at most (seed: 3-5);
    ``cache_ttl_s``: how long it serves them (seed: 2-5 minutes); ``topic_overlap``: the
    share of the input's content words already in the window for it to be the same topic."""

    topic_window_turns: int = 4
    cache_ttl_s: float = 180.0
    topic_overlap: float = 0.3


@dataclass(frozen=True)
class TopicState:
    """What one session's gate remembers: the topic window and when it was last recalled."""

    words: frozenset[str] = frozenset()
    turns: int = 0  # user turns served by the last recall (the one that recalled included)
    recalled_at: float | None = None  # monotonic seconds; None: never recalled successfully
    hits: int = 0  # usable memories the last recall found
    seen: bool = False  # a user turn of this session went through the gate


@dataclass(frozen=True)
class Decision:
    recall: bool
    reason: Reason
    state: TopicState = field(default_factory=TopicState)


def decide(
    user_input: str | None,
    state: TopicState,
    now: float,
    policy: GatePolicy = GatePolicy(),
) -> Decision:
    """Whether this turn asks the memory service, and the state that follows. A recall
    decision's state assumes the recall succeeds: call ``recalled`` with its outcome."""
    if user_input is None or not user_input.strip():
        return Decision(False, "tool_only", state)
    if is_acknowledgement(user_input):
        return Decision(False, "acknowledgement", state)
    words = content_words(user_input)
    reason: Reason | None = None
    if not state.seen:
        reason = "session_start"
    elif refers_to_prior_work(user_input):
        reason = "prior_work"
    elif words and len(words & state.words) / len(words) < policy.topic_overlap:
        reason = "topic_change"
    elif state.recalled_at is None or state.hits == 0:
        reason = "low_confidence"
    elif now - state.recalled_at > policy.cache_ttl_s or state.turns >= policy.topic_window_turns:
        reason = "cache_stale"
    if reason is None:
        served = replace(state, words=state.words | words, turns=state.turns + 1, seen=True)
        return Decision(False, "cache_fresh", served)
    return Decision(True, reason, fresh_state(user_input))


def fresh_state(user_input: str) -> TopicState:
    """The topic state a recall for ``user_input`` starts."""
    return TopicState(words=content_words(user_input), turns=1, seen=True)


def recalled(state: TopicState, now: float, hits: int, ok: bool) -> TopicState:
    """The state after a recall: a failed one leaves no cache (the next turn asks again)."""
    if not ok:
        return replace(state, recalled_at=None, hits=0)
    return replace(state, recalled_at=now, hits=hits)

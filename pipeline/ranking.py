"""ranking: how recall turns the scores of its legs into the hits it answers with.

Values in, values out: the recall responder searches, reads records, and calls these.

- ``WEIGHTS``: how much each leg counts in fusion (``fuse.linear``, ``fuse.calibrated``);
- ``leg_size``: how many candidates each leg hands to fusion;
- ``scored``: one ranked list of (id, score) from whichever legs answered, with the
  calibrated score of each id;
- ``single``: one leg's scores on 0..1 (also the Postgres full-text fallback);
- ``select``: threshold, collapse, pin, top_k and token budget over ranked records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memstream.pipeline.fuse import calibrated, linear
from memstream.schemas.recall import Hit, RecallRequest

# Keyword evidence outweighs dense similarity on this corpus (docs/recall.md has the sweep).
WEIGHTS: Mapping[str, float] = {"keyword": 0.7, "dense": 0.3}
# candidates each leg hands to fusion (2 x top_k if more): longer legs did not recall more on
# LoCoMo (docs/recall.md) and every candidate costs a conversion
PER_LEG = 30

Scored = list[tuple[str, float]]


def leg_size(limit: int) -> int:
    """How many candidates each leg returns for a request of ``limit`` hits."""
    return max(PER_LEG, limit * 2)


def single(name: str, leg: Sequence[tuple[str, float]]) -> Scored:
    """One leg alone: keyword scores relative to the best hit (BM25 has no fixed scale),
    dense scores as they are (a cosine); both clipped to 0..1."""
    top = leg[0][1] if leg and name == "keyword" else 1.0
    return [(mid, max(0.0, min(1.0, s / top))) for mid, s in leg]


def scored(legs: Mapping[str, Sequence[tuple[str, float]]]) -> tuple[Scored, dict[str, float]]:
    """The ranked ids of the legs that answered (best first) and their calibrated scores:
    two legs fused linearly with ``WEIGHTS``, one leg alone by ``single``."""
    absolute = calibrated(legs, WEIGHTS)
    if len(legs) == 2:
        return linear(legs, WEIGHTS), absolute
    ((name, leg),) = legs.items()
    return single(name, leg), absolute


def tokens(text: str) -> int:
    """A cheap token estimate (~4 characters per token)."""
    return len(text) // 4 + 1


def hit_of(record: Mapping[str, Any], score: float, absolute: float | None = None) -> Hit:
    """The reply's hit for an index record (``indexing.record_of``'s fields)."""
    return Hit(
        id=record["id"],
        text=record["text"],
        type=record["type"],
        scope=record["scope"],
        score=round(score, 6),
        calibrated=None if absolute is None else round(absolute, 6),
        session=record["session"],
        user=record.get("user"),
        agent=record.get("agent"),
        source_event_ids=record.get("source_event_ids", []),
        metadata=record.get("metadata", {}),
        occurred_at=datetime.fromisoformat(record["occurred_at"]),
        created_at=datetime.fromisoformat(record["created_at"]),
        pinned=record.get("pinned", False),
        tags=record.get("tags", []),
    )


def select(
    ranked: Sequence[tuple[Mapping[str, Any], float]],
    req: RecallRequest,
    absolute: Mapping[str, float] | None = None,
) -> tuple[list[Hit], bool]:
    """Threshold, collapse, pin, top_k and token budget, in that order; True when the budget
    cut the list short.

    A hit whose source events are all covered by better hits (a typed memory extracted from
    an episode already shown, a merged near-duplicate) adds nothing and is dropped.
    """
    covered: set[str] = set()
    kept: list[tuple[Mapping[str, Any], float]] = []
    for record, score in ranked:
        if score < req.score_threshold:
            continue
        sources = set(record.get("source_event_ids") or [record["id"]])
        if sources and sources <= covered:
            continue
        covered |= sources
        kept.append((record, score))
    kept.sort(key=lambda rs: not rs[0].get("pinned", False))  # pinned first; stable otherwise
    kept = kept[: req.limit]
    hits, used, truncated = [], 0, False
    for record, score in kept:
        cost = tokens(record["text"])
        if req.token_budget is not None and used + cost > req.token_budget:
            # skipped, not the end: one long episode ranked first would otherwise leave
            # nothing, when the shorter hits after it fit
            truncated = True
            continue
        used += cost
        hits.append(hit_of(record, score, absolute.get(record["id"]) if absolute else None))
    return hits, truncated

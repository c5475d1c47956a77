"""fuse: reciprocal rank fusion of ranked id lists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def rrf(
    rankings: Mapping[str, Sequence[str]],
    k: int = 60,
    weights: Mapping[str, float] | None = None,
) -> list[tuple[str, float]]:
    """Fuse named rankings (best first) into one: score(id) = sum_w w / (k + rank).

    Ties break by the order ids were first seen, so the result is deterministic.
    """
    scores: dict[str, float] = {}
    for leg, ids in rankings.items():
        w = 1.0 if weights is None else weights.get(leg, 1.0)
        for rank, mid in enumerate(ids, start=1):
            scores[mid] = scores.get(mid, 0.0) + w / (k + rank)
    order = {mid: i for i, mid in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


def normalise(scored: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """Scale scores into 0..1 by the best one (the best hit scores 1.0)."""
    if not scored:
        return []
    top = scored[0][1] or 1.0
    return [(mid, s / top) for mid, s in scored]


def linear(
    legs: Mapping[str, Sequence[tuple[str, float]]], weights: Mapping[str, float]
) -> list[tuple[str, float]]:
    """Score fusion: each leg's scores min-max normalised over its own results (a document a
    leg did not return counts 0 there), then summed with ``weights``. Best first; ties keep
    the order ids were first seen. Measured on LoCoMo dev (docs/recall.md): 0.7 keyword /
    0.3 dense beats reciprocal rank fusion by ~10 points of R@5."""
    scores: dict[str, float] = {}
    for leg, results in legs.items():
        if not results:
            continue
        w = weights.get(leg, 0.0)
        values = [s for _, s in results]
        lo, hi = min(values), max(values)
        span = hi - lo
        seen: set[str] = set()
        for mid, s in results:
            if mid in seen:  # an id counts once per leg, at its best rank
                continue
            seen.add(mid)
            norm = (s - lo) / span if span > 0 else 1.0
            scores[mid] = scores.get(mid, 0.0) + w * norm
    order = {mid: i for i, mid in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))

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

"""fuse: score fusion of the recall legs.

Linear fusion of min-max scores rather than reciprocal rank fusion: it recalls more on
LoCoMo (docs/recall.md has the figures)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter


def linear(
    legs: Mapping[str, Sequence[tuple[str, float]]], weights: Mapping[str, float]
) -> list[tuple[str, float]]:
    """Score fusion: each leg's scores min-max normalised over its own results (a document a
    leg did not return counts 0 there), then summed with ``weights``. Best first; ties keep
    the order ids were first seen. The default weights, 0.7 keyword / 0.3 dense, recall the
    most on LoCoMo dev (docs/recall.md)."""
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
    # a stable sort keeps equal scores in first-seen order, also with reverse=True
    return sorted(scores.items(), key=itemgetter(1), reverse=True)


# The keyword leg's raw score (BM25 summed over the query's terms, IDF from the index) is
# mapped to 0..1 by s / (s + KEYWORD_HALF): a score of KEYWORD_HALF counts as 0.5.
KEYWORD_HALF = 8.0


def calibrated(
    legs: Mapping[str, Sequence[tuple[str, float]]], weights: Mapping[str, float]
) -> dict[str, float]:
    """A score that means the same across queries (``linear``'s min-max normalisation makes
    the best hit of every query score ~1, relevant or not): each leg's raw score mapped to
    0..1 without looking at the other hits (keyword: ``s / (s + KEYWORD_HALF)``; dense: the
    cosine similarity clipped to 0..1), summed with ``weights`` re-normalised over the legs
    given. A document a leg did not return counts 0 there. docs/recall.md has the measured
    distribution on relevant and irrelevant hits."""
    total = sum(weights.get(leg, 0.0) for leg in legs) or 1.0
    out: dict[str, float] = {}
    for leg, results in legs.items():
        w = weights.get(leg, 0.0) / total
        seen: set[str] = set()
        for mid, s in results:
            if mid in seen:
                continue
            seen.add(mid)
            if leg == "keyword":
                part = s / (s + KEYWORD_HALF) if s > 0 else 0.0
            else:
                part = max(0.0, min(1.0, s))
            out[mid] = out.get(mid, 0.0) + w * part
    return out

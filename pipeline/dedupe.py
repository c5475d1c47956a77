"""dedupe: the exact-duplicate key of a candidate (normalised content hash per owner)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memstream.schemas.ids import MemoryId, content_hash, memory_id
from memstream.schemas.memory import Candidate


@dataclass(frozen=True, slots=True)
class Keyed:
    """A candidate with its content hash and deterministic memory id."""

    candidate: Candidate
    content_hash: str
    memory_id: MemoryId


def key(candidate: Candidate) -> Keyed:
    """Exact duplicates (same owner, same type, same normalised content) share one id."""
    chash = content_hash(candidate.content)
    mid = memory_id(candidate.owner.tenant, candidate.owner.key, candidate.type.value, chash)
    return Keyed(candidate=candidate, content_hash=chash, memory_id=mid)


def near_duplicate(
    neighbours: Sequence[tuple[str, float]], own_id: str, min_similarity: float
) -> str | None:
    """The nearest same-owner memory at least ``min_similarity`` (cosine) close, if any.
    The candidate's own id never counts (a replay is an exact duplicate, not a near one)."""
    for mid, similarity in neighbours:
        if mid != own_id and similarity >= min_similarity:
            return mid
    return None

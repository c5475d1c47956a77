"""dedupe: the exact-duplicate key of a candidate (normalised content hash per owner)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memstream.schemas.ids import MemoryId, content_hash, memory_id, normalise_content
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
    owner = candidate.owner
    mid = memory_id(owner.tenant, owner.user, owner.agent, candidate.type.value, chash)
    return Keyed(candidate=candidate, content_hash=chash, memory_id=mid)


def word_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' normalised word sets (0..1)."""
    wa, wb = set(normalise_content(a).split()), set(normalise_content(b).split())
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / len(wa | wb)


def near_duplicate(
    content: str,
    neighbours: Sequence[tuple[str, float, str]],
    own_id: str,
    min_similarity: float,
    min_overlap: float = 0.6,
) -> str | None:
    """The nearest same-owner memory that is both semantically close (cosine at least
    ``min_similarity``) and says mostly the same words (overlap at least ``min_overlap``):
    short turns of one day embed alike ("Yes!" / "Wow!"), so cosine alone over-merges.
    The candidate's own id never counts (a replay is an exact duplicate, not a near one)."""
    for mid, similarity, text in neighbours:
        if mid == own_id or similarity < min_similarity:
            continue
        if word_overlap(content, text) >= min_overlap:
            return mid
    return None

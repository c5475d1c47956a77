"""dedupe: the exact-duplicate key of a candidate (normalised content hash per owner), and
what makes two texts near duplicates."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

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
    short turns of one day embed alike ("Yes!" / "Wow!"), so cosine alone over-merges. The
    two must also name the same numbers: "the flight is at 10:30" is not a near duplicate of
    "the flight is at 11:30", whose fold would lose the new time. The candidate's own id
    never counts (a replay is an exact duplicate, not a near one)."""
    mine = numbers(content)
    for mid, similarity, text in neighbours:
        if mid == own_id or similarity < min_similarity:
            continue
        if word_overlap(content, text) >= min_overlap and numbers(text) == mine:
            return mid
    return None


_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")


def numbers(text: str) -> frozenset[str]:
    """The numbers ``text`` names (times, dates, amounts, versions), as written."""
    return frozenset(_NUMBER.findall(text))


def batch_neighbours(
    batch: Sequence[Candidate], vectors: Mapping[int, Sequence[float]], min_similarity: float
) -> dict[int, list[tuple[int, float]]]:
    """By position in ``batch``: the earlier candidates of the same owner and type whose
    vector is at least ``min_similarity`` close (cosine), as ``(position, similarity)``.
    ``vectors``: by position, the candidates that were looked up in the index; the others
    take no part. These are the near duplicates an index search cannot find yet: neither is
    stored until the batch is (``plan.plan``'s ``batch_neighbours``)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in vectors:
        c = batch[i]
        groups.setdefault((c.owner.tenant, c.owner.user, c.owner.agent, c.type), []).append(i)
    out: dict[int, list[tuple[int, float]]] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort()
        m = np.asarray([vectors[i] for i in members], dtype=np.float32)
        m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
        sims = m @ m.T
        for a in range(1, len(members)):
            close = [
                (members[b], float(sims[a, b])) for b in range(a) if sims[a, b] >= min_similarity
            ]
            if close:
                out[members[a]] = close
    return out

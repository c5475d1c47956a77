"""dedupe: the exact-duplicate key of a candidate (normalised content hash per owner and
reach), and what makes two texts near duplicates."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from memstream.schemas.ids import MemoryId, content_hash, memory_id, normalise_content
from memstream.schemas.memory import SESSION_BOUND, Candidate, Scope

# a dense vector: a list of floats as embedded and carried, or a row of numpy floats
Vector = Sequence[float] | np.ndarray


@dataclass(frozen=True, slots=True)
class Keyed:
    """A candidate with its content hash and deterministic memory id."""

    candidate: Candidate
    content_hash: str
    memory_id: MemoryId


def key(candidate: Candidate) -> Keyed:
    """Exact duplicates (same owner, type, normalised content and reach) share one id."""
    chash = content_hash(candidate.content)
    owner = candidate.owner
    mid = memory_id(
        owner.tenant, owner.user, owner.agent, candidate.type.value, chash, reach_of(candidate)
    )
    return Keyed(candidate=candidate, content_hash=chash, memory_id=mid)


def reach(scope: Scope | str, project: str | None, session: str | None) -> str:
    """Who reads a memory and how long it lives, as far as its scope decides: its project
    for ``project`` (shared with that project's readers), its session for ``session`` and
    ``run`` (gone with it); empty for ``user``, the owner's own long-term memory. Two texts
    merge or fold into one memory only within one reach: a user memory folded into a
    session one would go at the session's expiry, a project memory folded into another
    project's would never reach its own project's readers."""
    s = Scope(scope)
    if s is Scope.USER:
        return ""
    if s is Scope.PROJECT:
        return f"project:{project or ''}"
    if s in SESSION_BOUND:
        return f"{s.value}:{session or ''}"
    return s.value


def reach_of(c: Candidate) -> str:
    return reach(c.scope, c.project, c.session)


def foldable(c: Candidate, record: Mapping[str, Any]) -> bool:
    """Whether ``c`` may be folded into the memory of this index record: only into one that
    lives as long and that the same readers see (``dedupe.reach``: the same scope, the same
    project for project scope, the same session for session and run scopes, whose end
    erases exactly their memories)."""
    scope = record.get("scope")
    if scope is None:
        return False
    return reach(str(scope), record.get("project"), record.get("session")) == reach_of(c)


def neighbours(
    c: Candidate, hits: Sequence[tuple[str, float, Mapping[str, Any]]]
) -> list[tuple[str, float, str]]:
    """The vector search's hits (id, similarity, record) that ``c`` may fold into, as
    ``plan`` takes them."""
    return [(mid, s, str(r.get("text", ""))) for mid, s, r in hits if foldable(c, r)]


def word_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' normalised word sets (0..1)."""
    return _overlap(_words(a), _words(b))


# The same stored texts come back as neighbours of many candidates (a session's memories,
# short turns said again): their words and numbers are made once. Returned as frozensets, so
# a cached value cannot be changed by a caller.
@lru_cache(maxsize=8192)
def _words(text: str) -> frozenset[str]:
    return frozenset(normalise_content(text).split())


def _overlap(wa: frozenset[str], wb: frozenset[str]) -> float:
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
    words: frozenset[str] | None = None  # made once, for the first close neighbour
    for mid, similarity, text in neighbours:
        if mid == own_id or similarity < min_similarity:
            continue
        words = _words(content) if words is None else words
        if _overlap(words, _words(text)) >= min_overlap and numbers(text) == mine:
            return mid
    return None


_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*")


@lru_cache(maxsize=8192)
def numbers(text: str) -> frozenset[str]:
    """The numbers ``text`` names (times, dates, amounts, versions), as written."""
    return frozenset(_NUMBER.findall(text))


def batch_neighbours(
    batch: Sequence[Candidate], vectors: Mapping[int, Vector], min_similarity: float
) -> dict[int, list[tuple[int, float]]]:
    """By position in ``batch``: the earlier candidates of the same owner, type and reach whose
    vector is at least ``min_similarity`` close (cosine), as ``(position, similarity)``.
    ``vectors``: by position, the candidates that were looked up in the index; the others
    take no part. These are the near duplicates an index search cannot find yet: neither is
    stored until the batch is (``plan.plan``'s ``batch_neighbours``). Only candidates of
    one reach fold into each other (``reach``)."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in vectors:
        groups.setdefault(group_of(batch[i]), []).append(i)
    out: dict[int, list[tuple[int, float]]] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort()
        m = _unit([vectors[i] for i in members])
        sims = m @ m.T
        for a in range(1, len(members)):
            close = [
                (members[b], float(sims[a, b])) for b in range(a) if sims[a, b] >= min_similarity
            ]
            if close:
                out[members[a]] = close
    return out


@dataclass(frozen=True, slots=True)
class Unindexed:
    """A memory stored by a batch whose index write is still under way: the next batch's
    near-duplicate check finds it here until its point is in the index."""

    memory_id: str
    group: tuple[object, ...]  # ``group_of`` its candidate
    # a unit float32 array, made once: the batches that check it while it waits would each
    # convert a list of floats again (most of the check's time). A list is made one here; an
    # array is taken as given, unit already (``unit_rows``: the dedupe of the same call made it)
    vector: Vector
    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.vector, np.ndarray):
            object.__setattr__(self, "vector", _unit([self.vector])[0])


def group_of(c: Candidate) -> tuple[object, ...]:
    """Candidates that may fold into each other's memories: one owner, type and reach."""
    return (c.owner.tenant, c.owner.user, c.owner.agent, c.type, reach_of(c))


def unindexed_neighbours(
    batch: Sequence[Candidate],
    vectors: Mapping[int, Vector],
    unindexed: Sequence[Unindexed],
    min_similarity: float,
) -> dict[int, list[tuple[str, float, str]]]:
    """By position in ``batch`` (those with a vector): the ``unindexed`` memories of its group
    at least ``min_similarity`` close (cosine), as ``neighbours`` gives the index's hits.
    The index search cannot find them yet; once their points are written it can."""
    if not unindexed:
        return {}
    mates_of: dict[tuple[object, ...], list[Unindexed]] = {}
    for u in unindexed:
        mates_of.setdefault(u.group, []).append(u)
    asking: dict[tuple[object, ...], list[int]] = {}
    for i in vectors:
        group = group_of(batch[i])
        if group in mates_of:
            asking.setdefault(group, []).append(i)
    out: dict[int, list[tuple[str, float, str]]] = {}
    for group, members in asking.items():  # one matrix product per owner group
        mates = mates_of[group]
        sims = _unit([vectors[i] for i in members]) @ np.stack([u.vector for u in mates]).T
        for row, i in enumerate(members):
            near = np.flatnonzero(sims[row] >= min_similarity)
            if near.size:
                close = [(mates[j].memory_id, float(sims[row, j]), mates[j].text) for j in near]
                out[i] = sorted(close, key=lambda t: -t[1])
    return out


def unit_rows(vectors: Mapping[int, Vector]) -> dict[int, np.ndarray]:
    """``vectors`` as unit float32 rows, by the same keys, converted in one call: the checks
    that take them convert again only arrays, which costs little next to lists of floats."""
    if not vectors:
        return {}
    return dict(zip(vectors, _unit(list(vectors.values())), strict=True))


def _unit(rows: Sequence[Vector]) -> np.ndarray:
    m = np.asarray(rows, dtype=np.float32)
    m /= np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
    return m

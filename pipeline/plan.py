"""The store decision for a batch of candidates, from what storage returned.

For each candidate of a dedupe batch, in order, one of:
- ``merge``: an exact duplicate of a live memory (same owner, type and normalised content):
  its source event is folded into that memory;
- ``near_merge``: close in meaning and in words to a live same-owner memory
  (``dedupe.near_duplicate``): folded into that one instead of stored anew;
- ``refold``: folded into a memory on an earlier try (a redelivery): nothing is decided
  again, since the near-duplicate check depends on an index that may be away this time;
- ``skip``: the same candidate (same candidate id) appeared earlier in the batch, a
  redelivery beside its first copy: the first one carries it;
- ``insert``: new; it goes on to the store stage (an exact duplicate of an earlier candidate
  of the same batch is an insert too: the store stage writes them in order, so the second
  merges into the first).

Values in, values out: the consumer reads storage, calls ``plan``, then applies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from memstream.pipeline.dedupe import Keyed, near_duplicate


class Action(StrEnum):
    INSERT = "insert"
    MERGE = "merge"
    NEAR_MERGE = "near_merge"
    REFOLD = "refold"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    keyed: Keyed
    target: str  # the memory the candidate becomes or is folded into


Neighbour = tuple[str, float, str]  # (memory id, cosine similarity, text)


def plan(
    batch: Sequence[Keyed],
    existing: Collection[tuple[str, str]],
    neighbours: Mapping[int, Sequence[Neighbour]],
    min_similarity: float,
    folded: Mapping[int, str] | None = None,
) -> list[Decision]:
    """One decision per candidate of ``batch``, in order.

    ``existing``: the (tenant, memory id) pairs of the batch that are live memories;
    ``neighbours``: by position in ``batch``, the nearest same-owner, same-type memories found
    for the candidates that are not exact duplicates (absent: none were looked for, e.g. the
    vector index was down); ``folded``: by position, the memory an earlier try folded the
    candidate into."""
    folded = folded or {}
    out: list[Decision] = []
    seen: set[str] = set()
    for i, k in enumerate(batch):
        c = k.candidate
        if c.candidate_id in seen:
            out.append(Decision(Action.SKIP, k, k.memory_id))
            continue
        seen.add(c.candidate_id)
        # an earlier try's fold stands, even if an exact duplicate was stored since: merging
        # the candidate into that one too would hold its turn in two memories
        if i in folded:
            out.append(Decision(Action.REFOLD, k, folded[i]))
            continue
        if (c.owner.tenant, k.memory_id) in existing:
            out.append(Decision(Action.MERGE, k, k.memory_id))
            continue
        similar = near_duplicate(c.content, neighbours.get(i, ()), k.memory_id, min_similarity)
        if similar is not None:
            out.append(Decision(Action.NEAR_MERGE, k, similar))
        else:
            out.append(Decision(Action.INSERT, k, k.memory_id))
    return out

"""The store decision for a batch of candidates, from what storage returned.

For each candidate of a dedupe batch, in order, one of:
- ``merge``: an exact duplicate of a live memory (same owner, type and normalised content):
  its source event is folded into that memory;
- ``near_merge``: close in meaning and in words to a live same-owner memory
  (``dedupe.near_duplicate``): folded into that one instead of stored anew;
- ``batch_merge``: as close to an earlier candidate of the same batch that is inserted
  (given as ``batch_neighbours``): folded into that one once the store stage has written it,
  so a near duplicate is folded whether or not its twin arrived in the same batch;
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
    BATCH_MERGE = "batch_merge"
    REFOLD = "refold"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    keyed: Keyed
    target: str  # the memory the candidate becomes or is folded into


Neighbour = tuple[str, float, str]  # (memory id, cosine similarity, text)
BatchNeighbour = tuple[int, float]  # (position of an earlier candidate of the batch, cosine)


def plan(
    batch: Sequence[Keyed],
    existing: Collection[tuple[str, str]],
    neighbours: Mapping[int, Sequence[Neighbour]],
    min_similarity: float,
    folded: Mapping[int, str] | None = None,
    batch_neighbours: Mapping[int, Sequence[BatchNeighbour]] | None = None,
) -> list[Decision]:
    """One decision per candidate of ``batch``, in order.

    ``existing``: the (tenant, memory id) pairs of the batch that are live memories;
    ``neighbours``: by position in ``batch``, the nearest same-owner, same-type memories found
    for the candidates that are not exact duplicates (absent: none were looked for, e.g. the
    vector index was down); ``folded``: by position, the memory an earlier try folded the
    candidate into; ``batch_neighbours``: by position, earlier same-owner, same-type candidates
    of the batch close to it (absent: this batch's caller cannot fold into a batch mate)."""
    folded = folded or {}
    batch_neighbours = batch_neighbours or {}
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
        mates = {
            batch[j].memory_id: (batch[j].memory_id, sim, batch[j].candidate.content)
            for j, sim in batch_neighbours.get(i, ())
            if out[j].action is Action.INSERT
        }
        near = sorted([*neighbours.get(i, ()), *mates.values()], key=lambda n: -n[1])
        similar = near_duplicate(c.content, near, k.memory_id, min_similarity)
        if similar is None:
            out.append(Decision(Action.INSERT, k, k.memory_id))
        else:
            action = Action.BATCH_MERGE if similar in mates else Action.NEAR_MERGE
            out.append(Decision(action, k, similar))
    return out

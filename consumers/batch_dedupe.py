"""The dedupe stage over a pull batch (the contract: consumers/batching.py): which candidates
are exact or near duplicates of stored memories, or of each other, decided by the pure
``pipeline.plan`` over what Postgres and the vector index return. ``deduped`` hands on the
candidates to store and the merges still to write (``Merges``); consumers/batch_store.py
writes, indexes and announces both."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from memstream.consumers.logs import log
from memstream.consumers.stages import Deps, carried, event_of, near_filter
from memstream.pipeline import dedupe
from memstream.pipeline.plan import Action, plan
from memstream.schemas.errors import TransientError
from memstream.schemas.memory import SHARED_SCOPES, Candidate, MemoryEvent, dated
from memstream.storage.ports import RecordHit

# below the near-duplicate threshold by this much, the engine still returns a hit: its cosine
# (float32, perhaps quantized and rescored) may round a score at the threshold either way
_SCORE_MARGIN = 1e-3


@dataclass(frozen=True)
class Merges:
    """Candidates merged into existing memories whose index points and events are still to
    be done (``settle``): ``(tenant, memory id)`` to re-index, and the events; and
    candidates to fold into a batch mate once the store stage has written it, with the
    memory id of that mate (``plan.Action.BATCH_MERGE``; only when store runs in the same
    call)."""

    keys: list[tuple[str, str]]
    events: list[tuple[MemoryEvent, str, bool]]
    mates: list[tuple[Candidate, str]] = field(default_factory=list)
    # exact duplicates to merge into their memories, ``(memory id, content hash, candidate)``,
    # not yet written: the store stage of the same call writes them in its own transaction
    exact: list[tuple[str, str, Candidate]] = field(default_factory=list)
    # near duplicates to fold into existing memories, ``(candidate, memory id)``, not yet
    # written (only when store runs in the same call): folded in store's transaction, or
    # stored anew if their memory went since the search
    near: list[tuple[Candidate, str]] = field(default_factory=list)
    # the unit float32 rows of the vectors handed on, by candidate id (``dedupe.unit_rows``):
    # the memories the store stage writes wait in ``Deps.unindexed`` as these, not converted
    # from their lists of floats a second time
    units: Mapping[str, np.ndarray] = field(default_factory=dict)


async def deduped(
    deps: Deps, cands: Sequence[Candidate], mates: bool = False
) -> tuple[list[Candidate], Merges]:
    """Exact and near duplicates merged into their memories in Postgres; the candidates left
    to store, each carrying its dense vector, and the merges still to ``settle``. ``mates``:
    the store stage runs next in the same call, so a near duplicate of an earlier candidate
    of the batch is folded into it there (``Merges.mates``); without, both are stored."""
    keyed = [dedupe.key(c) for c in cands]
    similarity = deps.settings.near_duplicate_similarity
    now = deps.clock().timestamp()
    # memories of earlier batches whose points are still being written, taken before any
    # search is sent: one whose points land before the search runs is in its answer, one
    # whose points land after it is still in this copy (a copy taken after the answer would
    # miss the second kind)
    pending = list(deps.unindexed.values())
    brought = {i: v for i, c in enumerate(cands) if (v := carried(deps, c)) is not None}
    # the candidates that arrived with their vectors are searched while Postgres is asked
    # which are duplicates (most are new): the answers of the others are left unread
    early = (
        asyncio.ensure_future(_near_search(deps, cands, brought, now, similarity))
        if brought
        else None
    )
    started = time.perf_counter()
    try:
        # a redelivered candidate that an earlier try folded into a near-duplicate stays
        # folded, even if an exact duplicate of it was stored since (both reads at once)
        existing, was_folded = await asyncio.gather(
            deps.pg.existing([(k.candidate.owner.tenant, k.memory_id) for k in keyed]),
            deps.pg.folded_among([(c.owner.tenant, c.candidate_id) for c in cands]),
        )
    except BaseException:
        if early is not None:
            early.cancel()
            with contextlib.suppress(BaseException):
                await early
        raise
    deps.stepped("lookups", started)
    folded = {
        i: was_folded[p]
        for i, c in enumerate(cands)
        if (p := (c.owner.tenant, c.candidate_id)) in was_folded
    }
    fresh = [
        i
        for i, k in enumerate(keyed)
        if i not in folded and (k.candidate.owner.tenant, k.memory_id) not in existing
    ]
    neighbours: dict[int, list[tuple[str, float, str]]] = {}
    vectors: list[Sequence[float]] = []
    if fresh:
        need = [i for i in fresh if i not in brought]
        made = deps.embedder.embed([dated(cands[i].content, cands[i].occurred_at) for i in need])
        embedded = dict(zip(need, made, strict=True))
        computed = {**brought, **embedded}
        vectors = [computed[i] for i in fresh]
        try:
            found = await early if early is not None else {}
            if embedded:
                found |= await _near_search(deps, cands, embedded, now, similarity)
            neighbours = {i: dedupe.neighbours(cands[i], found[i]) for i in fresh}
        except TransientError as exc:  # index down: exact dedupe only; store keeps it unindexed
            log.warning("dedupe.near_check_skipped", reason=type(exc).__name__)
            neighbours = {}
    elif early is not None:  # nothing new: the answer is not needed, a failure not news
        with contextlib.suppress(Exception):
            await early
    vector_of = dict(zip(fresh, vectors, strict=True))  # by position in the batch
    started = time.perf_counter()
    # the vectors as unit float32 rows, made once for both checks below
    units = dedupe.unit_rows(vector_of) if neighbours and (pending or mates) else {}
    if neighbours and pending:  # what the search could not find yet
        close = dedupe.unindexed_neighbours(cands, units, pending, similarity)
        for i, more in close.items():
            neighbours[i] = sorted([*neighbours[i], *more], key=lambda n: -n[1])
    batch_near = (
        dedupe.batch_neighbours(cands, units, similarity)
        if mates and neighbours  # the index answered: the batch is checked as the index is
        else {}
    )
    decisions = plan(keyed, existing, neighbours, similarity, folded, batch_near)
    deps.stepped("plan", started)
    exact = [d for d in decisions if d.action is Action.MERGE]
    # the source events merged into their memories: by ``settle``, or by the store stage of
    # this call in its own transaction (one commit for the batch, not two)
    exact_rows = [(d.target, d.keyed.content_hash, d.keyed.candidate) for d in exact]

    def carrying(i: int, c: Candidate) -> Candidate:
        # the store stage indexes this vector instead of embedding again
        return c.model_copy(update={"vector": vector_of[i]}) if i in vector_of else c

    # with store in this call, the near-duplicate folds go in its transaction (``Merges.near``)
    near = [] if mates else [d for d in decisions if d.action is Action.NEAR_MERGE]
    near_ok = await deps.pg.merge_many([fold_row(d.keyed.candidate, d.target) for d in near])
    # a near-duplicate whose target went since the search (forgotten, expired) is stored anew
    gone = {id(d) for d, ok in zip(near, near_ok, strict=True) if not ok}
    refolded = [d for d in decisions if d.action is Action.REFOLD]
    merged = exact + [d for d, ok in zip(near, near_ok, strict=True) if ok] + refolded
    forward = [
        carrying(i, d.keyed.candidate)
        for i, d in enumerate(decisions)
        if d.action is Action.INSERT or id(d) in gone
    ]
    at = deps.clock()
    merges = Merges(
        [(d.keyed.candidate.owner.tenant, d.target) for d in merged],
        [
            (
                event_of(d.keyed.candidate, "merged", d.target, at),
                d.keyed.candidate.source_event_id,
                d.keyed.candidate.scope in SHARED_SCOPES,
            )
            for d in merged
        ],
        [(d.keyed.candidate, d.target) for d in decisions if d.action is Action.BATCH_MERGE],
        exact_rows,
        [
            (carrying(i, d.keyed.candidate), d.target)
            for i, d in enumerate(decisions)
            if mates and d.action is Action.NEAR_MERGE
        ],
        {cands[i].candidate_id: row for i, row in units.items()},
    )
    return forward, merges


def fold_row(c: Candidate, target: str) -> tuple[str, str, str, str]:
    """A fold of ``c`` into memory ``target``, as ``merge_many`` takes it."""
    return (c.owner.tenant, target, c.source_event_id, c.candidate_id)


async def _near_search(
    deps: Deps,
    cands: Sequence[Candidate],
    vectors: Mapping[int, Sequence[float]],
    now: float,
    similarity: float,
) -> dict[int, list[RecordHit]]:
    """The index's nearest memories to ``vectors`` (by position in ``cands``) where each
    candidate's near duplicates may be. Hits below the near-duplicate threshold never fold
    (``dedupe.near_duplicate``): the engine drops them, with a margin for its rounding."""
    at = list(vectors)
    started = time.perf_counter()
    found = await deps.vectors.search_many(
        [(vectors[i], near_filter(cands[i], now)) for i in at], 3, similarity - _SCORE_MARGIN
    )
    deps.stepped("search", started)
    return dict(zip(at, found, strict=True))

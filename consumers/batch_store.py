"""The dedupe and store stages over a pull batch (the contract: consumers/batching.py): what a
batch writes to Postgres and the vector index, and announces. ``deduped`` and ``stored`` are
what the stages hand on; the extract and redact stages and the registry of the four are in
consumers/batch_stages.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from memstream.consumers import indexing
from memstream.consumers.logs import log
from memstream.consumers.stages import (
    Deps,
    carried,
    created_by,
    event_of,
    near_filter,
)
from memstream.pipeline import dedupe, lifecycle
from memstream.pipeline.lexical import dated
from memstream.pipeline.plan import Action, plan
from memstream.schemas.errors import TransientError
from memstream.schemas.memory import SHARED_SCOPES, Candidate, MemoryEvent, MemoryRecord
from memstream.schemas.subjects import msg_id
from memstream.storage.ports import RecordHit

# below the near-duplicate threshold by this much, the engine still returns a hit: its cosine
# (float32, perhaps quantized and rescored) may round a score at the threshold either way
_SCORE_MARGIN = 1e-3


async def publish_to_stage(deps: Deps, stage: str, cands: Sequence[Candidate]) -> None:
    """Publish candidates to the next stage, pipelined (in order); returns once every PubAck
    arrived."""
    await deps.publish_many(
        [
            (
                deps.subjects.stage(stage, c.owner.tenant),
                c,
                msg_id(c.owner.tenant, f"{stage}:{c.candidate_id}"),
            )
            for c in cands
        ]
    )


async def _emit_all(deps: Deps, events: Sequence[tuple[MemoryEvent, str, bool]]) -> None:
    """``Deps.emit`` for a batch: each owner's recall cache bumped once, events pipelined."""
    if deps.cache is not None:
        await deps.cache.bump_many((e.tenant, e.user, e.agent, shared) for e, _, shared in events)
    await deps.publish_many(
        [
            (deps.subjects.events(e.tenant), e, f"{e.kind}:{e.memory_id or '-'}:{cause}")
            for e, cause, _ in events
        ]
    )


async def _reindex(
    deps: Deps,
    keys: Sequence[tuple[str, str]],
    followers: AbstractSet[str] = frozenset(),
    known: Mapping[str, Sequence[float]] | None = None,
) -> tuple[list[str], dict[str, MemoryRecord]]:
    """(Re)build the index points of these memories from their rows, in one read, one
    embedding call (none for the ``known`` vectors) and one upsert: the ids upserted, to be
    marked indexed (``_marked``), and the rows read; left to the reconciler when a store is
    away."""
    rows: dict[str, MemoryRecord] = {}
    try:
        started = time.perf_counter()
        rows = await deps.pg.memories_by_id(list(dict.fromkeys(keys)))
        deps.stepped("rows", started)
        ids = await indexing.upserted(
            deps.pg,
            deps.vectors,
            deps.embedder,
            list(rows.values()),
            followers,
            known,
            deps.stepped,
        )
    except TransientError as exc:
        log.warning("store.vector_deferred", count=len(keys), reason=str(exc))
        deps.index_behind.set()  # the maintenance loop indexes them once the index answers
        return [], rows
    return ids, rows


async def _marked(deps: Deps, ids: Sequence[str]) -> None:
    """Mark upserted points indexed in Postgres. Bookkeeping for the reconciler, not an
    output: it runs beside the batch's events, and a Postgres away leaves the rows to the
    maintenance loop, which indexes them again (idempotent)."""
    if not ids:
        return
    try:
        await deps.pg.mark_indexed(ids)
    except TransientError as exc:
        log.warning("store.vector_deferred", count=len(ids), reason=str(exc))
        deps.index_behind.set()


async def _announced(
    deps: Deps, ids: Sequence[str], events: Sequence[tuple[MemoryEvent, str, bool]]
) -> None:
    """The upserted points marked indexed and the events out, side by side: the events wait
    for nothing the marks write (recall reads the index), and the batch is acked after both."""
    await asyncio.gather(_marked(deps, ids), _emit_all(deps, events))


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


async def settle(deps: Deps, merges: Merges) -> None:
    """The merges of a dedupe with no store after it in the call: written, re-indexed and
    announced as a store batch of no new candidates writes them (one path for both)."""
    if merges.exact or merges.keys or merges.near or merges.mates:
        await stored(deps, [], merges)


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
    near_ok = await deps.pg.merge_many([_fold(d.keyed.candidate, d.target) for d in near])
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


def _fold(c: Candidate, target: str) -> tuple[str, str, str, str]:
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


async def dedupe_batch(deps: Deps, cands: list[Candidate]) -> int:
    out, merges = await deduped(deps, cands)
    await settle(deps, merges)
    await publish_to_stage(deps, "store", out)
    return len(out)


Tail = Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]


async def stored(deps: Deps, cands: Sequence[Candidate], merges: Merges | None = None) -> int:
    """The candidates written to Postgres, then indexed and announced together with
    ``merges`` (one index upsert and one round of events for both); how many were kept.
    With ``merges``, the candidates come from a dedupe in this same call."""
    kept, tail = await store_begun(deps, cands, merges)
    await tail(_nothing)
    return kept


async def _nothing() -> None:
    return None


async def store_begun(
    deps: Deps, cands: Sequence[Candidate], merges: Merges | None = None
) -> tuple[int, Tail]:
    """``stored`` in two parts: the rows written (what the next batch's dedupe reads), then
    the tail, to be awaited, that indexes and announces them. The tail takes what to wait for
    before its events go out (the batch before, for stream order). Until the tail has written
    the new memories' points, a dedupe finds them in ``Deps.unindexed``."""
    # a dedupe try sent these here, and a later try (a redelivery) may have folded one into a
    # near-duplicate: storing it too would hold its turn twice. A dedupe in this same call
    # read the folds already (``deduped``: a folded candidate is not handed on)
    folded = (
        {}
        if merges is not None
        else await deps.pg.folded_among([(c.owner.tenant, c.candidate_id) for c in cands])
    )
    merges = merges or Merges([], [])
    now = deps.clock()
    ready = []
    for c in cands:
        if (c.owner.tenant, c.candidate_id) in folded:
            continue
        expires = lifecycle.expires_at(c, now, deps.settings.ttl_s)
        ready.append(c if expires == c.expires_at else c.model_copy(update={"expires_at": expires}))
    keyed = [dedupe.key(c) for c in ready]
    rows = [*merges.exact, *((k.memory_id, k.content_hash, k.candidate) for k in keyed)]
    # one transaction, one commit, for the folds and the rows
    started = time.perf_counter()
    written, near_ok, mates_ok = await deps.pg.write_batch(
        rows, [_fold(c, t) for c, t in merges.near], [_fold(c, t) for c, t in merges.mates]
    )
    deps.stepped("write", started)
    inserted = written[len(merges.exact) :]
    near = [m for m, ok in zip(merges.near, near_ok, strict=True) if ok]
    mates = [m for m, ok in zip(merges.mates, mates_ok, strict=True) if ok]
    # a near duplicate whose memory went since the search, and one whose mate is not there
    # (an earlier try folded the mate elsewhere), is stored itself
    alone = [
        *(c for (c, _), ok in zip(merges.near, near_ok, strict=True) if not ok),
        *(c for (c, _), ok in zip(merges.mates, mates_ok, strict=True) if not ok),
    ]
    kept_alone = await stored(deps, alone) if alone else 0
    new_ids = {k.memory_id for k, new in zip(keyed, inserted, strict=True) if new}
    # a carried vector is that of the candidate's text: it is the row's only when inserted
    known: dict[str, Sequence[float]] = {
        k.memory_id: k.candidate.vector
        for k, new in zip(keyed, inserted, strict=True)
        if new and k.candidate.vector is not None
    }
    keys = [
        *merges.keys,
        *((c.owner.tenant, target) for c, target in near),
        *((k.candidate.owner.tenant, k.memory_id) for k in keyed),
    ]
    waiting = [
        dedupe.Unindexed(
            k.memory_id,
            dedupe.group_of(k.candidate),
            merges.units.get(k.candidate.candidate_id, vector),
            k.candidate.content,
        )
        for k, new in zip(keyed, inserted, strict=True)
        if new and (vector := k.candidate.vector) is not None
    ]
    deps.unindexed.update((u.memory_id, u) for u in waiting)
    events_of = [
        *merges.events,
        *(
            (event_of(c, "merged", t, now), c.source_event_id, c.scope in SHARED_SCOPES)
            for c, t in near
        ),
    ]

    async def tail(before: Callable[[], Awaitable[None]]) -> None:
        started = time.perf_counter()
        try:
            upserted, rows = await _reindex(deps, keys, new_ids, known)
        finally:  # in the index now, or left to the maintenance loop (the index away)
            for u in waiting:
                deps.unindexed.pop(u.memory_id, None)
        deps.stepped("index", started)
        created = [
            new or created_by(rows.get(k.memory_id), k.candidate)
            for k, new in zip(keyed, inserted, strict=True)
        ]
        at = deps.clock()
        started = time.perf_counter()
        await before()
        deps.stepped("order", started)
        started = time.perf_counter()
        await _announced(deps, upserted, _events(events_of, mates, keyed, created, at))
        deps.stepped("announce", started)

    return len(keyed) + kept_alone, tail


def _events(
    merged: Sequence[tuple[MemoryEvent, str, bool]],
    mates: Sequence[tuple[Candidate, str]],
    keyed: Sequence[dedupe.Keyed],
    created: Sequence[bool],
    at: datetime,
) -> list[tuple[MemoryEvent, str, bool]]:
    """The events of a stored batch: its merges, its mates folded, its memories."""
    return [
        *merged,
        *(
            (event_of(c, "merged", target, at), c.source_event_id, c.scope in SHARED_SCOPES)
            for c, target in mates
        ),
        *(
            (
                event_of(k.candidate, "stored" if new else "merged", k.memory_id, at),
                k.candidate.source_event_id,
                k.candidate.scope in SHARED_SCOPES,
            )
            for k, new in zip(keyed, created, strict=True)
        ),
    ]


async def store_batch(deps: Deps, cands: list[Candidate]) -> int:
    return await stored(deps, cands)

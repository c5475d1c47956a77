"""The store stage over a pull batch (the contract: consumers/batching.py): what a batch
writes to Postgres and the vector index, and announces, with the merges its dedupe decided
(consumers/batch_dedupe.py). ``stored`` is what the stage hands on; the extract and redact
stages and the registry of the four are in consumers/batch_stages.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import datetime

from memstream.consumers import indexing
from memstream.consumers.batch_dedupe import Merges, deduped, fold_row
from memstream.consumers.logs import log
from memstream.consumers.stages import (
    Deps,
    created_by,
    event_of,
)
from memstream.pipeline import dedupe, lifecycle
from memstream.schemas.errors import TransientError
from memstream.schemas.memory import SHARED_SCOPES, Candidate, MemoryEvent, MemoryRecord
from memstream.schemas.subjects import msg_id
from memstream.storage.ports import VectorPoint


async def publish_to_stage(deps: Deps, stage: str, cands: Sequence[Candidate]) -> None:
    """Publish candidates to the next stage, pipelined (in order); returns once every PubAck
    arrived."""
    await deps.publish_many(
        [
            (
                deps.subjects.stage(stage, c.owner.tenant, c.owner.key),
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
    kept: dict[str, VectorPoint | None] | None = None,
) -> tuple[list[str], dict[str, MemoryRecord]]:
    """(Re)build the index points of these memories from their rows, in one read, one
    embedding call (none for the ``known`` vectors) and one upsert: the ids upserted, to be
    marked indexed (``_marked``), and the rows read; left to the reconciler when a store is
    away. ``kept``: as in ``indexing.upserted``."""
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
            kept,
        )
    except TransientError as exc:
        log.warning("store.vector_deferred", count=len(keys), reason=str(exc))
        deps.index_behind.set()  # the maintenance loop indexes them once the index answers
        return [], rows
    return ids, rows


async def _written_again(deps: Deps, points: Sequence[VectorPoint]) -> bool:
    """Write again points a batch before may have overwritten with older ones; False, the
    memories left to the maintenance loop, when the index is away."""
    try:
        await indexing.write_points(deps.vectors, points)
    except TransientError as exc:
        log.warning("store.vector_deferred", count=len(points), reason=str(exc))
        deps.index_behind.set()
        return False
    return True


async def _marked(deps: Deps, ids: Sequence[str], rows: Mapping[str, MemoryRecord]) -> None:
    """Mark upserted points indexed in Postgres, each only if its row is still the one of
    ``rows`` its point was built from: a command's update or another batch's merge between
    this read and the mark indexed the newer row itself, and this older point may have landed
    after its own (``IndexRows.mark_indexed``). Bookkeeping for the reconciler, not an output:
    it runs beside the batch's events, and a Postgres away leaves the rows to the maintenance
    loop, which indexes them again (idempotent)."""
    if not ids:
        return
    try:
        await deps.pg.mark_indexed(ids, [m.updated_at if (m := rows.get(i)) else None for i in ids])
    except TransientError as exc:
        log.warning("store.vector_deferred", count=len(ids), reason=str(exc))
        deps.index_behind.set()


async def _announced(
    deps: Deps,
    ids: Sequence[str],
    rows: Mapping[str, MemoryRecord],
    events: Sequence[tuple[MemoryEvent, str, bool]],
    again: Sequence[VectorPoint] = (),
) -> None:
    """The upserted points marked indexed and the events out, side by side: the events wait
    for nothing the marks write (recall reads the index), and the batch is acked after both.
    ``again``: points to write once more first (``store_begun``); each memory is recallable
    already, by a point that may lack this batch's source."""

    async def marked() -> None:
        done = ids
        if again and not await _written_again(deps, again):
            gone = {p.id for p in again}
            done = [i for i in ids if i not in gone]
        await _marked(deps, done, rows)

    await asyncio.gather(marked(), _emit_all(deps, events))


async def settle(deps: Deps, merges: Merges) -> None:
    """The merges of a dedupe with no store after it in the call: written, re-indexed and
    announced as a store batch of no new candidates writes them (one path for both)."""
    if merges.exact or merges.keys or merges.near or merges.mates:
        await stored(deps, [], merges)


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
        rows, [fold_row(c, t) for c, t in merges.near], [fold_row(c, t) for c, t in merges.mates]
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
    # memories the tail of a batch before indexes too: their points from here are written
    # again once that tail has finished, so the newer point lands last (``Deps.indexing``)
    ids = [mid for _, mid in keys]
    clash = [mid for mid in dict.fromkeys(ids) if mid in deps.indexing]
    deps.indexing.update(ids)
    events_of = [
        *merges.events,
        *(
            (event_of(c, "merged", t, now), c.source_event_id, c.scope in SHARED_SCOPES)
            for c, t in near
        ),
    ]

    async def tail(before: Callable[[], Awaitable[None]]) -> None:
        try:
            await _tail(before)
        finally:
            deps.indexing.subtract(ids)
            for mid in ids:
                if deps.indexing[mid] <= 0:
                    deps.indexing.pop(mid, None)

    async def _tail(before: Callable[[], Awaitable[None]]) -> None:
        started = time.perf_counter()
        kept: dict[str, VectorPoint | None] = dict.fromkeys(clash)
        try:
            upserted, rows = await _reindex(deps, keys, new_ids, known, kept)
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
        again = [p for p in kept.values() if p is not None]
        started = time.perf_counter()
        events = _events(events_of, mates, keyed, created, at)
        await _announced(deps, upserted, rows, events, again)
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

"""The remember command's write: decode -> plan -> apply, with the stages' pure functions.

- redaction as the redact stage does it, expiry by ``lifecycle.expires_at``;
- the store decision by ``plan`` over a batch of one: an exact duplicate merges into its
  memory, a near duplicate (same owner, close in meaning and in words, a memory it may fold
  into: ``pipeline.dedupe.foldable``) is folded into that one, anything else is inserted;
- the fold is recorded under the candidate id, so that remembering the same text again finds
  where it went even when the index is away on that try;
- the index may be away: the near-duplicate check is skipped, the memory is kept in Postgres
  unindexed and the maintenance loop indexes it later.

``commands.CommandService.remember`` publishes the event and replies.
"""

from __future__ import annotations

from dataclasses import dataclass

from memstream.consumers import indexing
from memstream.consumers.logs import log
from memstream.consumers.offload import offload
from memstream.consumers.stages import Deps, _redact_candidate, near_filter
from memstream.pipeline import dedupe, lifecycle
from memstream.pipeline import remember as rules
from memstream.pipeline.plan import Action, Neighbour, plan
from memstream.schemas.commands import RememberRequest
from memstream.schemas.errors import TransientError
from memstream.schemas.memory import Candidate, dated
from memstream.storage.postgres import OwnerFilter


@dataclass(frozen=True, slots=True)
class Remembered:
    memory_id: str  # the memory the request became or was folded into
    candidate: Candidate  # redacted, with its expiry
    inserted: bool  # a new row
    folded: bool  # folded into a near duplicate


async def remember(deps: Deps, r: RememberRequest) -> Remembered:
    now = deps.clock()
    c = await offload(len(r.content), _redact_candidate, deps, rules.candidate(r, now))
    c = c.model_copy(update={"expires_at": lifecycle.expires_at(c, now, deps.settings.ttl_s)})
    k = dedupe.key(c)
    tenant = c.owner.tenant
    existing = await deps.pg.existing([(tenant, k.memory_id)])
    fold = r.fold_near_duplicates and not existing
    earlier = await _folded_before(deps, c) if fold else None
    vector, near = await _neighbours(deps, c) if fold and not earlier else (None, {})
    d = plan(
        [k],
        existing=existing,
        neighbours=near,
        min_similarity=deps.settings.near_duplicate_similarity,
        folded={0: earlier} if earlier else None,
    )[0]
    # a refold (remembered and folded before) writes nothing; a near duplicate is folded now
    if d.action is Action.REFOLD or (
        d.action is Action.NEAR_MERGE
        and await deps.pg.merge(tenant, d.target, c.source_event_id, c.candidate_id)
    ):
        done = Remembered(d.target, c, inserted=False, folded=True)
    else:  # new, an exact duplicate, or a near duplicate whose target went since the search
        inserted = await deps.pg.upsert(k.memory_id, k.content_hash, c)
        done = Remembered(k.memory_id, c, inserted=inserted, folded=False)
    if c.pinned:
        await deps.pg.set_pinned(OwnerFilter(tenant=tenant), done.memory_id, True)
    await _index(deps, done, vector)
    return done


async def _folded_before(deps: Deps, c: Candidate) -> str | None:
    """The memory this same candidate was folded into by an earlier request, when that one is
    still live and still a memory it may fold into (the same text remembered in another scope
    is the same candidate id, but may not go where the first one went)."""
    tenant = c.owner.tenant
    target = await deps.pg.folded_into(tenant, c.candidate_id)
    if target is None:
        return None
    flt = OwnerFilter(tenant=tenant, user=c.owner.user, agent=c.owner.agent)
    row = (await deps.pg.get_many(flt, [target])).get(target)
    return target if row is not None and dedupe.foldable(c, indexing.record_of(row)) else None


async def _neighbours(
    deps: Deps, c: Candidate
) -> tuple[list[float] | None, dict[int, list[Neighbour]]]:
    """The candidate's document vector and its nearest same-owner, same-type memories, by
    position as ``plan`` takes them; no neighbours when the index does not answer."""
    text = dated(c.content, c.occurred_at)
    (vector,) = await offload(len(text), deps.embedder.embed, [text])
    try:
        hits = await deps.vectors.search(
            vector, near_filter(c, deps.clock().timestamp()), 3, with_records=True
        )
    except TransientError as exc:  # exact dedupe only; the memory is indexed later
        log.warning("remember.near_check_skipped", reason=type(exc).__name__)
        return vector, {}
    return vector, {0: dedupe.neighbours(c, hits)}


async def _index(deps: Deps, done: Remembered, vector: list[float] | None) -> None:
    """Index the memory now, reusing the candidate's vector when the row holds its text (a
    new row); when a store does not answer the row stays unindexed and the maintenance loop
    indexes it."""
    known = {done.memory_id: vector} if done.inserted and vector is not None else None
    try:
        rows = await deps.pg.get_many(
            OwnerFilter(tenant=done.candidate.owner.tenant), [done.memory_id]
        )
        await indexing.index(deps.pg, deps.vectors, deps.embedder, list(rows.values()), known=known)
    except TransientError as exc:
        log.warning("remember.vector_deferred", memory_id=done.memory_id, reason=type(exc).__name__)
        deps.index_behind.set()

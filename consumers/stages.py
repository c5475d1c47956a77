"""The stage workers: decode, one stage call, durable output, then ack, under the contract
of ``StageRunner`` (consumers/runner.py); ``Deps`` holds what every stage uses."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from nats.js import JetStreamContext
from pydantic import BaseModel, ValidationError

from memstream.consumers import indexing
from memstream.consumers.cache import RecallCache
from memstream.consumers.extractors import LlmExtractor
from memstream.consumers.logs import log
from memstream.consumers.metrics import WorkerMetrics
from memstream.consumers.offload import offload
from memstream.consumers.services import ReadsServices, Services
from memstream.consumers.stagemetrics import StageMetrics
from memstream.pipeline import dedupe, lifecycle, llm_extract
from memstream.pipeline.dedupe import Unindexed
from memstream.pipeline.extract import extract
from memstream.pipeline.redact import Redacts
from memstream.schemas.errors import InvalidMessage, PermanentError, TransientError, describe
from memstream.schemas.events import TurnEvent
from memstream.schemas.memory import (
    SESSION_BOUND,
    SHARED_SCOPES,
    Candidate,
    MemoryEvent,
    MemoryRecord,
    Owner,
    dated,
)
from memstream.schemas.subjects import (
    MSG_ID_HEADER,
    Subjects,
    msg_id,
)
from memstream.storage.pgports import StageStore
from memstream.storage.ports import Embedder, VectorFilter
from memstream.storage.postgres import OwnerFilter

M = TypeVar("M", bound=BaseModel)


def decode(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidMessage(f"invalid {model.__name__}: {describe(exc)}") from exc


@dataclass
class Deps(ReadsServices):
    services: Services
    subjects: Subjects
    js: JetStreamContext
    # the server's largest message (its INFO, read at connect): a dead letter whose body would
    # not fit beside its headers travels without the body
    max_payload: int = 1024 * 1024
    metrics: dict[str, StageMetrics] = field(default_factory=dict)
    cache: RecallCache | None = None
    llm: LlmExtractor | None = None  # MEMSTREAM_EXTRACTOR=rules+llm
    # set when a memory was kept unindexed (the index or Postgres away): the maintenance
    # loop indexes it as soon as the index answers again
    index_behind: asyncio.Event = field(default_factory=asyncio.Event)
    # memories stored by a batch whose index write is still under way (``store_begun``): the
    # next batch's dedupe checks them beside its index search, which cannot find them yet
    unindexed: dict[str, Unindexed] = field(default_factory=dict)
    # memories a store tail will index or is indexing (``store_begun``), how many tails each:
    # a later batch that writes one of them re-reads and re-indexes it only after the tail
    # before it ended, or the older point could land after its newer one
    indexing: Counter[str] = field(default_factory=Counter)
    telemetry: WorkerMetrics | None = None  # Prometheus histograms (consumers/metrics.py)
    # seconds in all and batches, by step (``stagemetrics.STEPS``), for ``ops.stats``
    steps: dict[str, list[float]] = field(default_factory=dict)

    def stepped(self, step: str, started: float) -> None:
        """A batch spent the time since ``started`` (``time.perf_counter``) in ``step``."""
        seconds = time.perf_counter() - started
        total = self.steps.setdefault(step, [0.0, 0])
        total[0] += seconds
        total[1] += 1
        if self.telemetry is not None:
            self.telemetry.batch_step(step, seconds)

    @property
    def pg(self) -> StageStore:
        return self.services.store

    async def reindex(self, tenant: str, ids: Sequence[str], followers: bool = False) -> None:
        """(Re)build the index points of memories from their Postgres rows (after a store,
        merge, pin ...): idempotent."""
        rows = await self.pg.get_many(OwnerFilter(tenant=tenant), list(ids))
        await indexing.index(
            self.pg, self.vectors, self.embedder, list(rows.values()), followers=followers
        )

    async def emit(self, event: MemoryEvent, cause: str, shared: bool = False) -> None:
        """Publish a memory event on ``mem.events.<tenant>`` (deduplicated by cause) and
        invalidate the owner's cached recall queries (``shared``: the tenant's, for a memory
        other owners read)."""
        if self.cache is not None:
            await self.cache.bump(event.tenant, event.user, event.agent, shared)
        await self.publish(
            self.subjects.events(event.tenant),
            event,
            f"{event.kind}:{event.memory_id or '-'}:{cause}",
        )

    async def publish_many(self, items: Sequence[tuple[str, BaseModel, str]]) -> None:
        """``publish`` for many messages, pipelined: all are sent (in order), then every PubAck
        is awaited together; raises if one did not come (TimeoutError: an outage)."""
        futures = []
        try:
            for subject, model, mid in items:
                futures.append(
                    await self.js.publish_async(
                        subject, model.model_dump_json().encode(), headers={MSG_ID_HEADER: mid}
                    )
                )
            await asyncio.wait_for(asyncio.gather(*futures), 5.0)
        finally:
            for f in futures:  # a PubAck that never came must not hold a pending slot
                f.cancel()

    async def publish(self, subject: str, model: BaseModel, msg_id: str) -> None:
        """JetStream publish with ``Nats-Msg-Id``; returns once the PubAck arrived."""
        await self.js.publish(
            subject, model.model_dump_json().encode(), headers={MSG_ID_HEADER: msg_id}, timeout=5.0
        )


Work = Callable[[Deps, bytes, str], Awaitable[int]]  # (deps, body, subject) -> outputs


# --- the four stages -----------------------------------------------------------------------


def _on_stage(deps: Deps, subject: str, stage: str, c: Candidate) -> Candidate:
    if why := deps.subjects.stage_mismatch(subject, stage, c.owner.tenant, c.owner.key):
        raise InvalidMessage(why)
    return c


async def extract_work(deps: Deps, body: bytes, subject: str) -> int:
    event = decode(TurnEvent, body)
    if why := deps.subjects.turn_mismatch(subject, event.tenant, event.owner, event.session):
        raise InvalidMessage(why)
    owner = Owner(tenant=event.tenant, user=event.user, agent=event.agent)
    if await deps.pg.is_memory_off(event.tenant, owner.key, event.session):
        return 0  # memory is off for this session: the turn is consumed, nothing is stored
    candidates = await offload(len(body), extract, event)
    if deps.llm is not None and candidates:
        candidates = llm_extract.complement(candidates, await deps.llm.candidates(event))
    await asyncio.gather(
        *(
            deps.publish(
                deps.subjects.stage("redact", c.owner.tenant, c.owner.key),
                c,
                msg_id(c.owner.tenant, f"redact:{c.candidate_id}"),
            )
            for c in candidates
        )
    )
    return len(candidates)


def _redact_candidate(deps: Deps, c: Candidate) -> Candidate:
    return redact_candidate(deps.redactor, c)


def redact_candidate(redactor: Redacts, c: Candidate) -> Candidate:
    """The candidate with its content and every string of its metadata redacted, the counts
    by label in ``redactions``."""
    return c.model_copy(update=redaction(redactor, c))


def redaction(redactor: Redacts, c: Candidate) -> dict[str, Any]:
    """What ``redact_candidate`` changes in ``c``, as a ``model_copy`` update."""
    tenant = c.owner.tenant
    out = redactor.redact(c.content, tenant=tenant)
    counts = dict(out.counts)

    def scrub(v: Any) -> Any:
        # metadata may be structured (seed 004's task_context): every string inside is redacted
        if isinstance(v, str):
            r = redactor.redact(v, tenant=tenant)
            for label, n in r.counts.items():
                counts[label] = counts.get(label, 0) + n
            return r.text
        if isinstance(v, list):
            return [scrub(x) for x in v]
        if isinstance(v, dict):
            return {k: scrub(x) for k, x in v.items()}
        return v

    metadata: dict[str, Any] = {k: scrub(v) for k, v in c.metadata.items()}
    return {
        "content": out.text,
        "metadata": metadata,
        "redactions": counts,
        "redacted": True,
        "key_id": redactor.key_id,
    }


def with_vectors(deps: Deps, cands: Sequence[Candidate]) -> list[Candidate]:
    return embedded(deps.embedder, cands)


def embedded(
    embedder: Embedder,
    cands: Sequence[Candidate],
    changes: Sequence[dict[str, Any]] | None = None,
) -> list[Candidate]:
    """The candidates, each carrying the dense vector of its dated, redacted content: one
    embedding call, made in the redact stage because that stage can run in many processes,
    while dedupe and store run where the vector index is (docs/ingest.md). ``changes``: an
    update per candidate made in the same copy (the helper's ``redaction``: one copy of each
    candidate instead of two, each ~5 % of the helper's time); its content is embedded."""
    updates = changes if changes is not None else [{} for _ in cands]
    vectors = embedder.embed(
        [
            dated(u.get("content", c.content), c.occurred_at)
            for c, u in zip(cands, updates, strict=True)
        ]
    )
    model = embedder.model_id
    return [
        c.model_copy(update={**u, "vector": v, "vector_model": model})
        for c, u, v in zip(cands, updates, vectors, strict=True)
    ]


def carried(deps: Deps, c: Candidate) -> list[float] | None:
    """The vector a candidate brought from redact, if this process's model made it (a
    message from before the field is taken when the size fits); else it is embedded again."""
    if c.vector is None or len(c.vector) != deps.embedder.dim:
        return None
    return c.vector if c.vector_model in (None, deps.embedder.model_id) else None


def redacted_here(deps: Deps, c: Candidate, stage: str) -> Candidate:
    """``c``, as a stage after redact takes it: redacted, with this process's redaction key.
    A candidate redacted with another key is refused for good (``PermanentError``, so it is
    dead-lettered with the reason on its first delivery): its placeholders would differ from
    this stack's for the same values, and its memory would be stored apart from theirs."""
    if not c.redacted:
        raise PermanentError(f"candidate reached {stage} without passing redact")
    mine = deps.redactor.key_id
    if c.key_id is not None and c.key_id != mine:
        raise PermanentError(
            f"candidate redacted with another MEMSTREAM_REDACTION_KEY (key id {c.key_id}, "
            f"this {stage} worker's {mine}): every process of a stack must share the key; "
            "fix the redacting process's setting and publish this candidate's turn "
            "(source_event_id) again"
        )
    return c


async def redact_work(deps: Deps, body: bytes, subject: str) -> int:
    c = _on_stage(deps, subject, "redact", decode(Candidate, body))
    c = await offload(len(body), _redact_candidate, deps, c)
    (c,) = with_vectors(deps, [c])
    metrics = deps.metrics["redact"].redactions
    for label, n in c.redactions.items():
        metrics[label] = metrics.get(label, 0) + n
    tenant = c.owner.tenant
    await deps.publish(
        deps.subjects.stage("dedupe", tenant, c.owner.key),
        c,
        msg_id(tenant, f"dedupe:{c.candidate_id}"),
    )
    return 1


def event_of(c: Candidate, kind: str, memory_id: str, at: datetime) -> MemoryEvent:
    return MemoryEvent(
        kind=kind,
        tenant=c.owner.tenant,
        user=c.owner.user,
        agent=c.owner.agent,
        memory_id=memory_id,
        type=c.type,
        source_event_id=c.source_event_id,
        at=at,
    )


async def _merged(deps: Deps, c: Candidate, memory_id: str) -> None:
    """A candidate was folded into an existing memory: refresh its index record (or leave it
    to the reconciler when the index is down) and tell the world."""
    try:
        await deps.reindex(c.owner.tenant, [memory_id])
    except TransientError:
        deps.index_behind.set()
    shared = c.scope in SHARED_SCOPES
    await deps.emit(event_of(c, "merged", memory_id, deps.clock()), c.source_event_id, shared)


async def dedupe_work(deps: Deps, body: bytes, subject: str) -> int:
    c = redacted_here(deps, _on_stage(deps, subject, "dedupe", decode(Candidate, body)), "dedupe")
    keyed = dedupe.key(c)
    # a redelivery folded on an earlier try stays folded, even into a memory other than an
    # exact duplicate stored since (``pipeline.plan``: a turn is held in one memory)
    if folded := await deps.pg.folded_into(c.owner.tenant, c.candidate_id):
        await _merged(deps, c, folded)
        return 0
    if await deps.pg.exists(c.owner.tenant, keyed.memory_id):
        await deps.pg.upsert(keyed.memory_id, keyed.content_hash, c)  # merge the source event
        await _merged(deps, c, keyed.memory_id)
        return 0
    vector = carried(deps, c) or deps.embedder.embed_query(dated(c.content, c.occurred_at))
    try:
        hits = await deps.vectors.search(
            vector, near_filter(c, deps.clock().timestamp()), 3, with_records=True
        )
    except TransientError as exc:  # index down: exact dedupe only; store keeps it unindexed
        log.warning("dedupe.near_check_skipped", reason=type(exc).__name__)
        hits = []
    similar = dedupe.near_duplicate(
        c.content,
        dedupe.neighbours(c, hits),
        keyed.memory_id,
        deps.settings.near_duplicate_similarity,
    )
    if similar is not None and await deps.pg.merge(
        c.owner.tenant, similar, c.source_event_id, c.candidate_id
    ):
        await _merged(deps, c, similar)
        return 0
    tenant = c.owner.tenant
    await deps.publish(
        deps.subjects.stage("store", tenant, c.owner.key),
        c,
        msg_id(tenant, f"store:{c.candidate_id}"),
    )
    return 1


def near_filter(c: Candidate, now: float) -> VectorFilter:
    """Where ``c``'s near duplicates may be: its owner's own live memories of its type and
    scope (of its session for a session-bound scope); ``dedupe.neighbours`` then keeps those
    of its reach."""
    return VectorFilter(
        tenant=c.owner.tenant,
        user=c.owner.user,
        agent=c.owner.agent,
        types=(c.type,),
        scopes=(c.scope,),
        session=c.session if c.scope in SESSION_BOUND else None,
        now=now,
    )


def created_by(row: MemoryRecord | None, c: Candidate) -> bool:
    """Whether ``c`` created ``row`` (its first source): a try that stored it and failed
    before its events went out. Tried again, it is announced as stored, as that try would
    have, never as merged into itself (``PgStore.upsert_many`` keys its audit row alike)."""
    return row is not None and row.source_event_ids[:1] == [c.source_event_id]


async def store_work(deps: Deps, body: bytes, subject: str) -> int:
    c = redacted_here(deps, _on_stage(deps, subject, "store", decode(Candidate, body)), "store")
    if await deps.pg.folded_into(c.owner.tenant, c.candidate_id):
        # a dedupe try sent it here, and a later try (a redelivery) folded it into a near
        # duplicate: storing it too would hold its turn twice
        return 0
    expires = lifecycle.expires_at(c, deps.clock(), deps.settings.ttl_s)
    if expires != c.expires_at:
        c = c.model_copy(update={"expires_at": expires})
    keyed = dedupe.key(c)
    inserted = await deps.pg.upsert(keyed.memory_id, keyed.content_hash, c)
    try:
        await deps.reindex(c.owner.tenant, [keyed.memory_id], followers=inserted)
    except TransientError as exc:  # kept in Postgres, not indexed: the reconciler retries
        log.warning("store.vector_deferred", memory_id=keyed.memory_id, reason=str(exc))
        deps.index_behind.set()
    created = inserted
    if not inserted:  # created by this candidate on an earlier try?
        rows = await deps.pg.memories_by_id([(c.owner.tenant, keyed.memory_id)])
        created = created_by(rows.get(keyed.memory_id), c)
    kind = "stored" if created else "merged"
    shared = c.scope in SHARED_SCOPES
    await deps.emit(event_of(c, kind, keyed.memory_id, deps.clock()), c.source_event_id, shared)
    return 1


STAGE_WORK: dict[str, Work] = {
    "extract": extract_work,
    "redact": redact_work,
    "dedupe": dedupe_work,
    "store": store_work,
}


def delivered_before(msg: Any) -> bool:
    """Whether JetStream delivered this message (a faststream or ``One`` message) before."""
    meta = msg.raw_message.metadata
    return bool(meta and (meta.num_delivered or 1) > 1)

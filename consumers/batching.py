"""Stage batches: a stage handles its whole pull batch as one unit.

The contract (docs/ingest.md):
- every message of the batch is decoded and checked first; one that fails (a permanent
  error: bad JSON, wrong subject, a candidate that skipped redact) goes to the single path,
  which dead-letters it on its first delivery: it never holds up the rest;
- the others go through one batch call: one pure call per step, one Postgres round trip per
  statement kind, one embedding call, one vector upsert, publishes pipelined and awaited
  together. They are acked, together, only after all of the batch's outputs are durable;
- an outage (a server away) holds the whole batch and tries it again, renewing every
  message's ack deadline, as the single path does for one message;
- any other failure of the batch call falls back to singles: each message of the batch, in
  stream order, through the single path (``StageRunner``): the poison message is dead-lettered
  or retried alone, the rest succeed. Writes are idempotent, so what the failed batch call
  did already is done again harmlessly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from memstream.consumers import indexing
from memstream.consumers.logs import log
from memstream.consumers.offload import offload
from memstream.consumers.outage import Backoff, is_outage
from memstream.consumers.stages import (
    STAGE_WORK,
    Deps,
    StageRunner,
    Work,
    _redact_candidate,
    decode,
    event_of,
)
from memstream.pipeline import dedupe, lifecycle, llm_extract
from memstream.pipeline.extract import extract
from memstream.pipeline.lexical import dated
from memstream.pipeline.plan import Action, plan
from memstream.schemas.errors import InvalidMessage, PermanentError, TransientError
from memstream.schemas.events import TurnEvent
from memstream.schemas.ids import owner_key
from memstream.schemas.memory import SHARED_SCOPES, Candidate, MemoryEvent
from memstream.schemas.subjects import msg_id
from memstream.storage.ports import VectorFilter

T = TypeVar("T")


class One:
    """One nats-py message of a pull batch, with the interface of faststream's message that
    ``StageRunner`` uses (body, raw_message, ack, nack(delay=), reject, in_progress)."""

    __slots__ = ("raw_message",)

    def __init__(self, raw: Any) -> None:
        self.raw_message = raw

    @property
    def body(self) -> bytes:
        data: bytes = self.raw_message.data
        return data

    async def ack(self) -> None:
        await self.raw_message.ack()

    async def nack(self, delay: float | None = None) -> None:
        await self.raw_message.nak(delay=delay)

    async def reject(self) -> None:
        await self.raw_message.term()

    async def in_progress(self) -> None:
        await self.raw_message.in_progress()


Decode = Callable[[Deps, bytes, str], T]  # raises PermanentError for a message that cannot pass
BatchWork = Callable[[Deps, list[T]], Awaitable[int]]  # (deps, decoded batch) -> outputs


@dataclass(frozen=True)
class BatchStage(Generic[T]):
    decode: Decode[T]
    work: BatchWork[T]
    single: Work  # the same stage for one message: the fallback


class BatchRunner(StageRunner):
    """Runs one stage over whole pull batches under the contract of the module docstring."""

    def __init__(self, name: str, deps: Deps, stage: BatchStage[Any]) -> None:
        super().__init__(name, deps, stage.single)
        self.stage = stage

    async def batch(self, raws: Sequence[Any]) -> None:
        msgs = [One(r) for r in raws]
        m = self.metrics
        started = time.perf_counter()
        m.batches += 1
        m.processed += len(msgs)
        m.enter()
        try:
            good: list[tuple[One, Any]] = []
            singles: list[One] = []
            for msg in msgs:
                try:
                    good.append(
                        (msg, self.stage.decode(self.deps, msg.body, msg.raw_message.subject))
                    )
                except PermanentError:
                    singles.append(msg)
            if good:
                try:
                    outputs = await self._attempt_batch(good)
                except Exception as exc:  # noqa: BLE001 - any failure of the batch: isolate by singles
                    log.warning(  # the error's type only: a message could quote a value
                        "stage.batch_split",
                        stage=self.name,
                        size=len(good),
                        reason=type(exc).__name__,
                    )
                    singles = msgs  # all of them, in stream order
                else:
                    await asyncio.gather(*(msg.ack() for msg, _ in good))
                    m.acked += len(good)
                    m.outputs += outputs
            for msg in singles:
                await self.one(msg)
        finally:
            m.busy_s += time.perf_counter() - started
            m.leave()

    async def _attempt_batch(self, good: list[tuple[One, Any]]) -> int:
        """The batch call, held and tried again while the error is an outage (as
        ``StageRunner._attempt`` does for one message)."""
        budget = self.deps.settings.stage.outage_hold_s
        backoff = Backoff()
        held = 0.0
        values = [v for _, v in good]
        while True:
            try:
                return await self.stage.work(self.deps, values)
            except Exception as exc:
                if not is_outage(exc) or held >= budget:
                    raise
                pause = backoff.next()
                if held == 0.0:
                    log.warning("stage.outage_hold", stage=self.name, reason=type(exc).__name__)
                self.metrics.held += 1
                self.metrics.last_error = f"outage: {type(exc).__name__}"
                await asyncio.sleep(pause)
                held += pause
                with contextlib.suppress(Exception):  # NATS itself may be the one away
                    await asyncio.gather(*(msg.in_progress() for msg, _ in good))


# --- the four stages over a batch ------------------------------------------------------------


def decode_turn(deps: Deps, body: bytes, subject: str) -> TurnEvent:
    event = decode(TurnEvent, body)
    if why := deps.subjects.turn_mismatch(subject, event.tenant, event.owner, event.session):
        raise InvalidMessage(why)
    return event


def candidate_on(stage: str) -> Decode[Candidate]:
    def decode_candidate(deps: Deps, body: bytes, subject: str) -> Candidate:
        c = decode(Candidate, body)
        if why := deps.subjects.stage_mismatch(subject, stage, c.owner.tenant):
            raise InvalidMessage(why)
        if stage != "redact" and not c.redacted:
            raise PermanentError(f"candidate reached {stage} without passing redact")
        return c

    return decode_candidate


async def _forward(deps: Deps, stage: str, cands: Sequence[Candidate]) -> None:
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
        owners = {(e.tenant, e.user, e.agent, shared) for e, _, shared in events}
        for tenant, user, agent, shared in owners:
            await deps.cache.bump(tenant, user, agent, shared)
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
) -> None:
    """(Re)build the index points of these memories from their rows, in one read, one
    embedding call (none for the ``known`` vectors) and one upsert; left to the reconciler
    when a store is away."""
    try:
        rows = await deps.pg.memories_by_id(list(dict.fromkeys(keys)))
        await indexing.index(
            deps.pg, deps.vectors, deps.embedder, list(rows.values()), followers, known
        )
    except TransientError as exc:
        log.warning("store.vector_deferred", count=len(keys), reason=str(exc))
        deps.index_behind.set()  # the maintenance loop indexes them once the index answers


async def extract_batch(deps: Deps, events: list[TurnEvent]) -> int:
    keys = [(e.tenant, owner_key(e.user, e.agent), e.session) for e in events]
    off = await deps.pg.memory_off_among(list(set(keys)))
    out: list[Candidate] = []
    for event, k in zip(events, keys, strict=True):
        if k in off:
            continue  # memory is off for this session: the turn is consumed, nothing is stored
        size = sum(len(m.content) for m in event.messages)
        candidates = await offload(size, extract, event)
        if deps.llm is not None and candidates:
            candidates = llm_extract.complement(candidates, await deps.llm.candidates(event))
        out.extend(candidates)
    await _forward(deps, "redact", out)
    return len(out)


async def redact_batch(deps: Deps, cands: list[Candidate]) -> int:
    metrics = deps.metrics["redact"].redactions
    out = []
    for c in cands:
        size = len(c.content) + sum(len(str(v)) for v in c.metadata.values())
        r = await offload(size, _redact_candidate, deps, c)
        for label, n in r.redactions.items():
            metrics[label] = metrics.get(label, 0) + n
        out.append(r)
    await _forward(deps, "dedupe", out)
    return len(out)


async def dedupe_batch(deps: Deps, cands: list[Candidate]) -> int:
    keyed = [dedupe.key(c) for c in cands]
    existing = await deps.pg.existing([(k.candidate.owner.tenant, k.memory_id) for k in keyed])
    fresh = [
        i for i, k in enumerate(keyed) if (k.candidate.owner.tenant, k.memory_id) not in existing
    ]
    neighbours: dict[int, list[tuple[str, float, str]]] = {}
    vectors: list[list[float]] = []
    if fresh:
        vectors = deps.embedder.embed(
            [dated(cands[i].content, cands[i].occurred_at) for i in fresh]
        )
        now = deps.clock().timestamp()
        queries = [
            (
                vector,
                VectorFilter(
                    tenant=cands[i].owner.tenant,
                    user=cands[i].owner.user,
                    agent=cands[i].owner.agent,
                    types=(cands[i].type,),
                    now=now,
                ),
            )
            for i, vector in zip(fresh, vectors, strict=True)
        ]
        try:
            found = await deps.vectors.search_many(queries, 3)
            for i, hits in zip(fresh, found, strict=True):
                neighbours[i] = [(mid, s, str(r.get("text", ""))) for mid, s, r in hits]
        except TransientError as exc:  # index down: exact dedupe only; store keeps it unindexed
            log.warning("dedupe.near_check_skipped", reason=type(exc).__name__)
            neighbours = {}
    decisions = plan(keyed, existing, neighbours, deps.settings.near_duplicate_similarity)
    exact = [d for d in decisions if d.action is Action.MERGE]
    if exact:  # merge the source events
        await deps.pg.upsert_many(
            [(d.target, d.keyed.content_hash, d.keyed.candidate) for d in exact]
        )
    near = [d for d in decisions if d.action is Action.NEAR_MERGE]
    near_ok = await deps.pg.merge_many(
        [
            (d.keyed.candidate.owner.tenant, d.target, d.keyed.candidate.source_event_id)
            for d in near
        ]
    )
    # a near-duplicate whose target went since the search (forgotten, expired) is stored anew
    gone = {id(d) for d, ok in zip(near, near_ok, strict=True) if not ok}
    merged = exact + [d for d, ok in zip(near, near_ok, strict=True) if ok]
    forward: list[Candidate] = []
    carried = dict(zip(fresh, vectors, strict=True))
    for i, d in enumerate(decisions):
        if d.action is Action.INSERT or id(d) in gone:
            c = d.keyed.candidate
            if i in carried:  # the store stage indexes this vector instead of embedding again
                c = c.model_copy(update={"vector": carried[i]})
            forward.append(c)
    if merged:
        await _reindex(deps, [(d.keyed.candidate.owner.tenant, d.target) for d in merged])
        at = deps.clock()
        await _emit_all(
            deps,
            [
                (
                    event_of(d.keyed.candidate, "merged", d.target, at),
                    d.keyed.candidate.source_event_id,
                    d.keyed.candidate.scope in SHARED_SCOPES,
                )
                for d in merged
            ],
        )
    await _forward(deps, "store", forward)
    return len(forward)


async def store_batch(deps: Deps, cands: list[Candidate]) -> int:
    now = deps.clock()
    ready = []
    for c in cands:
        expires = lifecycle.expires_at(c, now, deps.settings.ttl_s)
        ready.append(c if expires == c.expires_at else c.model_copy(update={"expires_at": expires}))
    keyed = [dedupe.key(c) for c in ready]
    inserted = await deps.pg.upsert_many(
        [(k.memory_id, k.content_hash, k.candidate) for k in keyed]
    )
    new_ids = {k.memory_id for k, new in zip(keyed, inserted, strict=True) if new}
    # a carried vector is that of the candidate's text: it is the row's only when inserted
    known: dict[str, Sequence[float]] = {
        k.memory_id: k.candidate.vector
        for k, new in zip(keyed, inserted, strict=True)
        if new and k.candidate.vector is not None
    }
    await _reindex(deps, [(k.candidate.owner.tenant, k.memory_id) for k in keyed], new_ids, known)
    at = deps.clock()
    await _emit_all(
        deps,
        [
            (
                event_of(k.candidate, "stored" if new else "merged", k.memory_id, at),
                k.candidate.source_event_id,
                k.candidate.scope in SHARED_SCOPES,
            )
            for k, new in zip(keyed, inserted, strict=True)
        ],
    )
    return len(keyed)


BATCH_STAGES: dict[str, BatchStage[Any]] = {
    "extract": BatchStage(decode_turn, extract_batch, STAGE_WORK["extract"]),
    "redact": BatchStage(candidate_on("redact"), redact_batch, STAGE_WORK["redact"]),
    "dedupe": BatchStage(candidate_on("dedupe"), dedupe_batch, STAGE_WORK["dedupe"]),
    "store": BatchStage(candidate_on("store"), store_batch, STAGE_WORK["store"]),
}


class PullLoops:
    """One pull loop per stage on plain nats-py: each fetch returns at once with whatever is
    waiting (up to ``batch_size``; faststream's batch mode would wait for a full batch or its
    timeout, adding that wait to every turn's latency), and the batch is handled as a unit.
    One batch at a time per stage: per-session order holds (DESIGN.md section 8: no
    concurrent handlers on a pull consumer)."""

    def __init__(self, js: Any, runners: dict[str, tuple[str, str, BatchRunner]], size: int):
        self.js, self.runners, self.size = js, runners, size
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False

    async def start(self) -> None:
        for stage, (stream, durable, runner) in self.runners.items():
            sub = await self.js.pull_subscribe_bind(durable=durable, stream=stream)
            self._tasks[stage] = asyncio.create_task(self._loop(stage, sub, runner))

    async def _loop(self, stage: str, sub: Any, runner: BatchRunner) -> None:
        backoff = Backoff(0.2, 2.0)
        while not self._stopping:
            try:
                msgs = await sub.fetch(self.size, timeout=1.0)
            except TimeoutError:
                continue
            except Exception as exc:  # noqa: BLE001 - NATS away or reconnecting: fetch again soon
                log.debug("stage.fetch_failed", stage=stage, reason=type(exc).__name__)
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            if self._stopping:  # stopped while fetching: hand them back at once
                with contextlib.suppress(Exception):
                    await asyncio.gather(*(m.nak() for m in msgs))
                break
            try:
                await runner.batch(msgs)
            except Exception:  # noqa: BLE001 - the loop outlives any batch; the messages are redelivered
                log.exception("stage.batch_error", stage=stage)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop fetching: a fetch under way ends within its 1 s timeout and hands back what it
        got (cancelling it could strand delivered messages until ``ack_wait``); a batch in hand
        is finished. After ``grace_s`` the loops are cancelled."""
        self._stopping = True
        if self._tasks:
            _, late = await asyncio.wait(self._tasks.values(), timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

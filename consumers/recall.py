"""The recall responder.

Hybrid recall runs two legs in the vector index at once: dense (cosine over the static
embedding of the dated memory text) and keyword (BM25 over term weights with earlier-turn
context, IDF kept by the index); their scores are fused and the hits selected by the pure
rules of pipeline/ranking.py. Hits come back with their records from the index payload: no
Postgres read on the hot path.

Degradation, reported in ``RecallReply.degraded``:
- the embedder fails: the keyword leg answers alone (``embedder``);
- the vector index fails: Postgres full-text search answers (``vector_index``);
- Postgres fails: nothing on the hot path needs it; access counting is skipped (logged).
Only when no component can answer is the reply an error.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from memstream.consumers.indexing import record_of
from memstream.consumers.logs import log
from memstream.consumers.metrics import WorkerMetrics
from memstream.consumers.services import ReadsServices, Services
from memstream.pipeline.lexical import query_vector
from memstream.pipeline.ranking import leg_size, scored, select, single
from memstream.schemas.errors import (
    EmbedderFailed,
    ErrorCode,
    ErrorInfo,
    ErrorReply,
    MemstreamError,
    StorageUnavailable,
)
from memstream.schemas.memory import Scope
from memstream.schemas.recall import Caller, Context, Hit, Method, RecallReply, RecallRequest
from memstream.storage.pgports import Audit, MemoryReads
from memstream.storage.ports import Hit as ScoredId
from memstream.storage.ports import VectorFilter, visible
from memstream.storage.postgres import OwnerFilter

T = TypeVar("T")
SHARED = (Scope.PROJECT, Scope.GLOBAL)  # the "resources" context
TOUCH_EVERY_S = 0.5  # access counts are written in batches
# at shutdown, how long counts of rows another transaction holds are tried again, and how often
TOUCH_STOP_S, TOUCH_RETRY_S = 2.0, 0.05
FETCH_MARGIN = 2  # records read beyond top_k at first; more pages only if collapse drops many


def error_reply(code: ErrorCode, message: str) -> bytes:
    return ErrorReply(error=ErrorInfo(code=code, message=message)).model_dump_json().encode()


async def record_read(
    audit: Audit, kind: str, caller: Caller, hits: list[Hit], **detail: Any
) -> None:
    """One audit row for a read (seed 004's activity log): who read which memories, never
    the query. Best effort, as the access counts are: Postgres away loses the row, not the
    answer, which the index gave."""
    ids = [h.id for h in hits]
    row = {"user": caller.user, "agent": caller.agent, "memory_ids": ids, **detail}
    try:
        await audit.record_event(caller.tenant, None, kind, uuid.uuid4().hex, row)
    except MemstreamError as exc:
        log.warning("recall.read_not_recorded", kind=kind, error=type(exc).__name__)


def owner_filter(req: RecallRequest, owner: OwnerFilter | None = None) -> OwnerFilter:
    """The request's filters AND-ed with the owner scope (``owner`` replaces the request's
    owner for peer reads); the caller can only narrow."""
    base = owner or OwnerFilter(
        tenant=req.tenant, user=req.user, agent=req.agent, project=req.project, shared=True
    )
    scopes = tuple(req.scopes)
    if req.context is Context.RESOURCES:
        scopes = tuple(s for s in scopes if s in SHARED) if scopes else SHARED
    return OwnerFilter(
        tenant=base.tenant,
        user=base.user,
        agent=base.agent,
        project=base.project,
        shared=base.shared,
        peer=base.peer,
        exclude_agent=base.exclude_agent,
        session=req.session if req.context is Context.SESSION or req.session else None,
        types=tuple(req.types),
        scopes=scopes,
        occurred_from=req.occurred_from,
        occurred_to=req.occurred_to,
        tags=tuple(req.tags),
    )


def vector_filter(flt: OwnerFilter, now: float) -> VectorFilter:
    return VectorFilter(
        tenant=flt.tenant,
        user=flt.user,
        agent=flt.agent,
        project=flt.project,
        shared=flt.shared,
        peer=flt.peer,
        session=flt.session,
        types=tuple(flt.types),
        scopes=tuple(flt.scopes),
        now=now,
        occurred_from=flt.occurred_from.timestamp() if flt.occurred_from else None,
        occurred_to=flt.occurred_to.timestamp() if flt.occurred_to else None,
        tags=tuple(flt.tags),
        exclude_agent=flt.exclude_agent,
    )


async def settled(leg: Awaitable[T]) -> T | BaseException:
    """``leg``'s result, or the exception it raised (as ``gather(return_exceptions=True)``)."""
    try:
        return await leg
    except Exception as exc:  # noqa: BLE001 - handed back to the caller, which sorts them
        return exc


class IndexBusy:
    """The reads of a vector index that cannot answer now (the process that holds a Qdrant
    Edge shard, while its optimize builds): each fails at once, so recall answers from
    Postgres as during an outage instead of waiting for it (``Worker.standby_recall``)."""

    searches_inline = True  # every leg fails at once: no tasks to make

    async def search(self, *args: Any, **kwargs: Any) -> Any:
        raise StorageUnavailable("the vector index is optimizing")

    search_sparse = fetch = search


class RecallService(ReadsServices):
    def __init__(self, services: Services) -> None:
        self.services = services
        self._touches: dict[str, dict[str, int]] = {}
        self._flusher: asyncio.Task[None] | None = None
        self.served = 0
        self.failed = 0
        # server time of the latest recalls, for the console's p50/p95 (memstream.console)
        self.latencies_ms: deque[float] = deque(maxlen=512)
        self.telemetry: WorkerMetrics | None = None  # per-leg histograms (consumers/metrics.py)

    @property
    def pg(self) -> MemoryReads:
        return self.services.store

    async def _dense(
        self, req: RecallRequest, vflt: VectorFilter, n: int, spent: dict[str, float]
    ) -> list[ScoredId]:
        started = time.perf_counter()
        try:
            vector = self.embedder.embed_query(req.query)
        except Exception as exc:  # the embedder is a foreign library: any failure degrades
            raise EmbedderFailed from exc
        embedded = time.perf_counter()
        spent["embed"] = embedded - started
        found = await self.vectors.search(vector, vflt, n)
        spent["dense"] = time.perf_counter() - embedded
        return found

    async def _keyword(
        self, req: RecallRequest, vflt: VectorFilter, n: int, spent: dict[str, float]
    ) -> list[ScoredId]:
        started = time.perf_counter()
        sparse = query_vector(req.query)
        found = await self.vectors.search_sparse(sparse, vflt, n) if sparse else []
        spent["keyword"] = time.perf_counter() - started
        return found

    async def _select_fetched(
        self,
        req: RecallRequest,
        best: list[tuple[str, float]],
        vflt: VectorFilter,
        spent: dict[str, float] | None = None,
        absolute: Mapping[str, float] | None = None,
    ) -> tuple[list[Hit], bool]:
        """``select`` over the best ids, their records read from the index in pages (legs
        search without payloads, which is several times faster): first ``top_k`` plus a small
        margin, more only while the collapse leaves ``top_k`` unfilled (a fetch's cost grows
        with the records it reads). A record the filter may not read is
        dropped (the index's own check, ``visible``; ``fetch`` checks the tenant)."""

        def owned(record: Mapping[str, Any]) -> bool:
            scope, project = str(record.get("scope")), record.get("project")
            return visible(vflt, record.get("user"), record.get("agent"), scope, project)

        ranked: list[tuple[Mapping[str, Any], float]] = []
        pos, step = 0, req.limit + FETCH_MARGIN
        while True:
            head = best[pos : pos + step]
            if head:
                started = time.perf_counter()
                records = await self.vectors.fetch(req.tenant, [mid for mid, _ in head])
                if spent is not None:
                    spent["fetch"] = spent.get("fetch", 0.0) + time.perf_counter() - started
                ranked += [(r, s) for mid, s in head if (r := records.get(mid)) and owned(r)]
            pos += len(head)
            hits, truncated = select(ranked, req, absolute)
            below = bool(head) and head[-1][1] < req.score_threshold  # the rest is lower
            if len(hits) >= req.limit or truncated or below or pos >= len(best):
                return hits, truncated
            step = req.limit

    async def _postgres_keyword(
        self, req: RecallRequest, flt: OwnerFilter, n: int
    ) -> list[tuple[Mapping[str, Any], float]]:
        found = await self.pg.keyword_search(flt, req.query, n)
        records = await self.pg.get_many(flt, [mid for mid, _ in found])
        scaled = single("keyword", found)
        return [(record_of(records[mid]), s) for mid, s in scaled if mid in records]

    async def recall(
        self, req: RecallRequest, touch: bool = True, owner: OwnerFilter | None = None
    ) -> RecallReply:
        """``owner`` replaces the request's owner scope (peer reads); ``touch``: count the
        access on the hits (own recall only)."""
        started = time.perf_counter()
        if req.context is Context.RESOURCES and req.scopes and not set(req.scopes) & set(SHARED):
            return RecallReply(hits=[], method=req.method)  # asked for no shared scope
        flt = owner_filter(req, owner)
        now = self.pg.clock()
        vflt = vector_filter(flt, now.timestamp())
        n = leg_size(req.limit)
        spent: dict[str, float] = {}  # seconds per part, reported in timings_ms
        legs: dict[str, Any] = {}
        if req.method in (Method.VECTOR, Method.HYBRID):
            legs["dense"] = self._dense(req, vflt, n, spent)
        if req.method in (Method.KEYWORD, Method.HYBRID):
            legs["keyword"] = self._keyword(req, vflt, n, spent)
        if self.vectors.searches_inline:
            # the legs run on the event loop anyway: one after the other saves creating the two
            # tasks of a gather; searches in threads still run side by side
            results = {name: await settled(leg) for name, leg in legs.items()}
        else:
            gathered = await asyncio.gather(*legs.values(), return_exceptions=True)
            results = dict(zip(legs, gathered, strict=True))
        degraded: list[str] = []
        answered: dict[str, list[ScoredId]] = {}
        index_down = False
        for name, result in results.items():
            if isinstance(result, EmbedderFailed):
                degraded.append("embedder")
            elif isinstance(result, MemstreamError):
                index_down = True
            elif isinstance(result, BaseException):
                raise result
            else:
                answered[name] = result
        if index_down:
            degraded.append("vector_index")
            if "embedder" not in degraded and req.method is Method.VECTOR:
                raise MemstreamError("the vector index is down")
            ranked = await self._postgres_keyword(req, flt, n)  # raises if Postgres is down too
            hits, truncated = select(ranked, req)
        else:
            if not answered:
                # only the dense leg was asked for and the embedder failed: keyword instead
                answered = {"keyword": await self._keyword(req, vflt, n, spent)}
            best, absolute = scored(answered)
            hits, truncated = await self._select_fetched(req, best, vflt, spent, absolute)
        searched = time.perf_counter()
        if hits and touch:
            # an access counts on the caller's own memories only: another owner's shared one
            # is theirs to change (docs/memory-model.md), and its count ranks it for them
            mine = [h.id for h in hits if h.user == req.user and h.agent == req.agent]
            if mine:
                self._touch(req.tenant, mine)
        done = time.perf_counter()
        self.latencies_ms.append((done - started) * 1000)
        if self.telemetry is not None:
            self.telemetry.recall_parts(spent)
        return RecallReply(
            hits=hits,
            method=req.method,
            degraded=degraded,
            truncated=truncated,
            timings_ms={
                **{part: round(s * 1000, 3) for part, s in spent.items()},
                "search": round((searched - started) * 1000, 3),
                "total": round((done - started) * 1000, 3),
            },
        )

    def _touch(self, tenant: str, ids: list[str]) -> None:
        """Queue access counts; one background flush writes them all (at most every
        ``TOUCH_EVERY_S``), so a busy recall path costs Postgres one statement per tenant
        per interval instead of one per request."""
        pending = self._touches.setdefault(tenant, {})
        for mid in ids:
            pending[mid] = pending.get(mid, 0) + 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        """Flush every ``TOUCH_EVERY_S`` while counts wait (those of rows a store transaction
        held come back from ``flush_touches``)."""
        while True:
            await asyncio.sleep(TOUCH_EVERY_S)
            await self.flush_touches()
            if not self._touches:
                return

    async def flush_touches_within(self, within_s: float) -> None:
        """``flush_touches`` until no count waits or ``within_s`` has passed (at shutdown:
        no later flush would write them). What is still held then is dropped, and logged."""
        deadline = time.monotonic() + within_s
        await self.flush_touches()
        while self._touches and time.monotonic() < deadline:
            await asyncio.sleep(TOUCH_RETRY_S)
            await self.flush_touches()
        if self._touches:
            dropped = sum(len(counts) for counts in self._touches.values())
            self._touches = {}
            log.warning(
                "recall.touches_dropped",
                memories=dropped,
                reason="their rows were held by another transaction until shutdown",
            )

    async def flush_touches(self) -> None:
        """Write the queued access counts now (also at shutdown). The counts of memories
        another transaction holds wait for the next flush (``MemoryReads.touch``)."""
        touches, self._touches = self._touches, {}
        for tenant, counts in touches.items():
            try:
                held = await self.pg.touch(tenant, counts)
            except MemstreamError as exc:
                log.warning("recall.touch_failed", error=type(exc).__name__, memories=len(counts))
                continue
            pending = self._touches.setdefault(tenant, {}) if held else {}
            for mid in held:
                pending[mid] = pending.get(mid, 0) + counts[mid]

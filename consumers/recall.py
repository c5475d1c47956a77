"""The recall responder: keyword (Postgres full-text) and vector (Qdrant) legs run
concurrently, fused by reciprocal rank fusion; either leg failing degrades to
the other, and the reply says so."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from memstream.consumers.logs import log
from memstream.pipeline.fuse import normalise, rrf
from memstream.schemas.errors import ErrorCode, ErrorInfo, ErrorReply, MemstreamError
from memstream.schemas.memory import MemoryRecord
from memstream.schemas.recall import Hit, Method, RecallReply, RecallRequest
from memstream.storage.ports import Embedder, VectorFilter, VectorIndex
from memstream.storage.postgres import OwnerFilter, PgStore

CANDIDATES_PER_LEG = 4  # each leg returns top_k * this many ids before fusion


def error_reply(code: ErrorCode, message: str) -> bytes:
    return ErrorReply(error=ErrorInfo(code=code, message=message)).model_dump_json().encode()


def hit(record: MemoryRecord, score: float) -> Hit:
    return Hit(
        id=record.id,
        text=record.content,
        type=record.type,
        scope=record.scope,
        score=round(score, 6),
        session=record.session,
        user=record.user,
        agent=record.agent,
        source_event_ids=record.source_event_ids,
        metadata=record.metadata,
        occurred_at=record.occurred_at,
        created_at=record.created_at,
    )


class RecallService:
    def __init__(self, pg: PgStore, vectors: VectorIndex, embedder: Embedder, rrf_k: int = 60):
        self.pg, self.vectors, self.embedder, self.rrf_k = pg, vectors, embedder, rrf_k
        self._background: set[asyncio.Task[Any]] = set()
        self.served = 0
        self.failed = 0

    async def _vector_leg(self, req: RecallRequest, flt: OwnerFilter, limit: int) -> list[str]:
        vector = self.embedder.embed_query(req.query)
        vflt = VectorFilter(
            tenant=flt.tenant,
            user=flt.user,
            agent=flt.agent,
            session=flt.session,
            types=tuple(flt.types),
            scopes=tuple(flt.scopes),
            now=self.pg.clock().timestamp(),
        )
        return [mid for mid, _ in await self.vectors.search(vector, vflt, limit)]

    async def _keyword_leg(self, req: RecallRequest, flt: OwnerFilter, limit: int) -> list[str]:
        return [mid for mid, _ in await self.pg.keyword_search(flt, req.query, limit)]

    async def recall(
        self, req: RecallRequest, touch: bool = True, owner: OwnerFilter | None = None
    ) -> RecallReply:
        """``owner`` replaces the request's owner scope (peer reads); ``touch``: count the
        access on the hits (own recall only)."""
        started = time.perf_counter()
        if owner is None:
            flt = OwnerFilter(
                tenant=req.tenant,
                user=req.user,
                agent=req.agent,
                session=req.session,
                types=tuple(req.types),
                scopes=tuple(req.scopes),
            )
        else:
            flt = OwnerFilter(
                tenant=owner.tenant,
                user=owner.user,
                agent=owner.agent,
                session=req.session,
                types=tuple(req.types),
                scopes=tuple(req.scopes),
                exclude_agent=owner.exclude_agent,
            )
        limit = req.top_k * CANDIDATES_PER_LEG
        legs: dict[str, Any] = {}
        if req.method in (Method.VECTOR, Method.HYBRID):
            legs["vector"] = self._vector_leg(req, flt, limit)
        if req.method in (Method.KEYWORD, Method.HYBRID):
            legs["keyword"] = self._keyword_leg(req, flt, limit)
        results = await asyncio.gather(*legs.values(), return_exceptions=True)
        rankings: dict[str, list[str]] = {}
        degraded: list[str] = []
        for name, result in zip(legs, results, strict=True):
            if isinstance(result, BaseException):
                degraded.append(name)
                log.warning("recall.leg_failed", leg=name, error=type(result).__name__)
            else:
                rankings[name] = result
        if not rankings:
            raise MemstreamError("every recall leg failed")
        searched = time.perf_counter()
        fused = normalise(rrf(rankings, k=self.rrf_k))
        records = await self.pg.get_many(flt, [mid for mid, _ in fused[:limit]])
        ranked = [
            (records[mid], s) for mid, s in fused if mid in records and s >= req.score_threshold
        ][: req.top_k]
        ranked.sort(key=lambda rs: not rs[0].pinned)  # pinned first; stable otherwise
        hits = [hit(r, s) for r, s in ranked]
        if hits and touch:
            task = asyncio.create_task(self.pg.touch(req.tenant, [h.id for h in hits]))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        done = time.perf_counter()
        return RecallReply(
            hits=hits,
            method=req.method,
            degraded=degraded,
            timings_ms={
                "search": round((searched - started) * 1000, 3),
                "total": round((done - started) * 1000, 3),
            },
        )

"""Qdrant Edge adapter: the Qdrant engine in-process, one shard in a directory.

The embedded default (no ``qdrant_url``). One point per memory, id = memory id, a named dense
vector (cosine, int8 scalar-quantized, rescored) and a sparse vector ``bm25`` (the keyword leg;
points upserted without ``sparse`` have none and never match ``search_sparse``). The payload
and the filters are laid out in ``storage/edge_layout.py`` (the owner keys there): keyword indexes
on tenant (a tenant index), the owner keys, user, agent, session, type, scope, tags; float
indexes on occurred_at and expires_at; a bool index on pinned; ``record`` stored unindexed
and handed back by ``fetch`` / ``with_records=True``.

IDF corpus (``idf_scope``): "tenant" (default) computes IDF over the tenant's points only, so
one tenant's text never moves another's scores; "owner" narrows it to the user/agent the filter
names; "collection" is collection-wide. Same options, same numbers, in the server adapter.
The adapter keeps the document frequencies itself (``ShardCounts``, storage/edge_counts.py:
counted from the shard by ``ensure`` and moved by every upsert and delete under one write
lock) and sends IDF-weighted query vectors, so the engine does a plain dot product instead of
computing a filtered IDF per query, which costs several times more on a large tenant
(docs/benchmarks.md).

Known gap: qdrant-edge-py 0.9.0 turns ``MatchValue(True)`` into the integer 1, so a bool
payload field cannot be matched; pinned is stored and indexed but ``VectorFilter`` has no
condition on it.

Durability: the shard keeps its write-ahead log on. An upsert or delete returns once the
operation is in the WAL, which the next ``load`` replays: an acknowledged write survives a
crash of the process (tested by killing one). The segments are flushed and fsynced at most
every ``flush_every_s`` seconds, after a write, and on ``close``; only an OS crash or power
loss inside that window can lose acknowledged writes (``flush_every_s=0`` flushes after every
write, which costs far more than the WAL append). Postgres stays the record of truth.

Where each engine call runs, and how its errors are translated: storage/edge_engine.py.
The searches and fetches: storage/edge_reads.py.

Segments: ``optimize`` holds the interpreter lock for as long as it builds (graphs, payload
and sparse indexes: ~0.2 ms a point here), and recall and the worker's index calls wait for
all of it. With the engine's defaults (``segment_kb=None``) it merges every segment into one,
so a run that has anything to build rebuilds the whole shard: the pause grows with the shard
(2.5 s at 12k points, 9.0 s at 48k, 33 s at 120k) while a search visits one graph. With
``segment_kb`` set (``MEMSTREAM_INDEX_SEGMENT_KB``) segments stay below it, and the writes
start an optimize each time half a segment's worth of points waits: pauses stay at about
that much building (1.3 s with 8,000 KB, at 48k as at 12k), but a search visits every
segment, which a large tenant pays (at 100k points of one tenant, 30 segments of 8,000 KB:
recall p50 17.9 against 2.9 ms). With ``segments`` (``MEMSTREAM_INDEX_SEGMENTS``, the engine's
merge target) above its default of one per CPU, an optimize builds the new points' segment
and merges small ones, leaving the large ones alone: the pause stays at about one indexing
threshold's worth of building (8: 5-6 s each 12k points, at 96k as at 24k, on a slow day),
and a search visits a few more segments. ``benchmarks/optimize_stall.py``, docs/benchmarks.md.

Existing shards: ``ensure()`` opens only a shard of this layout (dense vector, ``bm25`` without
the engine's IDF modifier, owner key fields on every point); any other shard is refused with
``ConfigurationError`` rather than answered wrongly: rebuild it from Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

import qdrant_edge as qe

from memstream.schemas.errors import ConfigurationError, MemstreamError
from memstream.storage.edge_counts import COUNTED_FIELDS, SPARSE_NAME, ShardCounts
from memstream.storage.edge_engine import CONFIG_FILE, stored_dim
from memstream.storage.edge_layout import (
    BOOL_FIELDS,
    EXACT_FIELD,
    FLOAT_FIELDS,
    KEYWORD_FIELDS,
    match_value,
    payload,
)
from memstream.storage.edge_reads import EdgeReads
from memstream.storage.ports import VERSION_FIELD, VectorPoint, sparse_pairs

__all__ = ["EdgeVectorIndex", "stored_dim"]

_DIRECT_WRITE_MAX = 16  # points per write run on the loop; larger batches go to a thread
# points converted for the engine between two yields to the event loop: about 1 ms, so a
# recall waits for one slice, not for the whole batch's conversion
_BUILD_SLICE = 16
# the engine's own indexing threshold (KB of dense vectors; 9,500 points of 256 dims stay
# unindexed through an optimize, 10,500 are indexed): what an optimize builds past
ENGINE_INDEXING_KB = 10_000
_SCAN_PAGE = 2000  # points per page when counting term statistics at load


class EdgeVectorIndex(EdgeReads):
    """``VectorIndex`` over a Qdrant Edge shard stored under ``path``: opening it, writes,
    and segments here; the reads in ``EdgeReads``, the engine calls in ``EdgeEngine``."""

    def _tuning(self) -> dict[str, Any]:
        tuning: dict[str, Any] = {"max_search_threads": self.search_threads}
        if self.quantize:
            tuning["quantization_config"] = qe.ScalarQuantizationConfig(
                type=qe.ScalarType.Int8, quantile=0.99, always_ram=True
            )
        if self.segment_kb is not None or self.segments is not None:
            tuning["optimizers"] = qe.EdgeOptimizersConfig(
                max_segment_size=self.segment_kb,
                indexing_threshold=None if self.segment_kb is None else self.segment_kb // 2,
                default_segment_number=self.segments,
            )
        return tuning

    async def ensure(self, dim: int) -> None:
        """Open (or create) the shard for ``dim``-sized vectors, its bm25 sparse vector and
        payload indexes, and count its term statistics (one scan of the shard). A shard of
        another layout is refused (``ConfigurationError``)."""
        if self._shard is not None:
            if dim != self._dim:
                raise ConfigurationError(f"index {self.path} holds {self._dim}-dim vectors")
            return
        dense = {self.vector_name: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)}
        plain = qe.EdgeSparseVectorParams()  # no modifier: IDF comes from TermStats
        config = qe.EdgeConfig(vectors=dense, sparse_vectors={SPARSE_NAME: plain}, **self._tuning())
        if not (self.path / CONFIG_FILE).exists():
            self.path.mkdir(parents=True, exist_ok=True)
            shard = await self._in_thread("create", qe.EdgeShard.create, str(self.path), config)
            self._since_optimize = 0
        else:
            persisted = self._persisted_sparse()
            if SPARSE_NAME not in persisted or (persisted[SPARSE_NAME] or {}).get("modifier"):
                raise ConfigurationError(
                    f"the index at {self.path} has another layout (its bm25 sparse vector is "
                    "missing or scored by the engine): move it away and rebuild the index "
                    "from Postgres"
                )
            shard = await self._in_thread("load", qe.EdgeShard.load, str(self.path), config)
        counts = ShardCounts(self.idf_scope)
        try:
            if not await self._in_thread("scan", self._scan, shard, counts):
                raise ConfigurationError(
                    f"the index at {self.path} holds points without owner keys (another "
                    "layout): move it away and rebuild the index from Postgres"
                )
        except MemstreamError:
            await self._in_thread("close", shard.close)
            raise
        self._counts = counts
        self._shard, self._dim = shard, dim
        if self.segment_kb is not None:  # the indexing threshold, in points of this size
            self._due_points = max(1, self.segment_kb * 1024 // 2 // (4 * dim))
        self._unbuilt = self.layout()["unindexed_points"]
        existing = set(self._call("info", shard.info).payload_schema)
        wanted: list[tuple[str, Any]] = [("tenant", qe.KeywordIndexParams(is_tenant=True))]
        wanted += [(key, qe.PayloadSchemaType.Keyword) for key in KEYWORD_FIELDS]
        wanted += [(key, qe.PayloadSchemaType.Float) for key in FLOAT_FIELDS]
        wanted += [(key, qe.PayloadSchemaType.Bool) for key in BOOL_FIELDS]
        for key, schema in wanted:
            if key not in existing:
                op = qe.UpdateOperation.create_field_index(key, schema)
                await self._in_thread("index", shard.update, op)
        self._last_flush = self._clock()

    @staticmethod
    def _scan(shard: qe.EdgeShard, counts: ShardCounts) -> bool:
        """Count every stored point into ``counts`` (blocking: run in a thread, before any
        search); False when a point lacks the owner keys (another layout's shard)."""
        offset = None
        while True:
            page = qe.ScrollRequest(
                offset=offset,
                limit=_SCAN_PAGE,
                with_payload=qe.PayloadSelector.Include([*COUNTED_FIELDS, EXACT_FIELD]),
                with_vector=[SPARSE_NAME],
            )
            records, offset = shard.scroll(page)
            counts.count_stored(records)
            if any(EXACT_FIELD not in (r.payload or {}) for r in records):
                return False
            if offset is None:
                return True

    async def _stored(self, ids: Sequence[str], tenant: str | None = None) -> list[Any]:
        """The stored points among ``ids`` (of ``tenant`` only, if given), with what the
        adapter counts (owner fields, expires_at, bm25): what an overwrite or a delete takes
        out of the counts; and their versions (``upsert``)."""
        if not ids:
            return []
        shard = self.shard
        found = await self._read(
            "retrieve",
            len(ids) <= self.direct_fetch_max,
            shard.retrieve,
            list(ids),
            qe.PayloadSelector.Include([*COUNTED_FIELDS, VERSION_FIELD]),
            [SPARSE_NAME],
        )
        if tenant is not None:
            found = [r for r in found if r.payload and r.payload.get("tenant") == tenant]
        return found

    async def _write(self, op: qe.UpdateOperation, size: int) -> None:
        shard = self.shard
        if size > _DIRECT_WRITE_MAX:
            await self._in_thread("update", shard.update, op)
        else:
            self._call("update", shard.update, op)
        if self._clock() - self._last_flush >= self.flush_every_s:
            await self._in_thread("flush", shard.flush)
            self._last_flush = self._clock()

    def _vectors(self, p: VectorPoint) -> dict[str, Any]:
        vectors: dict[str, Any] = {self.vector_name: list(p.vector)}
        if p.sparse:
            vectors[SPARSE_NAME] = qe.SparseVector(*sparse_pairs(p.sparse))
        return vectors

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite by id (vectors, payload and record all replaced); durable
        against a process crash when it returns. A point of a later version than the one
        given stays (``VectorIndex.upsert``): the versions are read with the stored points
        the counts need, under the write lock, and this process is the shard's only writer."""
        if not points:
            return
        for p in points:
            self._check(p.vector)
        self._ids([p.id for p in points])
        built: list[qe.Point] = []
        for lo in range(0, len(points), _BUILD_SLICE):
            if lo:  # converting a payload takes ~60 us: hand the loop back between slices
                await asyncio.sleep(0)
            built += [
                qe.Point(p.id, self._vectors(p), payload(p)) for p in points[lo : lo + _BUILD_SLICE]
            ]
        async with self._write_lock:  # statistics change with the write, never between
            counts = self._counts
            old = await self._stored(list(self._ids([p.id for p in points])))
            later = _later_versions(old, points)
            if later:
                kept = [i for i, p in enumerate(points) if str(uuid.UUID(p.id)) not in later]
                points, built = [points[i] for i in kept], [built[i] for i in kept]
                old = [r for r in old if str(r.id) not in later]
                if not points:
                    return
            op = qe.UpdateOperation.upsert_points(built)
            latest = {str(uuid.UUID(p.id)): p for p in points}  # the last one wins
            # new expiring points count before the write, old ones leave after it: a search
            # in between may check expiry needlessly, never skip it wrongly
            expiring = [
                (p.tenant, pid, float(p.expires_at))
                for pid, p in latest.items()
                if p.expires_at is not None
            ]
            for entry in expiring:  # a failed write leaves them counted: checks needlessly
                counts.expiring(*entry)
            await self._write(op, len(points))
            if self._since_optimize is not None:
                self._since_optimize += len(points)
            self._written(len(points))
            counts.uncount(old)
            for p in latest.values():
                counts.written(p)

    async def delete(self, tenant: str, ids: Sequence[str]) -> None:
        """Delete points of ``tenant`` by id; other tenants' points and missing ids are ignored."""
        if not ids:
            return
        given = list(self._ids(ids))
        op = qe.UpdateOperation.delete_points_by_filter(
            qe.Filter(must=[qe.HasIdCondition(set(given)), match_value("tenant", tenant)])
        )
        async with self._write_lock:
            old = await self._stored(given, tenant)
            await self._write(op, len(ids))
            self._counts.uncount(old)

    async def count(self, tenant: str | None = None) -> int:
        """Points stored, of one tenant or of all (expired ones included)."""
        flt = qe.Filter(must=[match_value("tenant", tenant)]) if tenant is not None else None
        return self._call("count", self.shard.count, qe.CountRequest(exact=True, filter=flt))

    def layout(self) -> dict[str, int]:
        """Segments, points, and points whose dense vector is not in an HNSW graph yet (recent
        writes below the engine's indexing threshold: every search scans them). The engine
        counts sparse vectors as indexed wherever they are. For benchmarks and operators."""
        info = self._call("info", self.shard.info)
        vectors = 1 + (SPARSE_NAME in self._persisted_sparse())
        unindexed = info.points_count * vectors - info.indexed_vectors_count
        return {
            "segments": info.segments_count,
            "points": info.points_count,
            "unindexed_points": max(0, unindexed),
        }

    def _written(self, n: int) -> None:
        """Start an ``optimize`` once a segment's worth of points waits for one, so that each
        builds the graph of about ``segment_kb / 2`` and holds the process for that long, not
        for what a maintenance interval's writes add up to."""
        self._unbuilt += n
        if not self._due_points or self._unbuilt < self._due_points:
            return
        if self._optimizing is None or self._optimizing.done():
            self._optimizing = asyncio.get_running_loop().create_task(self._optimize_due())

    async def _optimize_due(self) -> None:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            await self.optimize()
        except MemstreamError as exc:  # the maintenance loop's optimize tries again
            error = exc
        if self.on_optimized is not None:
            self.on_optimized(time.perf_counter() - started, error)

    def optimize_builds(self) -> bool:
        """Whether ``optimize`` would build graphs now: the points not in one have reached the
        indexing threshold (the engine's, or half of ``segment_kb``). A long pause then, for
        the process that holds the shard."""
        threshold = self.segment_kb // 2 if self.segment_kb is not None else ENGINE_INDEXING_KB
        return self._unbuilt * 4 * self._dim / 1024 >= threshold

    @property
    def optimizing(self) -> asyncio.Task[None] | None:
        """The ``optimize`` the writes started, while it runs (None otherwise)."""
        task = self._optimizing
        return task if task is not None and not task.done() else None

    async def optimize(self) -> bool:
        """Build HNSW graphs and merge segments (long blocking work, so in a thread). Searches
        work without it (exact scan of the filtered points)."""
        async with self._optimize_lock:
            waiting, written = self._unbuilt, self._since_optimize or 0
            done = await self._in_thread("optimize", self.shard.optimize)
            if done:  # the points that waited are in graphs now
                self._unbuilt = max(0, self._unbuilt - waiting)
            # what was written while it ran may sit in a new unindexed segment
            self._since_optimize = max(0, (self._since_optimize or 0) - written)
            return done

    async def close(self) -> None:
        """Flush the segments and release the shard's files (and its WAL lock)."""
        if self._optimizing is not None:  # an engine call in a thread cannot be cancelled
            with contextlib.suppress(Exception):
                await self._optimizing
        shard, self._shard = self._shard, None
        if shard is None:
            return
        try:
            await self._in_thread("flush", shard.flush)
        finally:
            await self._in_thread("close", shard.close)


def _later_versions(stored: Sequence[Any], points: Sequence[VectorPoint]) -> set[str]:
    """The ids among ``points`` whose stored point has a later version than the one given."""
    given = {str(uuid.UUID(p.id)): p.version for p in points if p.version is not None}
    return {
        str(r.id)
        for r in stored
        if (v := given.get(str(r.id))) is not None
        and isinstance(was := (r.payload or {}).get(VERSION_FIELD), int | float)
        and was > v
    }

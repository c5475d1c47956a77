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

Threads: single-point writes and fetches of up to 64 ids are cheaper than a hop to a thread,
so they run on the event loop; batches, flushes, searches and ``optimize`` run in
``asyncio.to_thread``, whose tail latency on a busy machine is what the loop must be spared.
A thread does not free the loop for the engine's time, though: qdrant-edge-py 0.9 holds the
interpreter lock through its calls (``benchmarks/engine_gil.py``: a 64-point update leaves
other threads ~11 % of it, a flush and ``optimize`` none), so the loop stalls for the whole
of a flush (~65 ms) and of an optimize that builds an index (~9 s at 20k points;
docs/benchmarks.md, "the engine holds the interpreter lock"). Searches of up to
``direct_search_max`` hits run on the loop while the shard is known to be nearly optimized
(at most ``inline_unoptimized_max`` points written since the last completed ``optimize()``;
unknown after a load): an indexed search then costs less than the thread hop's tail.
Otherwise an exact scan of unindexed segments would stall the loop, so they go to a thread
(where the hop lets other work in between calls). ``search_many`` (dedupe's batch of
neighbour searches) runs its slices of ``_SEARCH_SLICE`` queries on the loop whatever the
shard: each slice is short, and hops cost it more than they spared the loop. Each search
uses one engine thread (``search_threads=1``): the engine's own pool makes concurrent
searches contend for the cores and widens the tail. Figures: docs/benchmarks.md.

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

qdrant_edge raises bare ``Exception`` for every failure. Calls into it are wrapped here, once:
an incompatible or locked shard raises ``ConfigurationError``, anything else
``StorageUnavailable``. Wrong vector sizes and sparse indices outside 0..2**32-1 are caught
before the call (``ValueError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import qdrant_edge as qe

from memstream.schemas.errors import ConfigurationError, MemstreamError, StorageUnavailable
from memstream.storage.edge_counts import COUNTED_FIELDS, OWNER_FIELDS, SPARSE_NAME, ShardCounts
from memstream.storage.edge_layout import (
    BOOL_FIELDS,
    EXACT_FIELD,
    FLOAT_FIELDS,
    KEYWORD_FIELDS,
    edge_filter,
    match_value,
    owned_hits,
    payload,
    stored_record,
)
from memstream.storage.ports import (
    Hit,
    IdfScope,
    Record,
    RecordHit,
    VectorFilter,
    VectorPoint,
    sparse_pairs,
)

__all__ = ["EdgeVectorIndex"]

T = TypeVar("T")

_DIRECT_WRITE_MAX = 16  # points per write run on the loop; larger batches go to a thread
# points converted for the engine between two yields to the event loop: about 1 ms, so a
# recall waits for one slice, not for the whole batch's conversion
_BUILD_SLICE = 16
# queries per engine batch of ``search_many``: the engine holds the interpreter lock for its
# whole call (~80 us a query), so a recall waits for one slice (~3 ms), not a whole batch
_SEARCH_SLICE = 32
# the engine's own indexing threshold (KB of dense vectors; 9,500 points of 256 dims stay
# unindexed through an optimize, 10,500 are indexed): what an optimize builds past
ENGINE_INDEXING_KB = 10_000
_DIRECT_FETCH_MAX = 64  # ids per fetch run on the loop (cheaper than a thread hop); more go to one
_SCAN_PAGE = 2000  # points per page when counting term statistics at load
_CONFIG_FILE = "edge_config.json"
_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z").match


def stored_dim(path: Path, vector_name: str = "dense") -> int | None:
    """The dense vector size a shard under ``path`` was created with (read from its config
    file, without opening the shard, which a running worker holds); None if there is none."""
    try:
        config = json.loads((Path(path) / _CONFIG_FILE).read_text())
        return int(config["vectors"][vector_name]["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _engine_error(exc: Exception, action: str, path: Path) -> MemstreamError:
    text = str(exc)
    error: MemstreamError
    if "incompatible" in text.lower():
        error = ConfigurationError(f"Qdrant Edge shard {path} does not match: {text}")
    elif "WouldBlock" in text:
        error = ConfigurationError(f"Qdrant Edge shard {path} is open in another process")
    else:
        error = StorageUnavailable(f"Qdrant Edge {action} failed: {text}")
    return error


class EdgeVectorIndex:
    """``VectorIndex`` over a Qdrant Edge shard stored under ``path``."""

    def __init__(
        self,
        path: Path,
        vector_name: str = "dense",
        flush_every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        direct_fetch_max: int = _DIRECT_FETCH_MAX,
        direct_search_max: int = 100,
        inline_unoptimized_max: int = 10_000,
        idf_scope: IdfScope = "tenant",
        hnsw_ef: int | None = None,
        search_threads: int = 1,
        quantize: bool = True,
        segment_kb: int | None = None,
        segments: int | None = None,
        on_optimized: Callable[[float, BaseException | None], None] | None = None,
    ) -> None:
        """``hnsw_ef``: the dense search's candidate list on HNSW-indexed segments (None: the
        engine's default); lower is faster, at some cost in recall on large tenants.
        ``search_threads``: engine threads per search (1: requests run side by side instead;
        the engine's default pool makes concurrent searches contend and widens the tail).
        ``quantize``: int8 scalar quantization of the dense vectors (kept in RAM; the top hits
        are rescored with the original vectors), for a faster dense search.
        ``segment_kb``: the largest segment ``optimize`` builds, in KB of dense vectors (a
        segment's points get their HNSW graph once it holds half as much, and the writes
        start an optimize then); None: the engine's defaults, which merge every segment
        into one (see the module docstring for what each costs).
        ``segments``: how many segments the engine's merges keep (None: its default, one
        per CPU); more keep the large segments from being merged and rebuilt again.
        ``on_optimized``: told the seconds and the error (None) of each ``optimize`` started
        by the writes themselves (logs and metrics are the caller's)."""
        self.path = Path(path)
        self.segment_kb = segment_kb
        self.segments = segments
        self.on_optimized = on_optimized
        self._due_points = 0  # points written that make an optimize due (0: never by writes)
        # points not in a graph yet: written since the last optimize that built (at load,
        # the shard's count of them, which also counts points without a sparse vector)
        self._unbuilt = 0
        self._optimizing: asyncio.Task[None] | None = None
        self.hnsw_ef = hnsw_ef
        self.search_threads = search_threads
        self.quantize = quantize
        # BM25 document frequencies (IDF is applied here) and when each tenant's points
        # expire: counted at load, moved with every write
        self._counts = ShardCounts(idf_scope)
        self._write_lock = asyncio.Lock()
        self._optimize_lock = asyncio.Lock()  # a second caller waits, then finds what is left
        self.vector_name = vector_name
        self.flush_every_s = flush_every_s
        self.direct_fetch_max = direct_fetch_max
        self.direct_search_max = direct_search_max  # limit up to which a search runs inline
        self.inline_unoptimized_max = inline_unoptimized_max
        self._since_optimize: int | None = None  # points written since; None: unknown
        self.idf_scope = idf_scope
        self._clock = clock
        self._shard: qe.EdgeShard | None = None
        self._dim = 0
        self._last_flush = 0.0

    # -- engine calls, translated -------------------------------------------------------

    def _call(self, action: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except Exception as exc:  # qdrant_edge raises bare Exception for every failure
            raise _engine_error(exc, action, self.path) from exc

    async def _in_thread(self, action: str, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(self._call, action, fn, *args)

    async def _read(self, action: str, inline: bool, fn: Callable[..., T], *args: Any) -> T:
        if inline:
            return self._call(action, fn, *args)
        return await self._in_thread(action, fn, *args)

    @property
    def searches_inline(self) -> bool:
        """Whether searches run on the event loop now: only while the shard is known to be
        nearly optimized (see the module docstring)."""
        since = self._since_optimize
        return since is not None and since <= self.inline_unoptimized_max

    @property
    def shard(self) -> qe.EdgeShard:
        if self._shard is None:
            raise ConfigurationError(f"EdgeVectorIndex({self.path}) used before ensure()")
        return self._shard

    def _check(self, vector: Sequence[float]) -> None:
        self.shard  # noqa: B018 - before ensure() this raises ConfigurationError
        if len(vector) != self._dim:
            raise ValueError(f"vector has {len(vector)} dims, the index {self._dim}")

    @staticmethod
    def _ids(ids: Sequence[str]) -> dict[str, str]:
        """Canonical uuid string -> the id as given; ValueError for a non-uuid id. Ids in
        canonical form already (all of memstream's) skip the ``uuid.UUID`` round trip."""
        return {i if _CANONICAL(i) else str(uuid.UUID(i)): i for i in ids}

    def _persisted_sparse(self) -> dict[str, Any]:
        config = json.loads((self.path / _CONFIG_FILE).read_text())
        sparse = config.get("sparse_vectors") or {}
        return sparse if isinstance(sparse, dict) else {}

    # -- VectorIndex ----------------------------------------------------------------------

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
        if not (self.path / _CONFIG_FILE).exists():
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

    def may_expire(self, tenant: str, now: float | None) -> bool:
        """Whether a search of ``tenant`` at ``now`` needs the expiry condition
        (``ShardCounts.may_expire``)."""
        return self._counts.may_expire(tenant, now)

    async def _stored(self, ids: Sequence[str], tenant: str | None = None) -> list[Any]:
        """The stored points among ``ids`` (of ``tenant`` only, if given), with what the
        adapter counts (owner fields, expires_at, bm25): what an overwrite or a delete takes
        out of the counts."""
        if not ids:
            return []
        shard = self.shard
        found = await self._read(
            "retrieve",
            len(ids) <= self.direct_fetch_max,
            shard.retrieve,
            list(ids),
            qe.PayloadSelector.Include(COUNTED_FIELDS),
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
        against a process crash when it returns."""
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
        op = qe.UpdateOperation.upsert_points(built)
        async with self._write_lock:  # statistics change with the write, never between
            counts = self._counts
            old = await self._stored(list(self._ids([p.id for p in points])))
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

    async def _query(
        self, request: qe.QueryRequest, limit: int, with_records: bool, flt: VectorFilter
    ) -> list[Hit] | list[RecordHit]:
        inline = limit <= self.direct_search_max and self.searches_inline
        hits = await self._read("query", inline, self.shard.query, request)
        if with_records:
            return owned_hits(hits, flt)
        return [(str(h.id), float(h.score)) for h in hits]

    def _dense_request(
        self,
        vector: Sequence[float],
        flt: VectorFilter,
        limit: int,
        with_records: bool,
        min_score: float | None = None,
        built: dict[VectorFilter, qe.Filter] | None = None,
    ) -> qe.QueryRequest:
        """``built``: the engine filters already made for these ``VectorFilter``s (one call's
        queries share a few owners), and where to keep the ones made now."""
        self._check(vector)
        engine_filter = built.get(flt) if built is not None else None
        if engine_filter is None:
            engine_filter = edge_filter(flt, self.may_expire(flt.tenant, flt.now))
            if built is not None:
                built[flt] = engine_filter
        return qe.QueryRequest(
            limit=limit,
            score_threshold=min_score,
            query=qe.Query.Nearest(list(vector), using=self.vector_name),
            filter=engine_filter,
            params=qe.SearchParams(
                hnsw_ef=max(self.hnsw_ef, limit) if self.hnsw_ef else None,
                quantization=qe.QuantizationSearchParams(rescore=True) if self.quantize else None,
            ),
            with_payload=self._payload_wanted(with_records),
        )

    @staticmethod
    def _payload_wanted(with_records: bool) -> qe.PayloadSelector | bool:
        return qe.PayloadSelector.Include(["record", *OWNER_FIELDS]) if with_records else False

    @overload
    async def search(
        self,
        vector: Sequence[float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: Literal[False] = False,
    ) -> list[Hit]: ...

    @overload
    async def search(
        self, vector: Sequence[float], flt: VectorFilter, limit: int, *, with_records: Literal[True]
    ) -> list[RecordHit]: ...

    async def search(
        self, vector: Sequence[float], flt: VectorFilter, limit: int, *, with_records: bool = False
    ) -> list[Hit] | list[RecordHit]:
        """(memory id, cosine similarity) best first, only points matching ``flt``; with
        ``with_records=True`` each hit also carries the point's record."""
        if limit <= 0:
            self._check(vector)
            return []
        request = self._dense_request(vector, flt, limit, with_records)
        return await self._query(request, limit, with_records, flt)

    async def search_many(
        self,
        queries: Sequence[tuple[Sequence[float], VectorFilter]],
        limit: int,
        min_score: float | None = None,
    ) -> list[list[RecordHit]]:
        """``search(..., with_records=True)`` per query, as engine batches of
        ``_SEARCH_SLICE`` queries, on the event loop: the engine holds the interpreter lock
        through a call anyway, and a thread hop per slice took ~40 % of the call's wall time
        (docs/benchmarks.md, "2026-11-26, fifth session"); a recall waits for one slice."""
        if not queries or limit <= 0:
            return [[] for _ in queries]
        found: list[list[RecordHit]] = []
        built: dict[VectorFilter, qe.Filter] | None = {}
        try:
            for _, flt in queries:
                hash(flt)
        except TypeError:  # a filter with lists in it: made per query
            built = None
        for lo in range(0, len(queries), _SEARCH_SLICE):
            if lo:
                await asyncio.sleep(0)  # a recall waiting on the loop goes between slices
            part = queries[lo : lo + _SEARCH_SLICE]
            requests = [
                self._dense_request(v, flt, limit, True, min_score, built) for v, flt in part
            ]
            batches = self._call("query", self.shard.query_batch, qe.QueryBatchRequest(requests))
            found += [owned_hits(hits, flt) for (_, flt), hits in zip(part, batches, strict=True)]
        return found

    @overload
    async def search_sparse(
        self,
        sparse: Mapping[int, float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: Literal[False] = False,
    ) -> list[Hit]: ...

    @overload
    async def search_sparse(
        self,
        sparse: Mapping[int, float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: Literal[True],
    ) -> list[RecordHit]: ...

    async def search_sparse(
        self,
        sparse: Mapping[int, float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: bool = False,
    ) -> list[Hit] | list[RecordHit]:
        """(memory id, BM25 score) best first, only points matching ``flt`` that have a
        sparse vector; IDF is computed from the statistics kept here over the corpus
        ``idf_scope`` gives (``TermStats.corpus_of``)."""
        indices, values = sparse_pairs(sparse)
        self.shard  # noqa: B018 - before ensure() this raises ConfigurationError
        if limit <= 0 or not indices:
            return []
        weights = self._counts.weigh(flt, sparse)
        if not weights:
            return []  # no point of the corpus has any of the terms
        indices, values = sparse_pairs(weights)
        request = qe.QueryRequest(
            limit=limit,
            query=qe.Query.Nearest(qe.SparseVector(indices, values), using=SPARSE_NAME),
            filter=edge_filter(flt, self.may_expire(flt.tenant, flt.now)),
            with_payload=self._payload_wanted(with_records),
        )
        return await self._query(request, limit, with_records, flt)

    async def fetch(self, tenant: str, ids: Sequence[str]) -> dict[str, Record]:
        """The record of each point of ``tenant`` among ``ids`` (keys as given); missing ids
        and other tenants' points are absent."""
        given = self._ids(ids)
        if not given:
            return {}
        selector = qe.PayloadSelector.Include(["tenant", "record"])
        shard = self.shard
        found = await self._read(
            "retrieve",
            len(given) <= self.direct_fetch_max,
            shard.retrieve,
            list(given),
            selector,
            False,
        )
        records: dict[str, Record] = {}
        for r in found:
            p = r.payload  # each read of .payload converts the whole payload again: read once
            if p is not None and p.get("tenant") == tenant:
                records[given[str(r.id)]] = stored_record(p)
        return records

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

"""The reads of the Qdrant Edge adapter (``EdgeVectorIndex``, storage/qdrant_edge.py):
dense and keyword searches, dedupe's batches of neighbour searches, and fetches of records.
Where each runs (the event loop or a thread) is said in storage/edge_engine.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Literal, overload

import qdrant_edge as qe

from memstream.storage.edge_counts import OWNER_FIELDS, SPARSE_NAME
from memstream.storage.edge_engine import EdgeEngine
from memstream.storage.edge_layout import edge_filter, owned_hits, stored_record
from memstream.storage.ports import Hit, Record, RecordHit, VectorFilter, sparse_pairs

__all__ = ["EdgeReads"]

# queries per engine batch of ``search_many``: the engine holds the interpreter lock for its
# whole call (~80 us a query), so a recall waits for one slice (~3 ms), not a whole batch
_SEARCH_SLICE = 32


class EdgeReads(EdgeEngine):
    """Searches and fetches over the shard (``VectorIndex``'s reads)."""

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

"""Qdrant server adapter (``qdrant_client.AsyncQdrantClient``): production's vector index.

Same semantics as ``qdrant_edge.EdgeVectorIndex`` (one contract suite runs against both):
one point per memory, id = memory id, a named dense vector (cosine) and a sparse vector
``bm25`` with the IDF modifier; the payload is every field of ``VectorPoint`` but the vectors,
keyword indexes on tenant (``is_tenant``), user, agent, session, type, scope, tags, float
indexes on occurred_at and expires_at, a bool index on pinned, ``record`` unindexed. IDF is
computed over the tenant by default (``idf_scope``: ``IdfCorpusParams`` with the tenant or
owner filter, or ``IdfScope.GLOBAL`` for "collection"); the server must support IDF corpus
search params (qdrant-client 1.20's API). Writes use ``wait=True``: they return once the
server has applied them (and written its WAL). ``optimize()`` is a no-op: the server
optimizes in the background. ``ensure()`` on a collection without ``bm25`` adds it with
``create_vector_name``. The payload, the indexed fields and the filters a ``VectorFilter``
becomes are in storage/server_layout.py.

``url`` (+ ``api_key``) reaches a server; ``location=":memory:"`` or ``path=`` runs
qdrant-client's local mode (tests; exact search, payload indexes ignored).

Driver errors are translated here, once: no connection, timeouts and 5xx/429 answers raise
``StorageUnavailable``; a rejected API key (401/403) or a collection with another vector size
``ConfigurationError``. Anything else is a bug and propagates.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import httpx
from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from memstream.schemas.errors import ConfigurationError, StorageUnavailable
from memstream.storage.ports import (
    VERSION_FIELD,
    Hit,
    IdfScope,
    Record,
    RecordHit,
    VectorFilter,
    VectorPoint,
    sparse_pairs,
)
from memstream.storage.server_layout import (
    BOOL_FIELDS,
    FLOAT_FIELDS,
    KEYWORD_FIELDS,
    SPARSE_NAME,
    has_bm25,
    idf_corpus,
    match_value,
    payload,
    server_filter,
    stored_record,
)

__all__ = ["ServerVectorIndex"]

T = TypeVar("T")

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    ResponseHandlingException,
    httpx.TransportError,
    OSError,
    TimeoutError,
)

try:  # grpcio comes with qdrant-client; only raised when prefer_grpc=True
    from grpc import RpcError

    _UNAVAILABLE = (*_UNAVAILABLE, RpcError)
except ImportError:  # pragma: no cover
    pass


class ServerVectorIndex:
    """``VectorIndex`` over one collection of a Qdrant server (or qdrant-client local mode)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        collection: str = "memories",
        *,
        location: str | None = None,
        path: Path | None = None,
        vector_name: str = "dense",
        timeout: int = 10,
        check_compatibility: bool = True,
        idf_scope: IdfScope = "tenant",
        dim: int = 0,
    ) -> None:
        """``dim``: the dense size, when known before ``ensure()`` (a worker that starts while
        the server is down searches, fails with ``StorageUnavailable`` and degrades, instead of
        refusing to start)."""
        if url is not None:
            self._client = AsyncQdrantClient(
                url=url,
                api_key=api_key,
                timeout=timeout,
                check_compatibility=check_compatibility,  # warns from a thread on mismatch
            )
        elif path is not None:
            self._client = AsyncQdrantClient(path=str(path))
        else:
            self._client = AsyncQdrantClient(location=location or ":memory:")
        self.collection = collection
        self.vector_name = vector_name
        self.idf_scope = idf_scope
        self._dim = dim

    async def _call(self, action: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except UnexpectedResponse as exc:
            if exc.status_code in (401, 403):
                raise ConfigurationError(f"Qdrant refused the API key ({action})") from exc
            if exc.status_code is not None and (exc.status_code >= 500 or exc.status_code == 429):
                raise StorageUnavailable(f"Qdrant {action}: HTTP {exc.status_code}") from exc
            raise
        except _UNAVAILABLE as exc:
            raise StorageUnavailable(f"Qdrant {action} failed: {type(exc).__name__}") from exc

    def _check(self, vector: Sequence[float]) -> None:
        if len(vector) != self._dim:
            raise ValueError(f"vector has {len(vector)} dims, the index {self._dim}")

    async def ensure(self, dim: int) -> None:
        """Create the collection (dense + bm25 sparse vector) and its payload indexes if
        missing; check the vector size. A collection of the previous version (no bm25) gets
        the sparse vector added in place; its points have none until upserted again."""
        name, client = self.collection, self._client
        if not await self._call("collection_exists", client.collection_exists(name)):
            params = models.VectorParams(size=dim, distance=models.Distance.COSINE)
            bm25 = models.SparseVectorParams(modifier=models.Modifier.IDF)
            try:
                await self._call(
                    "create_collection",
                    client.create_collection(
                        name,
                        vectors_config={self.vector_name: params},
                        sparse_vectors_config={SPARSE_NAME: bm25},
                    ),
                )
            except UnexpectedResponse as exc:  # another worker created it first
                if exc.status_code != 409:
                    raise
        info = await self._call("get_collection", client.get_collection(name))
        vectors = info.config.params.vectors
        existing = vectors.get(self.vector_name) if isinstance(vectors, dict) else None
        if existing is None or existing.size != dim:
            raise ConfigurationError(
                f"collection {name!r} has no {dim}-dim vector named {self.vector_name!r}"
            )
        if not has_bm25(info):
            await self._add_bm25()
        self._dim = dim
        wanted: list[tuple[str, models.PayloadSchemaType | models.KeywordIndexParams]] = [
            (
                "tenant",
                models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
            )
        ]
        wanted += [(key, models.PayloadSchemaType.KEYWORD) for key in KEYWORD_FIELDS]
        wanted += [(key, models.PayloadSchemaType.FLOAT) for key in FLOAT_FIELDS]
        wanted += [(key, models.PayloadSchemaType.BOOL) for key in BOOL_FIELDS]
        for key, schema in wanted:
            if key not in info.payload_schema:
                await self._call(
                    "create_payload_index",
                    client.create_payload_index(name, key, field_schema=schema, wait=True),
                )

    async def _add_bm25(self) -> None:
        config = models.SparseVectorNameConfig(
            sparse=models.SparseVectorConfig(modifier=models.Modifier.IDF)
        )
        try:
            await self._call(
                "create_vector_name",
                self._client.create_vector_name(self.collection, SPARSE_NAME, config, wait=True),
            )
        except (UnexpectedResponse, ValueError):  # another worker may have added it first
            info = await self._call("get_collection", self._client.get_collection(self.collection))
            if not has_bm25(info):
                raise

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite by id (vectors, payload and record all replaced); applied on
        the server when it returns. A stored point of a later version stays
        (``VectorIndex.upsert``): the points of each version go in one operation whose
        ``update_filter`` leaves later ones alone (a new point is inserted whatever the filter
        says), all operations in one request. Processes anywhere may write the same point,
        so the check is the server's, not a read before the write."""
        if not points:
            return
        by_version: dict[float | None, list[models.PointStruct]] = {}
        for p in points:
            self._check(p.vector)
            vectors: dict[str, Any] = {self.vector_name: list(p.vector)}
            if p.sparse:
                indices, values = sparse_pairs(p.sparse)
                vectors[SPARSE_NAME] = models.SparseVector(indices=indices, values=values)
            by_version.setdefault(p.version, []).append(
                models.PointStruct(id=str(uuid.UUID(p.id)), vector=vectors, payload=payload(p))
            )
        ops = [
            models.UpsertOperation(
                upsert=models.PointsList(points=structs, update_filter=_not_later_than(version))
            )
            for version, structs in by_version.items()
        ]
        await self._call(
            "upsert", self._client.batch_update_points(self.collection, ops, wait=True)
        )

    async def _query(
        self, action: str, with_records: bool, **query: Any
    ) -> list[Hit] | list[RecordHit]:
        response = await self._call(
            action,
            self._client.query_points(
                self.collection, with_payload=["record"] if with_records else False, **query
            ),
        )
        if with_records:
            return [(str(p.id), float(p.score), stored_record(p.payload)) for p in response.points]
        return [(str(p.id), float(p.score)) for p in response.points]

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
        self._check(vector)
        if limit <= 0:
            return []
        return await self._query(
            "query_points",
            with_records,
            query=list(vector),
            using=self.vector_name,
            query_filter=server_filter(flt),
            limit=limit,
        )

    async def search_many(
        self,
        queries: Sequence[tuple[Sequence[float], VectorFilter]],
        limit: int,
        min_score: float | None = None,
    ) -> list[list[RecordHit]]:
        """``search(..., with_records=True)`` per query, in order, in one batch request."""
        for v, _ in queries:
            self._check(v)
        if limit <= 0 or not queries:
            return [[] for _ in queries]
        requests = [
            models.QueryRequest(
                query=list(v),
                using=self.vector_name,
                filter=server_filter(flt),
                limit=limit,
                score_threshold=min_score,
                with_payload=["record"],
            )
            for v, flt in queries
        ]
        responses = await self._call(
            "query_batch_points", self._client.query_batch_points(self.collection, requests)
        )
        return [
            [(str(p.id), float(p.score), stored_record(p.payload)) for p in r.points]
            for r in responses
        ]

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
        sparse vector; IDF is computed over ``idf_corpus(flt, self.idf_scope)``."""
        indices, values = sparse_pairs(sparse)
        if limit <= 0 or not indices:
            return []
        return await self._query(
            "query_points",
            with_records,
            query=models.SparseVector(indices=indices, values=values),
            using=SPARSE_NAME,
            query_filter=server_filter(flt),
            search_params=self._idf_params(flt),
            limit=limit,
        )

    def _idf_params(self, flt: VectorFilter) -> models.SearchParams:
        corpus = idf_corpus(flt, self.idf_scope)
        if corpus is None:
            return models.SearchParams(idf=models.IdfScope.GLOBAL)
        return models.SearchParams(idf=models.IdfCorpusParams(corpus=corpus))

    async def fetch(self, tenant: str, ids: Sequence[str]) -> dict[str, Record]:
        """The record of each point of ``tenant`` among ``ids`` (keys as given); missing ids
        and other tenants' points are absent."""
        given = {str(uuid.UUID(i)): i for i in ids}  # ValueError for a non-uuid id
        if not given:
            return {}
        found = await self._call(
            "retrieve",
            self._client.retrieve(
                self.collection, list(given), with_payload=["tenant", "record"], with_vectors=False
            ),
        )
        return {
            given[str(r.id)]: stored_record(r.payload)
            for r in found
            if r.payload is not None and r.payload.get("tenant") == tenant
        }

    async def delete(self, tenant: str, ids: Sequence[str]) -> None:
        """Delete points of ``tenant`` by id; other tenants' points and missing ids are ignored."""
        if not ids:
            return
        has_id = models.HasIdCondition(has_id=[str(uuid.UUID(i)) for i in ids])
        selector = models.FilterSelector(
            filter=models.Filter(must=[has_id, match_value("tenant", tenant)])
        )
        await self._call("delete", self._client.delete(self.collection, selector, wait=True))

    @property
    def searches_inline(self) -> bool:
        """Never: every search is a call to the server (recall overlaps its two legs)."""
        return False

    async def count(self, tenant: str | None = None) -> int:
        """Points stored, of one tenant or of all (expired ones included)."""
        flt = models.Filter(must=[match_value("tenant", tenant)]) if tenant is not None else None
        result = await self._call(
            "count", self._client.count(self.collection, count_filter=flt, exact=True)
        )
        return result.count

    async def stored_dim(self) -> int | None:
        """The collection's dense vector size; None when the collection does not exist."""
        name = self.collection
        if not await self._call("collection_exists", self._client.collection_exists(name)):
            return None
        info = await self._call("get_collection", self._client.get_collection(name))
        vectors = info.config.params.vectors
        existing = vectors.get(self.vector_name) if isinstance(vectors, dict) else None
        return None if existing is None else existing.size

    async def optimize(self) -> bool:
        """Nothing to do: the server optimizes segments in the background. Always False."""
        return False

    async def close(self) -> None:
        """Close the client's connections (local mode: its files)."""
        await self._client.close()


def _not_later_than(version: float | None) -> models.Filter | None:
    """The stored points an upsert of ``version`` may overwrite: those without a later one
    (a point without a version overwrites any)."""
    if version is None:
        return None
    later = models.FieldCondition(key=VERSION_FIELD, range=models.Range(gt=version))
    return models.Filter(must_not=[later])

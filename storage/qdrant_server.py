"""Qdrant server adapter (``qdrant_client.AsyncQdrantClient``): production's vector index.

Same semantics as ``qdrant_edge.EdgeVectorIndex`` (one contract suite runs against both):
one point per memory, id = memory id, one named dense vector (cosine), the payload is every
field of ``VectorPoint`` but the vector, keyword indexes on tenant (``is_tenant``), user,
agent, session, type, scope and float indexes on occurred_at and expires_at. Writes use
``wait=True``: they return once the server has applied them (and written its WAL).

``url`` (+ ``api_key``) reaches a server; ``location=":memory:"`` or ``path=`` runs
qdrant-client's local mode (tests; exact search, payload indexes ignored).

Driver errors are translated here, once: no connection, timeouts and 5xx/429 answers raise
``StorageUnavailable``; a rejected API key (401/403) or a collection with another vector size
``ConfigurationError``. Anything else is a bug and propagates.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
from qdrant_client import AsyncQdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from memstream.schemas.errors import ConfigurationError, StorageUnavailable
from memstream.storage.ports import VectorFilter, VectorPoint

__all__ = ["ServerVectorIndex"]

T = TypeVar("T")

KEYWORD_FIELDS = ("user", "agent", "session", "type", "scope")
FLOAT_FIELDS = ("occurred_at", "expires_at")
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


def payload(p: VectorPoint) -> dict[str, Any]:
    """Everything in the point but the vector; absent values are stored as null."""
    return {
        "tenant": p.tenant,
        "user": p.user,
        "agent": p.agent,
        "session": p.session,
        "type": p.type.value,
        "scope": p.scope.value,
        "occurred_at": p.occurred_at,
        "expires_at": p.expires_at,
    }


def _match(key: str, value: str) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


def server_filter(flt: VectorFilter) -> models.Filter:
    """Tenant always; user/agent/session/types/scopes narrow; expired points are hidden."""
    must: list[models.Condition] = [_match("tenant", flt.tenant)]
    for key, value in (("user", flt.user), ("agent", flt.agent), ("session", flt.session)):
        if value is not None:
            must.append(_match(key, value))
    if flt.types:
        any_type = models.MatchAny(any=[t.value for t in flt.types])
        must.append(models.FieldCondition(key="type", match=any_type))
    if flt.scopes:
        any_scope = models.MatchAny(any=[s.value for s in flt.scopes])
        must.append(models.FieldCondition(key="scope", match=any_scope))
    must_not: list[models.Condition] = []
    if flt.now is not None:  # a null or missing expires_at never matches the range: kept
        expired = models.Range(lte=flt.now)
        must_not.append(models.FieldCondition(key="expires_at", range=expired))
    return models.Filter(must=must, must_not=must_not or None)


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
    ) -> None:
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
        self._dim = 0

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
        """Create the collection and its payload indexes if missing; check the vector size."""
        name, client = self.collection, self._client
        if not await self._call("collection_exists", client.collection_exists(name)):
            params = models.VectorParams(size=dim, distance=models.Distance.COSINE)
            try:
                await self._call(
                    "create_collection",
                    client.create_collection(name, vectors_config={self.vector_name: params}),
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
        self._dim = dim
        wanted: list[tuple[str, models.PayloadSchemaType | models.KeywordIndexParams]] = [
            (
                "tenant",
                models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
            )
        ]
        wanted += [(key, models.PayloadSchemaType.KEYWORD) for key in KEYWORD_FIELDS]
        wanted += [(key, models.PayloadSchemaType.FLOAT) for key in FLOAT_FIELDS]
        for key, schema in wanted:
            if key not in info.payload_schema:
                await self._call(
                    "create_payload_index",
                    client.create_payload_index(name, key, field_schema=schema, wait=True),
                )

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite by id; applied on the server when it returns."""
        if not points:
            return
        structs = []
        for p in points:
            self._check(p.vector)
            structs.append(
                models.PointStruct(
                    id=str(uuid.UUID(p.id)),
                    vector={self.vector_name: list(p.vector)},
                    payload=payload(p),
                )
            )
        await self._call("upsert", self._client.upsert(self.collection, structs, wait=True))

    async def search(
        self, vector: Sequence[float], flt: VectorFilter, limit: int
    ) -> list[tuple[str, float]]:
        """(memory id, cosine similarity) best first, only points matching ``flt``."""
        self._check(vector)
        if limit <= 0:
            return []
        response = await self._call(
            "query_points",
            self._client.query_points(
                self.collection,
                query=list(vector),
                using=self.vector_name,
                query_filter=server_filter(flt),
                limit=limit,
                with_payload=False,
            ),
        )
        return [(str(p.id), float(p.score)) for p in response.points]

    async def delete(self, tenant: str, ids: Sequence[str]) -> None:
        """Delete points of ``tenant`` by id; other tenants' points and missing ids are ignored."""
        if not ids:
            return
        has_id = models.HasIdCondition(has_id=[str(uuid.UUID(i)) for i in ids])
        selector = models.FilterSelector(
            filter=models.Filter(must=[has_id, _match("tenant", tenant)])
        )
        await self._call("delete", self._client.delete(self.collection, selector, wait=True))

    async def count(self, tenant: str | None = None) -> int:
        """Points stored, of one tenant or of all (expired ones included)."""
        flt = models.Filter(must=[_match("tenant", tenant)]) if tenant is not None else None
        result = await self._call(
            "count", self._client.count(self.collection, count_filter=flt, exact=True)
        )
        return result.count

    async def close(self) -> None:
        """Close the client's connections (local mode: its files)."""
        await self._client.close()

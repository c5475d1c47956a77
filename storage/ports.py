"""The small Protocols the workers depend on. Adapters live beside this module."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, overload

from memstream.schemas.memory import MemoryType, Scope

Record = Mapping[str, Any]  # an opaque JSON-able dict stored with a point, returned as JSON
Hit = tuple[str, float]  # (memory id, score)
RecordHit = tuple[str, float, Record]  # (memory id, score, the point's record)

IdfScope = Literal["tenant", "owner", "collection"]  # the points BM25's IDF is computed over
SPARSE_INDEX_MAX = 2**32 - 1  # sparse indices are unsigned 32-bit integers in Qdrant


@dataclass(frozen=True, slots=True)
class VectorPoint:
    """One point per memory: the point id is the memory id (a uuid string).

    ``sparse`` maps term-hash indices (0 <= i < 2**32) to BM25 document term weights; a point
    without it (``None`` or empty) has no keyword vector and never matches ``search_sparse``.
    ``record`` is stored unindexed and handed back by ``fetch`` and ``with_records=True``.
    ``version``: when the memory's row was last changed (unix seconds, its ``updated_at``);
    an upsert never replaces a stored point of a later version (``VectorIndex.upsert``).
    """

    id: str
    vector: list[float]
    tenant: str
    user: str | None
    agent: str | None
    session: str
    type: MemoryType
    scope: Scope
    occurred_at: float  # unix seconds
    expires_at: float | None = None  # unix seconds
    sparse: Mapping[int, float] | None = None
    record: Record = field(default_factory=dict)
    pinned: bool = False
    tags: Sequence[str] = ()
    project: str | None = None
    version: float | None = None


@dataclass(frozen=True, slots=True)
class VectorFilter:
    """Tenant is mandatory. Whose points match (docs/memory-model.md):

    - ``user`` and/or ``agent`` set: the owner exactly (both equal; an unset one matches
      only points without it). ``shared``: also the tenant's ``global`` points and the
      ``project`` points of ``project``, whoever owns them (reads, never writes).
    - ``peer``: agent-owned points only (no user), of ``agent`` if set, never of
      ``exclude_agent``.
    - neither: the whole tenant (internal readers: reindexing, dedupe by id).

    Every other field narrows (AND); ``None``/empty = no condition."""

    tenant: str
    user: str | None = None
    agent: str | None = None
    project: str | None = None
    shared: bool = False
    peer: bool = False
    session: str | None = None
    types: Sequence[MemoryType] = field(default_factory=tuple)
    scopes: Sequence[Scope] = field(default_factory=tuple)
    now: float | None = None  # hide points whose expires_at <= now
    occurred_from: float | None = None  # occurred_at >= this (unix seconds)
    occurred_to: float | None = None  # occurred_at <= this (unix seconds)
    tags: Sequence[str] = ()  # the point's tags contain every one of these
    exclude_agent: str | None = None  # with ``peer``: every agent but this one


class VectorIndex(Protocol):
    """A vector index over memories: a dense (cosine) and a keyword (BM25) leg, with records
    in the payload so recall needs no other read. Every method is idempotent."""

    @property
    def searches_inline(self) -> bool:
        """Whether searches run on the caller's event loop now (no thread or network hop):
        recall then runs its two legs one after the other instead of side by side."""

    async def ensure(self, dim: int) -> None:
        """Create the collection and its payload indexes if missing (or add what is missing)."""

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite points by id: replaying an upsert changes nothing. A point
        whose stored version is later than the one given is left as it is: the writers of one
        memory's point (store stages in several processes, a command, the reconciler) each
        build it from the row they read, and the older build may arrive last. A point without
        a version is written as it is."""

    @overload
    async def search(
        self,
        vector: Sequence[float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: Literal[False] = False,
    ) -> list[Hit]:
        """(memory id, cosine similarity) best first, only points matching ``flt``; with
        ``with_records=True`` each hit also carries the point's record (same call).

        The Qdrant Edge adapter matches the owner on an 88-bit hash: without records, a
        hash collision could add another owner's id (never found in practice; a second
        preimage is needed), so readers re-check the owner of each record they use (``fetch``
        checks the tenant); with records the adapter checks it exactly itself."""

    @overload
    async def search(
        self, vector: Sequence[float], flt: VectorFilter, limit: int, *, with_records: Literal[True]
    ) -> list[RecordHit]: ...

    async def search_many(
        self,
        queries: Sequence[tuple[Sequence[float], VectorFilter]],
        limit: int,
        min_score: float | None = None,
    ) -> list[list[RecordHit]]:
        """``search(vector, flt, limit, with_records=True)`` for each query, in order, as one
        batch where the engine has one (the dedupe stage's neighbours of a whole batch).
        ``min_score``: only hits at least that similar (the engine skips the others' records:
        dedupe wants none below its near-duplicate threshold, and most queries have none)."""
        ...

    @overload
    async def search_sparse(
        self,
        sparse: Mapping[int, float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: Literal[False] = False,
    ) -> list[Hit]:
        """(memory id, BM25 score) best first over the points' ``sparse`` vectors, only points
        matching ``flt``; ``sparse`` maps term-hash indices to query weights, IDF is applied
        by the index. ``with_records=True`` as in ``search``."""

    @overload
    async def search_sparse(
        self,
        sparse: Mapping[int, float],
        flt: VectorFilter,
        limit: int,
        *,
        with_records: Literal[True],
    ) -> list[RecordHit]: ...

    async def fetch(self, tenant: str, ids: Sequence[str]) -> dict[str, Record]:
        """The record of each point of ``tenant`` among ``ids``; others are absent."""

    async def delete(self, tenant: str, ids: Sequence[str]) -> None:
        """Delete points of ``tenant`` by id; missing ids are ignored."""

    async def count(self, tenant: str | None = None) -> int:
        """Points stored, of one tenant or of all (expired ones included)."""

    async def optimize(self) -> bool:
        """Build indexes and merge segments where the engine leaves that to the caller;
        True if anything changed."""

    async def close(self) -> None:
        """Release files and connections."""


class Embedder(Protocol):
    """Text to unit-length vectors. Pure CPU; thread-safe for reads."""

    @property
    def dim(self) -> int: ...

    @property
    def model_id(self) -> str:
        """A short name of the model (``storage.embedding.model_id``): a vector carried from
        another process is used only when that process's model made it."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, L2-normalised."""

    def embed_query(self, text: str) -> list[float]:
        """One query vector."""


def visible(
    flt: VectorFilter, user: str | None, agent: str | None, scope: str, project: str | None
) -> bool:
    """Whether a point of the filter's tenant with this owner, scope and project is one
    ``flt`` may read (the owner rules above, as the adapters' filters apply them). Readers
    re-check the records they use with it."""
    if flt.peer:
        return (
            user is None
            and agent is not None
            and (flt.agent is None or agent == flt.agent)
            and agent != flt.exclude_agent
        )
    if flt.user is None and flt.agent is None:
        return True
    if user == flt.user and agent == flt.agent:
        return True
    return flt.shared and (
        scope == "global" or (scope == "project" and project is not None and project == flt.project)
    )


def sparse_pairs(sparse: Mapping[int, float]) -> tuple[list[int], list[float]]:
    """(indices, values) of a sparse vector, indices ascending; an index outside the engines'
    unsigned 32-bit range is a bug in the caller: ValueError, before any storage call."""
    indices = sorted(sparse)
    if indices and (indices[0] < 0 or indices[-1] > SPARSE_INDEX_MAX):
        raise ValueError(f"sparse indices must be in 0..{SPARSE_INDEX_MAX}")
    return indices, [float(sparse[i]) for i in indices]


VERSION_FIELD = "version"  # the payload field of ``VectorPoint.version``


def payload_fields(p: VectorPoint) -> dict[str, Any]:
    """The fields of ``p`` both adapters store as its payload, absent values as null: all but
    the vectors and the record, whose form each adapter picks."""
    return {
        "tenant": p.tenant,
        "user": p.user,
        "agent": p.agent,
        "session": p.session,
        "type": p.type.value,
        "scope": p.scope.value,
        "project": p.project,
        "occurred_at": p.occurred_at,
        "expires_at": p.expires_at,
        "pinned": p.pinned,
        "tags": list(p.tags),
        VERSION_FIELD: p.version,
    }

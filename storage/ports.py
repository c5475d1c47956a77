"""The small Protocols the workers depend on. Adapters live beside this module."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from memstream.schemas.memory import MemoryType, Scope


@dataclass(frozen=True, slots=True)
class VectorPoint:
    """One point per memory: the point id is the memory id (a uuid string)."""

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


@dataclass(frozen=True, slots=True)
class VectorFilter:
    """Tenant is mandatory; every other field narrows (AND). ``None`` = no condition."""

    tenant: str
    user: str | None = None
    agent: str | None = None
    session: str | None = None
    types: Sequence[MemoryType] = field(default_factory=tuple)
    scopes: Sequence[Scope] = field(default_factory=tuple)
    now: float | None = None  # hide points whose expires_at <= now


class VectorIndex(Protocol):
    """A vector index over memories. Every method is idempotent."""

    async def ensure(self, dim: int) -> None:
        """Create the collection and its payload indexes if missing."""

    async def upsert(self, points: Sequence[VectorPoint]) -> None:
        """Insert or overwrite points by id: replaying an upsert changes nothing."""

    async def search(
        self, vector: Sequence[float], flt: VectorFilter, limit: int
    ) -> list[tuple[str, float]]:
        """(memory id, cosine similarity) best first, only points matching ``flt``."""

    async def delete(self, tenant: str, ids: Sequence[str]) -> None:
        """Delete points of ``tenant`` by id; missing ids are ignored."""

    async def close(self) -> None:
        """Release files and connections."""


class Embedder(Protocol):
    """Text to unit-length vectors. Pure CPU; thread-safe for reads."""

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, L2-normalised."""

    def embed_query(self, text: str) -> list[float]:
        """One query vector."""

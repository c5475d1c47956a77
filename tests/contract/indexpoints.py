"""Points, vectors and adapter factories for the VectorIndex contract (the test_vector_index_*
modules; their fixtures are in conftest.py): Qdrant Edge in a temp dir and the server adapter over
qdrant-client's local mode (no Qdrant server runs here)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest

from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.ports import VectorFilter, VectorIndex, VectorPoint
from memstream.storage.qdrant_edge import EdgeVectorIndex
from memstream.storage.qdrant_server import ServerVectorIndex

# qdrant-client's local mode warns that payload indexes do nothing there (exact search);
# the adapter creates them for real servers, so the warning is expected in these suites.
LOCAL_MODE = pytest.mark.filterwarnings(
    "ignore:Payload indexes have no effect in the local Qdrant:UserWarning"
)

NOW = 1_800_000_000.0
DIM = 8

Factory = Callable[..., VectorIndex]


def edge_factory(path: Path) -> Callable[..., EdgeVectorIndex]:
    return lambda **kw: EdgeVectorIndex(path / "shard", **kw)


def local_factory(path: Path) -> Factory:
    return lambda **kw: ServerVectorIndex(collection="memories", path=path / "local", **kw)


def axis(i: int, wobble: float = 0.0) -> list[float]:
    """A unit-ish vector along axis ``i``, tilted towards the next axis by ``wobble``."""
    v = [0.0] * DIM
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = wobble
    return v


WORD = 7  # the term every test point holds unless told otherwise: a sparse query for it
# matches them all, so every filter test runs against both legs


def point(vector: list[float], **kw: Any) -> VectorPoint:
    fields: dict[str, Any] = {
        "sparse": {WORD: 1.0},
        "id": str(uuid.uuid4()),
        "tenant": "acme",
        "user": "ann",
        "agent": "bot",
        "session": "s1",
        "type": MemoryType.FACT,
        "scope": Scope.USER,
        "occurred_at": NOW - 60,
        "expires_at": None,
    }
    fields.update(kw)
    return VectorPoint(vector=vector, **fields)


Leg = Literal["dense", "sparse"]


async def ids(
    index: VectorIndex, flt: VectorFilter, vector: list[float] | None = None, leg: Leg = "dense"
) -> set[str]:
    if leg == "sparse":
        return {i for i, _ in await index.search_sparse({WORD: 1.0}, flt, 100)}
    return {i for i, _ in await index.search(vector or axis(0), flt, 100)}


def bm25_idf(df: int, n: int) -> float:
    """The IDF both engines apply (Qdrant's modifier): ln((n - df + 0.5) / (df + 0.5) + 1)."""
    return math.log((n - df + 0.5) / (df + 0.5) + 1)

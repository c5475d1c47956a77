"""Recall reads hit records from the index in pages: top_k plus a small margin first, more
only while the collapse of covered hits leaves top_k unfilled (a real Qdrant Edge shard)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import qdrant_edge as qe

from memstream.consumers.recall import RecallService
from memstream.consumers.services import Services
from memstream.schemas.memory import MemoryType, Scope
from memstream.schemas.recall import RecallRequest
from memstream.schemas.settings import Settings
from memstream.storage.edge_layout import owner_payload
from memstream.storage.memory import MemoryStore
from memstream.storage.ports import VectorFilter, VectorPoint
from memstream.storage.qdrant_edge import EdgeVectorIndex

ANN = VectorFilter(tenant="acme", user="ann")


class Counting(EdgeVectorIndex):
    fetched: list[int]

    async def fetch(self, tenant, ids):
        self.fetched.append(len(ids))
        return await super().fetch(tenant, ids)


@pytest.fixture
async def index(tmp_path: Path) -> AsyncIterator[Counting]:
    idx = Counting(tmp_path / "shard")
    idx.fetched = []
    await idx.ensure(4)
    yield idx
    await idx.close()


def record(mid: str, source: str) -> dict[str, object]:
    return {
        "id": mid,
        "text": f"memory {mid}",
        "type": "fact",
        "scope": "user",
        "session": "s",
        "user": "ann",
        "agent": None,
        "source_event_ids": [source],
        "occurred_at": "2026-01-01T00:00:00+00:00",
        "created_at": "2026-01-01T00:00:00+00:00",
    }


async def store(index: EdgeVectorIndex, sources: list[str]) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in sources]
    await index.upsert(
        [
            VectorPoint(
                id=mid,
                vector=[1.0, 0.0, 0.0, 0.0],
                tenant="acme",
                user="ann",
                agent=None,
                session="s",
                type=MemoryType.FACT,
                scope=Scope.USER,
                occurred_at=0.0,
                record=record(mid, src),
            )
            for mid, src in zip(ids, sources, strict=True)
        ]
    )
    return ids


def service(index: Counting) -> RecallService:
    """Recall over ``index``; only the index is read (no embedder, no redactor)."""
    services = Services(Settings(), MemoryStore(), index, None, None)  # type: ignore[arg-type]
    return RecallService(services)


def ranked(ids: list[str]) -> list[tuple[str, float]]:
    return [(m, 1 - i / 100) for i, m in enumerate(ids)]


async def test_one_page_when_nothing_collapses(index: Counting) -> None:
    """Distinct memories fill top_k from the first page fetched."""
    ids = await store(index, [f"e{i}" for i in range(30)])
    svc = service(index)
    req = RecallRequest(tenant="acme", user="ann", query="q", top_k=5)
    hits, truncated = await svc._select_fetched(req, ranked(ids), ANN)
    assert [h.id for h in hits] == ids[:5] and not truncated
    assert index.fetched == [7]


async def test_more_pages_while_the_collapse_drops_hits(index: Counting) -> None:
    """The first 15 memories all come from one event: 14 of them add nothing."""
    ids = await store(index, ["same"] * 15 + [f"e{i}" for i in range(15)])
    svc = service(index)
    req = RecallRequest(tenant="acme", user="ann", query="q", top_k=5)
    hits, _ = await svc._select_fetched(req, ranked(ids), ANN)
    assert [h.id for h in hits] == [ids[0], *ids[15:19]]
    assert index.fetched == [7, 5, 5, 5]


async def test_paging_stops_below_the_threshold(index: Counting) -> None:
    """No further page is fetched once candidates fall below the score threshold."""
    ids = await store(index, ["same"] * 20)
    svc = service(index)
    req = RecallRequest(tenant="acme", user="ann", query="q", top_k=5, score_threshold=0.5)
    scored = [(m, 0.9 if i < 3 else 0.1) for i, m in enumerate(ids)]
    hits, _ = await svc._select_fetched(req, scored, ANN)
    assert [h.id for h in hits] == [ids[0]]
    assert index.fetched == [7]


async def test_a_record_of_another_owner_is_dropped_whatever_the_index_returns(
    index: Counting,
) -> None:
    """The Edge owner condition is an 88-bit hash: recall re-checks the owner of every record
    it returns, and a search with records checks it itself. Simulated by giving ann's point
    bob's owner keys in the shard: bob's id-only search finds it, his search with records and
    his recall do not; given both ids, ann's recall keeps both (the records are hers)."""
    mine, theirs = await store(index, ["e1", "e2"])
    op = qe.UpdateOperation.set_payload([theirs], owner_payload("acme", "bob", None))
    index.shard.update(op)
    bob = VectorFilter(tenant="acme", user="bob")
    axis = [1.0, 0.0, 0.0, 0.0]
    assert [m for m, _ in await index.search(axis, bob, 5)] == [theirs]
    assert await index.search(axis, bob, 5, with_records=True) == []
    assert await index.search_sparse({1: 1.0}, bob, 5, with_records=True) == []
    found = await index.search(axis, ANN, 5, with_records=True)
    assert [m for m, _, _ in found] == [mine]  # theirs carries bob's keys now
    svc = service(index)
    req = RecallRequest(tenant="acme", user="bob", query="q", top_k=5)
    hits, _ = await svc._select_fetched(req, ranked([theirs]), bob)
    assert hits == []
    hits, _ = await svc._select_fetched(req, ranked([mine, theirs]), ANN)
    assert [h.id for h in hits] == [mine, theirs]

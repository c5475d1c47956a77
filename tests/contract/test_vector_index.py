"""One contract for every VectorIndex adapter: Qdrant Edge in a temp dir and the server
adapter over qdrant-client's local mode (no Qdrant server runs here)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from memstream.schemas.errors import ConfigurationError, StorageUnavailable
from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.ports import VectorFilter, VectorIndex, VectorPoint
from memstream.storage.qdrant_edge import EdgeVectorIndex
from memstream.storage.qdrant_server import ServerVectorIndex

pytestmark = [
    # qdrant-client's local mode warns that payload indexes do nothing there (exact search);
    # the adapter creates them for real servers, so the warning is expected in this suite.
    pytest.mark.filterwarnings(
        "ignore:Payload indexes have no effect in the local Qdrant:UserWarning"
    ),
]

NOW = 1_800_000_000.0
DIM = 8

Factory = Callable[[], VectorIndex]


def edge_factory(path: Path) -> Factory:
    return lambda: EdgeVectorIndex(path / "shard")


def local_factory(path: Path) -> Factory:
    return lambda: ServerVectorIndex(collection="memories", path=path / "local")


@pytest.fixture(params=["edge", "server-local"])
def make_index(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    """Makes instances of one adapter, all over the same storage in a temp dir."""
    factory = edge_factory if request.param == "edge" else local_factory
    return factory(tmp_path)


@pytest.fixture
async def index(make_index: Factory) -> AsyncIterator[VectorIndex]:
    idx = make_index()
    await idx.ensure(DIM)
    yield idx
    await idx.close()


def axis(i: int, wobble: float = 0.0) -> list[float]:
    """A unit-ish vector along axis ``i``, tilted towards the next axis by ``wobble``."""
    v = [0.0] * DIM
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = wobble
    return v


def point(vector: list[float], **kw: Any) -> VectorPoint:
    fields: dict[str, Any] = {
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


async def ids(index: VectorIndex, flt: VectorFilter, vector: list[float] | None = None) -> set[str]:
    return {i for i, _ in await index.search(vector or axis(0), flt, 100)}


async def test_search_returns_nearest_first(index: VectorIndex) -> None:
    """Search ranks points by cosine similarity, best first, with the similarity as score."""
    far, near, exact = point(axis(2)), point(axis(0, 0.5)), point(axis(0))
    await index.upsert([far, near, exact])
    hits = await index.search(axis(0), VectorFilter(tenant="acme"), 2)
    assert [i for i, _ in hits] == [exact.id, near.id]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert hits[1][1] == pytest.approx(1 / (1 + 0.25) ** 0.5, abs=1e-4)


async def test_other_tenant_never_returned(index: VectorIndex) -> None:
    """A point of tenant B never comes back for tenant A, even with the identical vector."""
    mine, theirs = point(axis(0)), point(axis(0), tenant="globex")
    await index.upsert([theirs, mine])
    assert await ids(index, VectorFilter(tenant="acme")) == {mine.id}
    assert await ids(index, VectorFilter(tenant="globex")) == {theirs.id}
    assert await ids(index, VectorFilter(tenant="initech")) == set()


FILTER_CASES = [
    ("user", {"user": "bob"}, {"user": "bob"}),
    ("agent", {"agent": "helper"}, {"agent": "helper"}),
    ("session", {"session": "s2"}, {"session": "s2"}),
    ("types", {"type": MemoryType.RULE}, {"types": (MemoryType.RULE, MemoryType.TODO)}),
    ("scopes", {"scope": Scope.GLOBAL}, {"scopes": (Scope.GLOBAL, Scope.RUN)}),
]


@pytest.mark.parametrize(("field", "odd", "narrow"), FILTER_CASES, ids=[c[0] for c in FILTER_CASES])
async def test_filter_field_narrows(
    index: VectorIndex, field: str, odd: dict[str, Any], narrow: dict[str, Any]
) -> None:
    """Each filter field keeps only the matching points; unset it keeps them all."""
    plain, special = point(axis(0)), point(axis(0, 0.1), **odd)
    await index.upsert([plain, special])
    assert await ids(index, VectorFilter(tenant="acme", **narrow)) == {special.id}
    assert await ids(index, VectorFilter(tenant="acme")) == {plain.id, special.id}


async def test_filters_combine_with_and(index: VectorIndex) -> None:
    """Several filter fields must all match (AND), not any of them."""
    both = point(axis(0), user="bob", session="s2")
    only_user = point(axis(0), user="bob")
    await index.upsert([both, only_user])
    assert await ids(index, VectorFilter(tenant="acme", user="bob", session="s2")) == {both.id}


async def test_user_none_in_point_is_not_matched_by_user_filter(index: VectorIndex) -> None:
    """A point with no user (an agent memory) does not match a filter on a user."""
    agent_only = point(axis(0), user=None)
    await index.upsert([agent_only])
    assert await ids(index, VectorFilter(tenant="acme", user="ann")) == set()
    assert await ids(index, VectorFilter(tenant="acme", agent="bot")) == {agent_only.id}


async def test_expired_points_hidden(index: VectorIndex) -> None:
    """Points whose expires_at <= now are hidden; points without expires_at are kept."""
    forever = point(axis(0))
    later = point(axis(0), expires_at=NOW + 1)
    at_now = point(axis(0), expires_at=NOW)
    past = point(axis(0), expires_at=NOW - 1)
    await index.upsert([forever, later, at_now, past])
    assert await ids(index, VectorFilter(tenant="acme", now=NOW)) == {forever.id, later.id}
    everything = {forever.id, later.id, at_now.id, past.id}
    assert await ids(index, VectorFilter(tenant="acme")) == everything


async def test_upsert_same_id_twice_keeps_one_point(index: VectorIndex) -> None:
    """Replaying an upsert changes nothing; a new version of an id overwrites the old one."""
    p = point(axis(0))
    await index.upsert([p])
    await index.upsert([p])
    assert await index.count() == 1  # type: ignore[attr-defined]
    moved = point(axis(3), id=p.id, user="bob")
    await index.upsert([moved])
    assert await index.count() == 1  # type: ignore[attr-defined]
    assert await ids(index, VectorFilter(tenant="acme", user="ann")) == set()
    hits = await index.search(axis(3), VectorFilter(tenant="acme", user="bob"), 5)
    assert hits[0][0] == p.id
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)


async def test_delete_removes_only_named_points_of_the_tenant(index: VectorIndex) -> None:
    """Delete removes the tenant's named points, ignores missing ids and other tenants' ids."""
    gone, kept, theirs = point(axis(0)), point(axis(1)), point(axis(0), tenant="globex")
    await index.upsert([gone, kept, theirs])
    await index.delete("acme", [gone.id, str(uuid.uuid4()), theirs.id])
    await index.delete("acme", [gone.id])
    assert await ids(index, VectorFilter(tenant="acme")) == {kept.id}
    assert await ids(index, VectorFilter(tenant="globex")) == {theirs.id}


async def test_empty_calls_are_no_ops(index: VectorIndex) -> None:
    """Upserting or deleting nothing and asking for no hits all succeed and change nothing."""
    await index.upsert([])
    await index.delete("acme", [])
    assert await index.search(axis(0), VectorFilter(tenant="acme"), 0) == []
    assert await index.count() == 0  # type: ignore[attr-defined]


async def test_wrong_vector_size_is_rejected_before_storage(index: VectorIndex) -> None:
    """A vector of another size is a bug (ValueError), not an unavailable store."""
    with pytest.raises(ValueError, match="dims"):
        await index.upsert([point([1.0, 0.0])])
    with pytest.raises(ValueError, match="dims"):
        await index.search([1.0, 0.0], VectorFilter(tenant="acme"), 3)


async def test_ensure_twice_keeps_the_data(index: VectorIndex, make_index: Factory) -> None:
    """ensure() on an existing index (same or new instance) is a no-op that keeps the points."""
    p = point(axis(0))
    await index.upsert([p])
    await index.ensure(DIM)
    await index.close()
    again = make_index()
    await again.ensure(DIM)
    await again.ensure(DIM)
    assert await ids(again, VectorFilter(tenant="acme")) == {p.id}
    await again.close()


async def test_ensure_with_another_size_is_a_configuration_error(
    index: VectorIndex, make_index: Factory
) -> None:
    """An existing index built for another vector size refuses to open: ConfigurationError."""
    with pytest.raises(ConfigurationError):
        await index.ensure(DIM * 2)
    await index.close()
    other = make_index()
    with pytest.raises(ConfigurationError):
        await other.ensure(DIM * 2)
    await other.close()


async def test_close_twice_is_fine(make_index: Factory) -> None:
    """close() is idempotent."""
    idx = make_index()
    await idx.ensure(DIM)
    await idx.close()
    await idx.close()


# -- congruence: the two adapters answer the same questions the same way ------------------


async def test_edge_and_local_server_agree(tmp_path: Path) -> None:
    """Random points and filters: both adapters return the same ids and scores."""
    rng = random.Random(7)
    edge, local = edge_factory(tmp_path)(), local_factory(tmp_path)()
    points = [
        point(
            [rng.gauss(0, 1) for _ in range(DIM)],
            tenant=rng.choice(["acme", "globex"]),
            user=rng.choice(["ann", "bob", None]),
            session=rng.choice(["s1", "s2"]),
            type=rng.choice([MemoryType.FACT, MemoryType.RULE]),
            scope=rng.choice([Scope.USER, Scope.SESSION]),
            expires_at=rng.choice([None, NOW - 10, NOW + 10]),
        )
        for _ in range(300)
    ]
    filters = [
        VectorFilter(tenant="acme", now=NOW),
        VectorFilter(tenant="globex", user="bob"),
        VectorFilter(tenant="acme", session="s2", types=(MemoryType.RULE,), now=NOW),
        VectorFilter(tenant="globex", scopes=(Scope.SESSION,), user="ann"),
    ]
    try:
        for idx in (edge, local):
            await idx.ensure(DIM)
            await idx.upsert(points)
        for flt in filters:
            q = [rng.gauss(0, 1) for _ in range(DIM)]
            a, b = await edge.search(q, flt, 10), await local.search(q, flt, 10)
            assert [i for i, _ in a] == [i for i, _ in b]
            assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-4)
    finally:
        await edge.close()
        await local.close()


# -- adapter specifics ------------------------------------------------------------------------


async def test_edge_data_survives_close_and_reopen(tmp_path: Path) -> None:
    """Qdrant Edge: points and payload indexes are on disk after close; a new instance sees them."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    p = point(axis(0), expires_at=NOW + 5)
    await first.upsert([p])
    await first.close()
    second = EdgeVectorIndex(tmp_path / "shard")
    await second.ensure(DIM)
    assert await second.search(axis(0), VectorFilter(tenant="acme", user="ann", now=NOW), 3) == [
        (p.id, pytest.approx(1.0, abs=1e-5))
    ]
    assert set(second.shard.info().payload_schema) >= {"tenant", "user", "expires_at"}
    await second.close()


def test_edge_acknowledged_upsert_survives_a_killed_process(tmp_path: Path) -> None:
    """Qdrant Edge: an upsert that returned is replayed from the WAL after the process dies."""
    p = point(axis(0))
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from memstream.storage.qdrant_edge import EdgeVectorIndex
        from memstream.storage.ports import VectorPoint
        from memstream.schemas.memory import MemoryType, Scope

        async def main():
            idx = EdgeVectorIndex({str(tmp_path / "shard")!r}, flush_every_s=3600)
            await idx.ensure({DIM})
            await idx.upsert([VectorPoint(id={p.id!r}, vector={p.vector!r}, tenant="acme",
                user="ann", agent="bot", session="s1", type=MemoryType.FACT,
                scope=Scope.USER, occurred_at=1.0)])
            os._exit(0)  # no flush, no close

        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)

    async def reopen() -> list[tuple[str, float]]:
        idx = EdgeVectorIndex(tmp_path / "shard")
        await idx.ensure(DIM)
        try:
            return await idx.search(axis(0), VectorFilter(tenant="acme"), 3)
        finally:
            await idx.close()

    assert [i for i, _ in asyncio.run(reopen())] == [p.id]


async def test_edge_shard_open_elsewhere_is_a_configuration_error(tmp_path: Path) -> None:
    """Qdrant Edge: a second index over a shard already open refuses to start."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    second = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="another process"):
        await second.ensure(DIM)
    await first.close()


async def test_edge_used_before_ensure_is_a_configuration_error(tmp_path: Path) -> None:
    """Qdrant Edge: calls before ensure() fail loudly instead of creating a shard silently."""
    idx = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="ensure"):
        await idx.search(axis(0), VectorFilter(tenant="acme"), 3)


async def test_server_unreachable_is_storage_unavailable() -> None:
    """Server adapter: no Qdrant listening raises StorageUnavailable (transient), from the cause."""
    idx = ServerVectorIndex(
        url="http://127.0.0.1:9", collection="memories", timeout=2, check_compatibility=False
    )
    with pytest.raises(StorageUnavailable) as info:
        await idx.ensure(DIM)
    assert info.value.__cause__ is not None
    await idx.close()

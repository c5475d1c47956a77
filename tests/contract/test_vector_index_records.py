"""The VectorIndex contract, part 3: records in the payload (stored, fetched, carried by
searches), writes and deletes, ensure() over existing or older collections, count, optimize
and close. Every test runs against Qdrant Edge and the server adapter (local)."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest
import qdrant_edge as qe
from indexpoints import DIM, LOCAL_MODE, NOW, WORD, Factory, axis, edge_factory, ids, point
from qdrant_client import AsyncQdrantClient, models

from memstream.schemas.errors import ConfigurationError
from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.edge_layout import payload as edge_payload
from memstream.storage.ports import VectorFilter, VectorIndex
from memstream.storage.qdrant_edge import EdgeVectorIndex
from memstream.storage.qdrant_server import ServerVectorIndex

pytestmark = [LOCAL_MODE]


async def stored_payload(index: VectorIndex, point_id: str) -> dict[str, Any]:
    """The raw payload of one point, read past the port (storage layout checks only)."""
    if isinstance(index, EdgeVectorIndex):
        found = index.shard.retrieve([point_id], True, False)
        return dict(found[0].payload or {})
    assert isinstance(index, ServerVectorIndex)
    records = await index._client.retrieve(index.collection, [point_id], with_payload=True)
    return dict(records[0].payload or {})


async def test_pinned_flag_and_tags_are_stored_in_the_payload(index: VectorIndex) -> None:
    """pinned is stored as a bool and tags as a list, beside the record; re-upsert replaces them."""
    p = point(axis(0), pinned=True, tags=("red",), record={"text": "t"})
    await index.upsert([p])
    stored = await stored_payload(index, p.id)
    assert (stored["pinned"], stored["tags"], _decoded(stored["record"])) == (
        True,
        ["red"],
        {"text": "t"},
    )
    await index.upsert([point(axis(0), id=p.id)])
    stored = await stored_payload(index, p.id)
    assert (stored["pinned"], stored["tags"], _decoded(stored["record"])) == (False, [], {})


def _decoded(record: Any) -> Any:
    """Qdrant Edge stores the record as one JSON string (cheaper for the engine to take)."""
    return json.loads(record) if isinstance(record, str) else record


async def test_edge_reads_records_stored_as_dicts_before(tmp_path: Path) -> None:
    """A point written when Qdrant Edge payloads held the record as a dict is still read:
    by id and by a search, with its record."""
    index = edge_factory(tmp_path)()
    await index.ensure(DIM)
    p = point(axis(0), record={"text": "older", "id": "x"})
    await index.upsert([p])
    old = qe.Point(p.id, index._vectors(p), {**edge_payload(p), "record": dict(p.record)})
    index.shard.update(qe.UpdateOperation.upsert_points([old]))
    assert not isinstance((await stored_payload(index, p.id))["record"], str)
    assert (await index.fetch("acme", [p.id]))[p.id] == {"text": "older", "id": "x"}
    hits = await index.search(axis(0), VectorFilter(tenant="acme"), 1, with_records=True)
    assert hits[0][2] == {"text": "older", "id": "x"}
    await index.close()


RECORD = {
    "text": "Ann prefers tea — not coffee ☕",
    "importance": 0.75,
    "access_count": 3,
    "source": {"event_ids": ["e1", "e2"], "turn": None},
    "pinned": True,
}


async def test_fetch_returns_records_of_the_tenant(index: VectorIndex) -> None:
    """fetch hands back each named point's record as stored; missing ids and other tenants'
    points are absent; keys are the ids as given."""
    mine, bare = point(axis(0), record=RECORD), point(axis(1))
    theirs = point(axis(0), tenant="globex", record={"text": "secret"})
    await index.upsert([mine, bare, theirs])
    missing = str(uuid.uuid4())
    upper = mine.id.upper()
    got = await index.fetch("acme", [upper, bare.id, theirs.id, missing])
    assert got == {upper: RECORD, bare.id: {}}
    assert await index.fetch("acme", []) == {}


async def test_search_with_records_returns_them_in_the_same_call(index: VectorIndex) -> None:
    """search and search_sparse with with_records=True carry each hit's record; without it
    the hits are (id, score) pairs as before."""
    a, b = point(axis(0), record={"text": "a"}), point(axis(0, 0.5), record={"text": "b"})
    await index.upsert([a, b])
    flt = VectorFilter(tenant="acme")
    dense = await index.search(axis(0), flt, 5, with_records=True)
    assert [(i, r) for i, _, r in dense] == [(a.id, {"text": "a"}), (b.id, {"text": "b"})]
    sparse = await index.search_sparse({WORD: 1.0}, flt, 5, with_records=True)
    assert {i: r for i, _, r in sparse} == {a.id: {"text": "a"}, b.id: {"text": "b"}}
    assert all(len(hit) == 2 for hit in await index.search(axis(0), flt, 5))
    assert all(len(hit) == 2 for hit in await index.search_sparse({WORD: 1.0}, flt, 5))


async def test_reupsert_replaces_record_and_sparse_vector(index: VectorIndex) -> None:
    """A new version of an id replaces its record and its keyword terms, not adds to them."""
    first = point(axis(0), sparse={1: 1.0}, record={"v": 1})
    await index.upsert([first])
    second = point(axis(0), id=first.id, sparse={2: 1.0}, record={"v": 2})
    await index.upsert([second])
    flt = VectorFilter(tenant="acme")
    assert await index.search_sparse({1: 1.0}, flt, 5) == []
    assert [i for i, _ in await index.search_sparse({2: 1.0}, flt, 5)] == [first.id]
    assert await index.fetch("acme", [first.id]) == {first.id: {"v": 2}}
    dense_only = point(axis(0), id=first.id, sparse=None, record={"v": 3})
    await index.upsert([dense_only])
    assert await index.search_sparse({2: 1.0}, flt, 5) == []


async def test_an_older_version_never_replaces_a_later_point(index: VectorIndex) -> None:
    """Each writer of a memory's point builds it from the row it read, and the older build
    can arrive last: it leaves the later point as it is, in every leg and in the keyword
    statistics, while a new point in the same call is written. The same version again, a
    later one, and a point without a version each overwrite."""
    later = point(axis(0), sparse={2: 1.0}, record={"v": 2}, version=NOW + 2)
    await index.upsert([later])
    older = point(axis(3), id=later.id, sparse={1: 1.0}, record={"v": 1}, version=NOW + 1)
    new = point(axis(5), record={"v": "new"}, version=NOW)
    await index.upsert([older, new])
    flt = VectorFilter(tenant="acme")
    assert await index.fetch("acme", [later.id, new.id]) == {
        later.id: {"v": 2},
        new.id: {"v": "new"},
    }
    assert await index.search_sparse({1: 1.0}, flt, 5) == []
    assert [i for i, _ in await index.search_sparse({2: 1.0}, flt, 5)] == [later.id]
    assert [i for i, _ in await index.search(axis(3), flt, 5) if i == later.id] == [later.id]
    assert (await index.search(axis(0), flt, 1))[0][0] == later.id
    for version, record in ((NOW + 2, "again"), (NOW + 3, "newer"), (None, "unversioned")):
        await index.upsert([point(axis(0), id=later.id, record={"v": record}, version=version)])
        assert await index.fetch("acme", [later.id]) == {later.id: {"v": record}}
    assert await index.count() == 2


async def test_delete_removes_from_every_leg(index: VectorIndex) -> None:
    """A deleted point leaves dense search, sparse search and fetch alike."""
    gone, kept = point(axis(0), record={"v": 1}), point(axis(0), record={"v": 2})
    await index.upsert([gone, kept])
    await index.delete("acme", [gone.id])
    flt = VectorFilter(tenant="acme")
    assert await ids(index, flt, leg="sparse") == {kept.id}
    assert await ids(index, flt) == {kept.id}
    assert await index.fetch("acme", [gone.id, kept.id]) == {kept.id: {"v": 2}}


async def test_upsert_same_id_twice_keeps_one_point(index: VectorIndex) -> None:
    """Replaying an upsert changes nothing; a new version of an id overwrites the old one."""
    p = point(axis(0))
    await index.upsert([p])
    await index.upsert([p])
    assert await index.count() == 1
    moved = point(axis(3), id=p.id, user="bob")
    await index.upsert([moved])
    assert await index.count() == 1
    assert await ids(index, VectorFilter(tenant="acme", user="ann", agent="bot")) == set()
    hits = await index.search(axis(3), VectorFilter(tenant="acme", user="bob", agent="bot"), 5)
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
    assert await index.count() == 0


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


LEGACY_PAYLOAD = {  # what the previous version stored: no pinned, tags or record
    "tenant": "acme",
    "user": "ann",
    "agent": "bot",
    "session": "s1",
    "type": MemoryType.FACT.value,
    "scope": Scope.USER.value,
    "occurred_at": NOW - 60,
    "expires_at": None,
}


async def create_legacy(kind: str, tmp_path: Path, point_id: str) -> None:
    """A collection as the previous version built it: one dense vector, no bm25, one point."""
    if kind == "edge":
        dense = qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)
        shard = qe.EdgeShard.create(
            str(tmp_path / "shard"), qe.EdgeConfig(vectors={"dense": dense})
        )
        op = qe.UpdateOperation.upsert_points(
            [qe.Point(point_id, {"dense": axis(0)}, LEGACY_PAYLOAD)]
        )
        shard.update(op)
        shard.close()
        return
    client = AsyncQdrantClient(path=str(tmp_path / "local"))
    params = models.VectorParams(size=DIM, distance=models.Distance.COSINE)
    await client.create_collection("memories", vectors_config={"dense": params})
    struct = models.PointStruct(id=point_id, vector={"dense": axis(0)}, payload=LEGACY_PAYLOAD)
    await client.upsert("memories", [struct])
    await client.close()


async def test_ensure_adds_bm25_to_a_previous_version_collection(
    kind: str, tmp_path: Path, make_index: Factory
) -> None:
    """Qdrant server: ensure() on a collection without the bm25 sparse vector adds it in
    place: old points stay dense-searchable (record {}), new ones are keyword-searchable,
    reopening is a no-op. Qdrant Edge refuses such a shard instead (rebuilt from Postgres)."""
    old_id = str(uuid.uuid4())
    await create_legacy(kind, tmp_path, old_id)
    idx = make_index()
    if kind == "edge":
        with pytest.raises(ConfigurationError, match="another layout"):
            await idx.ensure(DIM)
        return
    await idx.ensure(DIM)
    new = point(axis(0), sparse={1: 1.0}, record={"v": 1})
    await idx.upsert([new])
    flt = VectorFilter(tenant="acme")
    assert await ids(idx, flt) == {old_id, new.id}
    owner = VectorFilter(tenant="acme", user="ann", agent="bot")
    assert await ids(idx, owner) == {old_id, new.id}  # old points get owner keys too
    for other in (
        VectorFilter(tenant="acme", user="ann"),
        VectorFilter(tenant="acme", agent="bot"),
        VectorFilter(tenant="acme", user="bob", agent="bot"),
    ):
        assert await ids(idx, other) == set()
    assert [i for i, _ in await idx.search_sparse({1: 1.0}, flt, 5)] == [new.id]
    assert await idx.fetch("acme", [old_id, new.id]) == {old_id: {}, new.id: {"v": 1}}
    await idx.close()
    again = make_index()
    await again.ensure(DIM)
    assert [i for i, _ in await again.search_sparse({1: 1.0}, flt, 5)] == [new.id]
    await again.close()


async def test_count_counts_points_per_tenant(index: VectorIndex) -> None:
    """count() counts every stored point (expired ones too), of one tenant or of all."""
    await index.upsert(
        [point(axis(0)), point(axis(1), expires_at=NOW - 1), point(axis(0), tenant="globex")]
    )
    assert await index.count("acme") == 2
    assert await index.count("globex") == 1
    assert await index.count("initech") == 0
    assert await index.count() == 3


async def test_optimize_keeps_every_answer(index: VectorIndex) -> None:
    """optimize() (merging segments, building indexes, or nothing) changes no result."""
    rng = random.Random(3)
    points = [
        point([rng.gauss(0, 1) for _ in range(DIM)], sparse={rng.randrange(20): 1.0, WORD: 0.5})
        for _ in range(200)
    ]
    await index.upsert(points)
    flt = VectorFilter(tenant="acme")
    q = [rng.gauss(0, 1) for _ in range(DIM)]
    before = (await index.search(q, flt, 10), await index.search_sparse({3: 1.0}, flt, 10))
    assert isinstance(await index.optimize(), bool)
    after = (await index.search(q, flt, 10), await index.search_sparse({3: 1.0}, flt, 10))
    assert [i for i, _ in after[0]] == [i for i, _ in before[0]]
    assert {i for i, _ in after[1]} == {i for i, _ in before[1]}
    assert await index.count() == 200


async def test_close_twice_is_fine(make_index: Factory) -> None:
    """close() is idempotent."""
    idx = make_index()
    await idx.ensure(DIM)
    await idx.close()
    await idx.close()

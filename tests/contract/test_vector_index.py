"""One contract for every VectorIndex adapter: Qdrant Edge in a temp dir and the server
adapter over qdrant-client's local mode (no Qdrant server runs here)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import pytest
import qdrant_edge as qe
from qdrant_client import AsyncQdrantClient, models

from memstream.schemas.errors import ConfigurationError, StorageUnavailable
from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.edge_layout import edge_filter
from memstream.storage.edge_layout import payload as edge_payload
from memstream.storage.ports import IdfScope, VectorFilter, VectorIndex, VectorPoint
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

Factory = Callable[..., VectorIndex]


def edge_factory(path: Path) -> Callable[..., EdgeVectorIndex]:
    return lambda **kw: EdgeVectorIndex(path / "shard", **kw)


def local_factory(path: Path) -> Factory:
    return lambda **kw: ServerVectorIndex(collection="memories", path=path / "local", **kw)


@pytest.fixture(params=["edge", "server-local"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which adapter a test runs against."""
    return str(request.param)


@pytest.fixture
def make_index(kind: str, tmp_path: Path) -> Factory:
    """Makes instances of one adapter, all over the same storage in a temp dir."""
    factory = edge_factory if kind == "edge" else local_factory
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


async def test_search_returns_nearest_first(index: VectorIndex) -> None:
    """Search ranks points by cosine similarity, best first, with the similarity as score."""
    far, near, exact = point(axis(2)), point(axis(0, 0.5)), point(axis(0))
    await index.upsert([far, near, exact])
    hits = await index.search(axis(0), VectorFilter(tenant="acme"), 2)
    assert [i for i, _ in hits] == [exact.id, near.id]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert hits[1][1] == pytest.approx(1 / (1 + 0.25) ** 0.5, abs=1e-4)


async def test_search_many_answers_each_query_as_search_does(index: VectorIndex) -> None:
    """A batch of searches returns, per query and in order, what ``search`` with records
    returns for it alone (tenant and owner filters included)."""
    a, b, theirs = point(axis(0)), point(axis(3)), point(axis(0), tenant="globex")
    await index.upsert([a, b, theirs])
    queries = [
        (axis(0), VectorFilter(tenant="acme")),
        (axis(3), VectorFilter(tenant="acme", user="ann", agent="bot")),
        (axis(0), VectorFilter(tenant="acme", user="other")),
        (axis(0), VectorFilter(tenant="globex")),
    ]
    many = await index.search_many(queries, 2)
    assert len(many) == len(queries)
    for (vector, flt), got in zip(queries, many, strict=True):
        alone = await index.search(vector, flt, 2, with_records=True)
        assert [(i, round(s, 4)) for i, s, _ in got] == [(i, round(s, 4)) for i, s, _ in alone]
    assert many[0][0][0] == a.id and many[1][0][0] == b.id
    assert many[2] == [] and [i for i, _, _ in many[3]] == [theirs.id]
    assert await index.search_many([], 2) == []


async def test_search_many_min_score_keeps_only_hits_that_close(index: VectorIndex) -> None:
    """``min_score``: each query's hits are those of the search without it that score at
    least that much, in the same order; a query with none gets an empty list."""
    exact, near, far = point(axis(0)), point(axis(0, 0.5)), point(axis(0, 3.0))
    await index.upsert([exact, near, far])
    queries = [(axis(0), VectorFilter(tenant="acme")), (axis(5), VectorFilter(tenant="acme"))]
    every = await index.search_many(queries, 3)
    assert [i for i, _, _ in every[0]] == [exact.id, near.id, far.id]  # far: cosine ~0.32
    close = await index.search_many(queries, 3, min_score=0.85)
    assert [(i, round(s, 4)) for i, s, _ in close[0]] == [
        (i, round(s, 4)) for i, s, _ in every[0] if s >= 0.85
    ]
    assert [i for i, _, _ in close[0]] == [exact.id, near.id] and close[1] == []
    assert close[0][0][2] == every[0][0][2]  # the records come with the hits kept


async def test_search_many_queries_that_share_a_filter(index: VectorIndex) -> None:
    """Queries of one batch that share a filter (dedupe's queries share a few owners), and a
    filter that holds lists (not hashable), are each answered as ``search`` answers them."""
    a, b = point(axis(0)), point(axis(3), type=MemoryType.PREFERENCE)
    await index.upsert([a, b])
    shared = VectorFilter(tenant="acme", user="ann", agent="bot", types=(MemoryType.FACT,))
    listed = VectorFilter(tenant="acme", user="ann", agent="bot", types=[MemoryType.PREFERENCE])
    queries = [(axis(0), shared), (axis(3), shared), (axis(3), listed), (axis(0), shared)]
    many = await index.search_many(queries, 2)
    for (vector, flt), got in zip(queries, many, strict=True):
        alone = await index.search(vector, flt, 2, with_records=True)
        assert [i for i, _, _ in got] == [i for i, _, _ in alone]
    assert [[i for i, _, _ in hits] for hits in many] == [[a.id], [a.id], [b.id], [a.id]]


async def test_search_many_keeps_order_past_one_engine_batch(index: VectorIndex) -> None:
    """More queries than one engine batch takes (the Edge adapter splits them): each answer
    still belongs to its own query."""
    points = [point(axis(i % 8), user=f"u{i}", agent=None) for i in range(80)]
    await index.upsert(points)
    queries = [(axis(i % 8), VectorFilter(tenant="acme", user=f"u{i}")) for i in range(80)]
    many = await index.search_many(queries, 1)
    assert [[i for i, _, _ in hits] for hits in many] == [[p.id] for p in points]


LEGS: list[Leg] = ["dense", "sparse"]
legs = pytest.mark.parametrize("leg", LEGS)


@legs
async def test_other_tenant_never_returned(index: VectorIndex, leg: Leg) -> None:
    """A point of tenant B never comes back for tenant A, even with identical vectors."""
    mine, theirs = point(axis(0)), point(axis(0), tenant="globex")
    await index.upsert([theirs, mine])
    assert await ids(index, VectorFilter(tenant="acme"), leg=leg) == {mine.id}
    assert await ids(index, VectorFilter(tenant="globex"), leg=leg) == {theirs.id}
    assert await ids(index, VectorFilter(tenant="initech"), leg=leg) == set()


FILTER_CASES = [
    ("user", {"user": "bob"}, {"user": "bob", "agent": "bot"}),
    ("agent", {"agent": "helper"}, {"user": "ann", "agent": "helper"}),
    ("session", {"session": "s2"}, {"session": "s2"}),
    ("types", {"type": MemoryType.RULE}, {"types": (MemoryType.RULE, MemoryType.TODO)}),
    ("scopes", {"scope": Scope.GLOBAL}, {"scopes": (Scope.GLOBAL, Scope.RUN)}),
    ("tags", {"tags": ("red", "blue")}, {"tags": ("blue",)}),
    ("occurred_from", {"occurred_at": NOW}, {"occurred_from": NOW - 1}),
    ("occurred_to", {"occurred_at": NOW - 3600}, {"occurred_to": NOW - 61}),
    ("exclude_agent", {"user": None, "agent": "helper"}, {"peer": True, "exclude_agent": "bot"}),
]


@legs
@pytest.mark.parametrize(("field", "odd", "narrow"), FILTER_CASES, ids=[c[0] for c in FILTER_CASES])
async def test_filter_field_narrows(
    index: VectorIndex, leg: Leg, field: str, odd: dict[str, Any], narrow: dict[str, Any]
) -> None:
    """Each filter field keeps only the matching points, on both legs; unset it keeps all."""
    plain, special = point(axis(0)), point(axis(0, 0.1), **odd)
    await index.upsert([plain, special])
    assert await ids(index, VectorFilter(tenant="acme", **narrow), leg=leg) == {special.id}
    assert await ids(index, VectorFilter(tenant="acme"), leg=leg) == {plain.id, special.id}


@legs
async def test_filters_combine_with_and(index: VectorIndex, leg: Leg) -> None:
    """Several filter fields must all match (AND), not any of them."""
    both = point(axis(0), user="bob", session="s2", tags=("x",))
    only_user = point(axis(0), user="bob", tags=("x",))
    await index.upsert([both, only_user])
    flt = VectorFilter(tenant="acme", user="bob", agent="bot", session="s2", tags=("x",))
    assert await ids(index, flt, leg=leg) == {both.id}


@legs
async def test_user_none_in_point_is_not_matched_by_user_filter(
    index: VectorIndex, leg: Leg
) -> None:
    """A point with no user (an agent memory) does not match a filter on a user."""
    agent_only = point(axis(0), user=None)
    await index.upsert([agent_only])
    assert await ids(index, VectorFilter(tenant="acme", user="ann"), leg=leg) == set()
    assert await ids(index, VectorFilter(tenant="acme", agent="bot"), leg=leg) == {agent_only.id}


@legs
async def test_expired_points_hidden(index: VectorIndex, leg: Leg) -> None:
    """Points whose expires_at <= now are hidden; points without expires_at are kept."""
    forever = point(axis(0))
    later = point(axis(0), expires_at=NOW + 1)
    at_now = point(axis(0), expires_at=NOW)
    past = point(axis(0), expires_at=NOW - 1)
    await index.upsert([forever, later, at_now, past])
    assert await ids(index, VectorFilter(tenant="acme", now=NOW), leg=leg) == {forever.id, later.id}
    everything = {forever.id, later.id, at_now.id, past.id}
    assert await ids(index, VectorFilter(tenant="acme"), leg=leg) == everything


@legs
async def test_tags_filter_needs_all_of_the_tags(index: VectorIndex, leg: Leg) -> None:
    """A tags filter keeps points holding every given tag; extra tags on the point are fine."""
    red_blue, red, untagged = (
        point(axis(0), tags=("red", "blue", "green")),
        point(axis(0), tags=("red",)),
        point(axis(0)),
    )
    await index.upsert([red_blue, red, untagged])

    async def tagged(*tags: str) -> set[str]:
        return await ids(index, VectorFilter(tenant="acme", tags=tags), leg=leg)

    assert await tagged("red", "blue") == {red_blue.id}
    assert await tagged("red") == {red_blue.id, red.id}
    assert await tagged("red", "yellow") == set()
    assert await tagged() == {red_blue.id, red.id, untagged.id}


@legs
async def test_occurred_range_is_inclusive_on_both_ends(index: VectorIndex, leg: Leg) -> None:
    """occurred_from/occurred_to keep occurred_at in [from, to], both bounds included."""
    old, mid, new = (point(axis(0), occurred_at=NOW + t) for t in (-100.0, -50.0, 0.0))
    await index.upsert([old, mid, new])

    async def between(lo: float | None, hi: float | None) -> set[str]:
        flt = VectorFilter(tenant="acme", occurred_from=lo, occurred_to=hi)
        return await ids(index, flt, leg=leg)

    assert await between(NOW - 50, None) == {mid.id, new.id}
    assert await between(None, NOW - 50) == {old.id, mid.id}
    assert await between(NOW - 50, NOW - 50) == {mid.id}
    assert await between(NOW - 49, NOW - 1) == set()


@legs
async def test_peer_filter_keeps_other_agents_own_points(index: VectorIndex, leg: Leg) -> None:
    """A peer read keeps agent-owned points (no user): of the named agent, or of every agent
    but the excluded one; never a user's point with that agent, never an agentless one."""
    mine = point(axis(0), user=None)  # agent bot's own
    peer = point(axis(0), user=None, agent="helper")
    users = point(axis(0), agent="helper")  # ann's memory with agent helper
    nobody = point(axis(0), user=None, agent=None)
    await index.upsert([mine, peer, users, nobody])
    flt = VectorFilter(tenant="acme", peer=True, exclude_agent="bot")
    assert await ids(index, flt, leg=leg) == {peer.id}
    assert await ids(index, VectorFilter(tenant="acme", peer=True, agent="helper"), leg=leg) == {
        peer.id
    }
    assert await ids(index, VectorFilter(tenant="acme", peer=True), leg=leg) == {mine.id, peer.id}


OWNERS = [("ann", "bot"), ("ann", None), (None, "bot"), ("bob", "bot"), ("ann", "helper")]


@legs
async def test_own_reads_match_the_owner_exactly(index: VectorIndex, leg: Leg) -> None:
    """A filter naming an owner keeps that owner's points only: both user and agent equal,
    an unset one matching only points without it (no widening to (ann, *) or (*, bot))."""
    pts = {o: point(axis(0), user=o[0], agent=o[1]) for o in OWNERS}
    await index.upsert(list(pts.values()))
    for (user, agent), p in pts.items():
        flt = VectorFilter(tenant="acme", user=user, agent=agent)
        assert await ids(index, flt, leg=leg) == {p.id}, (user, agent)


@legs
async def test_shared_reads_add_global_and_own_project(index: VectorIndex, leg: Leg) -> None:
    """``shared`` adds the tenant's global points and the project points of the caller's
    project, whoever owns them; not another project's, not another tenant's, not another
    owner's user-scope points."""
    own = point(axis(0), user="ann", agent=None)
    glob = point(axis(0), user="bob", scope=Scope.GLOBAL)
    proj = point(axis(0), user="bob", scope=Scope.PROJECT, project="apollo")
    other_proj = point(axis(0), user="bob", scope=Scope.PROJECT, project="gemini")
    no_proj = point(axis(0), user="bob", scope=Scope.PROJECT, project=None)
    private = point(axis(0), user="bob")
    foreign = point(axis(0), tenant="globex", user="bob", scope=Scope.GLOBAL)
    await index.upsert([own, glob, proj, other_proj, no_proj, private, foreign])
    flt = VectorFilter(tenant="acme", user="ann", project="apollo", shared=True)
    assert await ids(index, flt, leg=leg) == {own.id, glob.id, proj.id}
    flt = VectorFilter(tenant="acme", user="ann", shared=True)
    assert await ids(index, flt, leg=leg) == {own.id, glob.id}
    flt = VectorFilter(tenant="acme", user="ann", project="apollo")  # not shared: own only
    assert await ids(index, flt, leg=leg) == {own.id}
    narrowed = VectorFilter(
        tenant="acme", user="ann", project="apollo", shared=True, scopes=(Scope.PROJECT,)
    )
    assert await ids(index, narrowed, leg=leg) == {proj.id}


async def test_records_are_checked_with_the_same_rules(index: VectorIndex) -> None:
    """Searches with records keep exactly the points the filter's rules allow."""
    own = point(axis(0), user="ann", agent=None, record={"k": "own"})
    widened = point(axis(0), user="ann", agent="bot", record={"k": "widened"})
    glob = point(axis(0), user="bob", scope=Scope.GLOBAL, record={"k": "global"})
    await index.upsert([own, widened, glob])
    flt = VectorFilter(tenant="acme", user="ann", shared=True)
    hits = await index.search(axis(0), flt, 10, with_records=True)
    assert {r["k"] for _, _, r in hits} == {"own", "global"}


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


# -- the keyword (BM25) leg -------------------------------------------------------------------


async def test_sparse_rare_terms_outrank_common_ones(index: VectorIndex) -> None:
    """IDF works: of two docs with equal term weights, the one sharing the rarer term wins."""
    common, rare = point(axis(0), sparse={1: 1.0, 3: 0.5}), point(axis(0), sparse={2: 1.0, 3: 0.5})
    filler = [point(axis(0), sparse={1: 1.0, 4: 1.0}) for _ in range(5)]
    await index.upsert([common, rare, *filler])
    hits = await index.search_sparse({1: 1.0, 2: 1.0}, VectorFilter(tenant="acme"), 10)
    assert hits[0][0] == rare.id
    assert len(hits) == 7
    n = 7  # points with a sparse vector in the corpus
    assert hits[0][1] == pytest.approx(bm25_idf(1, n), rel=1e-4)
    assert hits[1][1] == pytest.approx(bm25_idf(6, n), rel=1e-4)
    assert common.id in {i for i, _ in hits[1:]}


async def test_sparse_scores_are_weighted_sums(index: VectorIndex) -> None:
    """A sparse hit scores sum(query weight * idf * doc weight) over the shared terms."""
    doc = point(axis(0), sparse={1: 2.0, 2: 0.5, 3: 9.0})
    other = point(axis(0), sparse={3: 1.0})
    await index.upsert([doc, other])
    hits = await index.search_sparse({1: 1.5, 2: 1.0, 5: 4.0}, VectorFilter(tenant="acme"), 5)
    expected = 1.5 * 2.0 * bm25_idf(1, 2) + 1.0 * 0.5 * bm25_idf(1, 2)
    assert hits == [(doc.id, pytest.approx(expected, rel=1e-4))]


async def test_sparse_idf_is_computed_over_the_tenant(index: VectorIndex) -> None:
    """IDF counts only the tenant's points: another tenant full of a term does not make it
    common for this one (collection-wide IDF would flip this ranking)."""
    rare_here, common_here = point(axis(0), sparse={2: 1.0}), point(axis(0), sparse={1: 1.0})
    mine = [rare_here, common_here] + [point(axis(0), sparse={1: 1.0}) for _ in range(4)]
    theirs = [point(axis(0), tenant="globex", sparse={2: 1.0}) for _ in range(30)]
    await index.upsert(mine + theirs)
    hits = await index.search_sparse({1: 1.0, 2: 1.0}, VectorFilter(tenant="acme"), 10)
    assert hits[0] == (rare_here.id, pytest.approx(bm25_idf(1, 6), rel=1e-4))
    assert len(hits) == 6


@pytest.mark.parametrize(
    ("scope", "n", "df"), [("owner", 3, 3), ("tenant", 13, 3), ("collection", 15, 5)]
)
async def test_sparse_idf_scope_picks_the_corpus(
    make_index: Factory, scope: IdfScope, n: int, df: int
) -> None:
    """idf_scope sets the IDF corpus: the owner the filter names, the tenant (default) or the
    collection; session, type and other narrowing filters never change the statistics."""
    idx = make_index(idf_scope=scope)
    await idx.ensure(DIM)
    mine = [point(axis(0), sparse={1: 1.0}, session=f"s{i}") for i in range(3)]
    others = [point(axis(0), user="bob", sparse={2: 1.0}) for _ in range(10)]
    theirs = [point(axis(0), tenant="globex", sparse={1: 1.0}) for _ in range(2)]
    await idx.upsert(mine + others + theirs)
    flt = VectorFilter(tenant="acme", user="ann", agent="bot", session="s0")
    assert await idx.search_sparse({1: 1.0}, flt, 5) == [
        (mine[0].id, pytest.approx(bm25_idf(df, n), rel=1e-4))
    ]
    await idx.close()


async def test_sparse_idf_follows_overwrites_and_deletes(index: VectorIndex) -> None:
    """The IDF statistics move with every write: an overwrite takes the old terms out, a
    delete takes the point out, a dense-only overwrite leaves the keyword corpus; deleting
    by another tenant's name changes nothing."""
    a = [point(axis(0), sparse={1: 1.0}) for _ in range(4)]
    b = point(axis(0), sparse={2: 1.0})
    await index.upsert([*a, b])
    flt = VectorFilter(tenant="acme")

    async def score_of(term: int) -> float:
        return (await index.search_sparse({term: 1.0}, flt, 10))[0][1]

    assert await score_of(1) == pytest.approx(bm25_idf(4, 5), rel=1e-4)
    await index.upsert([point(axis(0), id=a[0].id, sparse={2: 1.0})])  # term 1 -> term 2
    assert await score_of(1) == pytest.approx(bm25_idf(3, 5), rel=1e-4)
    assert await score_of(2) == pytest.approx(bm25_idf(2, 5), rel=1e-4)
    await index.delete("globex", [a[1].id, b.id])  # not that tenant's points: no change
    assert await score_of(1) == pytest.approx(bm25_idf(3, 5), rel=1e-4)
    await index.delete("acme", [b.id])
    assert await score_of(2) == pytest.approx(bm25_idf(1, 4), rel=1e-4)
    await index.upsert([point(axis(0), id=a[1].id, sparse=None)])  # now dense-only
    assert await score_of(1) == pytest.approx(bm25_idf(2, 3), rel=1e-4)
    dup = point(axis(0), sparse={1: 1.0})
    await index.upsert([dup, dup])  # one id twice in a batch: one point
    assert await score_of(1) == pytest.approx(bm25_idf(3, 4), rel=1e-4)


async def test_point_without_sparse_never_matches_sparse_search(index: VectorIndex) -> None:
    """A point upserted without a sparse vector (None or empty) is dense-only."""
    none, empty, keyed = point(axis(0), sparse=None), point(axis(0), sparse={}), point(axis(0))
    await index.upsert([none, empty, keyed])
    assert await ids(index, VectorFilter(tenant="acme"), leg="sparse") == {keyed.id}
    assert await ids(index, VectorFilter(tenant="acme")) == {none.id, empty.id, keyed.id}


async def test_sparse_query_without_shared_terms_finds_nothing(index: VectorIndex) -> None:
    """Sparse search returns only points sharing a term; an empty query returns nothing."""
    await index.upsert([point(axis(0), sparse={1: 1.0})])
    assert await index.search_sparse({2: 1.0}, VectorFilter(tenant="acme"), 5) == []
    assert await index.search_sparse({}, VectorFilter(tenant="acme"), 5) == []


async def test_sparse_index_out_of_range_is_rejected_before_storage(index: VectorIndex) -> None:
    """Sparse indices must fit in an unsigned 32-bit integer: ValueError, not a storage error."""
    with pytest.raises(ValueError, match="sparse indices"):
        await index.upsert([point(axis(0), sparse={2**32: 1.0})])
    with pytest.raises(ValueError, match="sparse indices"):
        await index.search_sparse({-1: 1.0}, VectorFilter(tenant="acme"), 3)
    top = point(axis(0), sparse={2**32 - 1: 1.0, 0: 1.0})
    await index.upsert([top])
    assert await ids(index, VectorFilter(tenant="acme"), leg="sparse") == set()
    assert [i for i, _ in await index.search_sparse({0: 1.0}, VectorFilter(tenant="acme"), 3)] == [
        top.id
    ]


# -- records in the payload -------------------------------------------------------------------

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


# -- congruence: the two adapters answer the same questions the same way ------------------


async def test_edge_and_local_server_agree(tmp_path: Path) -> None:
    """Random points and filters: both adapters return the same ids and scores on both legs,
    and the same records."""
    rng = random.Random(7)
    edge, local = edge_factory(tmp_path)(), local_factory(tmp_path)()
    points = [
        point(
            [rng.gauss(0, 1) for _ in range(DIM)],
            tenant=rng.choice(["acme", "globex"]),
            user=rng.choice(["ann", "bob", None]),
            agent=rng.choice(["bot", "helper", None]),
            session=rng.choice(["s1", "s2"]),
            type=rng.choice([MemoryType.FACT, MemoryType.RULE]),
            scope=rng.choice([Scope.USER, Scope.SESSION]),
            expires_at=rng.choice([None, NOW - 10, NOW + 10]),
            occurred_at=NOW - rng.randrange(1000),
            tags=tuple(rng.sample(["red", "blue", "green"], rng.randrange(3))),
            sparse=rng.choice(
                [None, {rng.randrange(40): rng.uniform(0.1, 2) for _ in range(rng.randrange(1, 6))}]
            ),
            record={"n": rng.randrange(1000)},
        )
        for _ in range(300)
    ]
    filters = [
        VectorFilter(tenant="acme", now=NOW),
        VectorFilter(tenant="globex", user="bob"),
        VectorFilter(tenant="acme", session="s2", types=(MemoryType.RULE,), now=NOW),
        VectorFilter(tenant="globex", scopes=(Scope.SESSION,), user="ann"),
        VectorFilter(tenant="acme", tags=("red",), occurred_from=NOW - 500),
        VectorFilter(tenant="acme", user="ann", exclude_agent="bot", occurred_to=NOW - 200),
        VectorFilter(tenant="globex", agent="helper", tags=("blue",)),
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
            terms = {rng.randrange(40): 1.0 for _ in range(4)}
            sa = await edge.search_sparse(terms, flt, 300, with_records=True)
            sb = await local.search_sparse(terms, flt, 300, with_records=True)
            assert {i: (pytest.approx(s, rel=1e-4), r) for i, s, r in sa} == {
                i: (s, r) for i, s, r in sb
            }
        some = [p.id for p in points[:50]]
        assert await edge.fetch("acme", some) == await local.fetch("acme", some)
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
    flt = VectorFilter(tenant="acme", user="ann", agent="bot", now=NOW)
    assert await second.search(axis(0), flt, 3) == [(p.id, pytest.approx(1.0, abs=1e-5))]
    assert set(second.shard.info().payload_schema) >= {"tenant", "user", "expires_at", "tags"}
    assert [
        i for i, _ in await second.search_sparse({WORD: 1.0}, VectorFilter(tenant="acme"), 3)
    ] == [p.id]
    await second.close()


async def test_edge_term_statistics_are_rebuilt_on_reopen(tmp_path: Path) -> None:
    """Qdrant Edge keeps BM25 statistics itself: a new instance over the shard counts them
    again from the stored points (the same scores as before), per tenant."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    await first.upsert([point(axis(0), sparse={1: 1.0, 2: 0.5}) for _ in range(3)])
    await first.upsert([point(axis(0), sparse={2: 1.0}) for _ in range(5)])
    await first.upsert([point(axis(0), tenant="globex", sparse={1: 1.0}) for _ in range(9)])
    flt = VectorFilter(tenant="acme")
    before = await first.search_sparse({1: 1.0, 2: 1.0}, flt, 10)
    await first.close()
    second = EdgeVectorIndex(tmp_path / "shard")
    await second.ensure(DIM)
    assert await second.search_sparse({1: 1.0, 2: 1.0}, flt, 10) == before
    # term 2 is in all 8 points of the tenant (IDF 0.06 < MIN_IDF): left out next to term 1
    assert before[0][1] == pytest.approx(bm25_idf(3, 8), rel=1e-4)
    alone = await second.search_sparse({2: 1.0}, flt, 10)  # alone it is kept, rebuilt IDF
    assert sorted(round(s / bm25_idf(8, 8), 3) for _, s in alone) == [0.5] * 3 + [1.0] * 5
    await second.close()


async def test_edge_searches_leave_the_loop_while_much_is_unoptimized(tmp_path: Path) -> None:
    """Qdrant Edge: searches run inline on a new shard, in a thread once more than
    inline_unoptimized_max points wait for optimize(), inline again after it; a loaded
    shard's state is unknown until its first optimize()."""
    idx = EdgeVectorIndex(tmp_path / "shard", inline_unoptimized_max=3)
    await idx.ensure(DIM)
    assert idx.searches_inline
    await idx.upsert([point(axis(i)) for i in range(4)])
    assert not idx.searches_inline
    assert len(await idx.search(axis(0), VectorFilter(tenant="acme"), 10)) == 4
    await idx.optimize()
    assert idx.searches_inline
    await idx.close()
    again = EdgeVectorIndex(tmp_path / "shard")
    await again.ensure(DIM)
    assert not again.searches_inline
    await again.optimize()
    assert again.searches_inline
    assert len(await again.search(axis(0), VectorFilter(tenant="acme"), 10)) == 4
    await again.close()


async def test_edge_optimize_builds_bounded_segments(tmp_path: Path) -> None:
    """Qdrant Edge: optimize() builds segments of at most segment_kb and indexes them, never
    merging the shard into one (whose rebuild held the process for seconds, growing with the
    shard), also on a shard created before with the engine's defaults; answers unchanged."""
    rng = random.Random(5)
    flt = VectorFilter(tenant="acme")
    first = EdgeVectorIndex(tmp_path / "shard", segment_kb=None)
    await first.ensure(DIM)
    await first.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(100)])
    await first.close()
    # 4 KB of 8-dim vectors: 128 points a segment at most, indexed from 64
    idx = EdgeVectorIndex(tmp_path / "shard", segment_kb=4)
    await idx.ensure(DIM)
    for _ in range(4):
        await idx.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(100)])
        await idx.optimize()
    layout = idx.layout()
    assert layout["points"] == 500
    assert layout["segments"] >= 4  # 500 points in segments of at most 128
    assert layout["unindexed_points"] == 0
    q = [rng.gauss(0, 1) for _ in range(DIM)]
    hits = await idx.search(q, flt, 500)
    assert len(hits) == 500
    await idx.close()


async def test_edge_segments_setting_reaches_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qdrant Edge: ``MEMSTREAM_INDEX_SEGMENTS`` becomes the engine's merge target, in the
    shard's persisted config, also for a shard created before without it (its load applies
    the setting); unset, the engine keeps its default."""
    from memstream.consumers.stack import make_vector_index
    from memstream.schemas.settings import Settings

    def optimizers() -> Any:
        config = json.loads((tmp_path / "qdrant" / "memories" / "edge_config.json").read_text())
        return (config.get("optimizers") or {}).get("default_segment_number")

    for wanted, expected in ((None, None), ("6", 6), ("3", 3)):
        if wanted is None:
            monkeypatch.delenv("MEMSTREAM_INDEX_SEGMENTS", raising=False)
        else:
            monkeypatch.setenv("MEMSTREAM_INDEX_SEGMENTS", wanted)
        idx = make_vector_index(Settings(state_dir=tmp_path, collection="memories"))
        await idx.ensure(DIM)
        assert optimizers() == expected
        await idx.close()


async def test_edge_writes_start_an_optimize_once_a_segment_waits(tmp_path: Path) -> None:
    """Qdrant Edge: once half a segment's worth of points is written since the last
    optimize, the writes start one themselves (each pause stays about that long, whatever
    the maintenance interval) and report its time; fewer points start none.
    optimize_builds says whether an optimize would build now."""
    told: list[tuple[float, BaseException | None]] = []
    idx = EdgeVectorIndex(
        tmp_path / "shard", segment_kb=4, on_optimized=lambda s, e: told.append((s, e))
    )
    await idx.ensure(DIM)
    rng = random.Random(6)
    await idx.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(60)])
    assert idx.optimizing is None  # 60 of the 64 points that make one due
    assert not idx.optimize_builds()
    await idx.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(10)])
    running = idx.optimizing
    assert running is not None
    assert idx.optimize_builds()  # what the writes' optimize is about to build
    await running
    assert idx.layout()["unindexed_points"] == 0
    assert not idx.optimize_builds()
    assert len(told) == 1 and told[0][0] >= 0 and told[0][1] is None
    await idx.close()


async def test_edge_shard_with_the_engine_idf_modifier_is_refused(tmp_path: Path) -> None:
    """Qdrant Edge: a shard whose bm25 is scored by the engine (another layout) is refused
    with a ConfigurationError that says how to recover, never answered with other scores."""
    dense = qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)
    sparse = qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)
    config = qe.EdgeConfig(vectors={"dense": dense}, sparse_vectors={"bm25": sparse})
    qe.EdgeShard.create(str(tmp_path / "shard"), config).close()
    idx = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="rebuild the index from Postgres"):
        await idx.ensure(DIM)


def test_edge_acknowledged_upsert_survives_a_killed_process(tmp_path: Path) -> None:
    """Qdrant Edge: an upsert that returned is replayed from the WAL after the process dies."""
    p = point(axis(0))
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from memstream.storage.edge_layout import edge_filter
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


async def test_edge_leaves_out_query_terms_in_nearly_every_point(tmp_path: Path) -> None:
    """Qdrant Edge only (the server applies IDF itself): a query term in every point of the
    corpus is left out next to a rarer one, so points sharing only that term are not hits;
    alone, it still finds them."""
    index = edge_factory(tmp_path)()
    await index.ensure(DIM)
    rare = point(axis(0), sparse={1: 1.0, 2: 1.0})
    common = [point(axis(0), sparse={1: 1.0, 3: 1.0}) for _ in range(30)]
    await index.upsert([rare, *common])
    flt = VectorFilter(tenant="acme")
    assert [mid for mid, _ in await index.search_sparse({1: 1.0, 2: 1.0}, flt, 50)] == [rare.id]
    assert len(await index.search_sparse({1: 1.0}, flt, 50)) == 31
    await index.close()


async def test_edge_checks_expiry_only_while_a_point_of_the_tenant_has_expired(
    tmp_path: Path,
) -> None:
    """Qdrant Edge keeps each tenant's expiry times (through overwrites, deletes and a reopen)
    and adds the expiry condition only while one of the tenant's points has expired; an
    expired point is hidden whenever it is stored."""
    index = edge_factory(tmp_path)()
    await index.ensure(DIM)
    flt = VectorFilter(tenant="acme", now=NOW)
    durable, later = point(axis(0)), point(axis(0), expires_at=NOW + 60)
    await index.upsert([durable, later, point(axis(0), tenant="globex", expires_at=NOW - 1)])
    assert not index.may_expire("acme", NOW) and index.may_expire("globex", NOW)
    assert edge_filter(flt, index.may_expire("acme", NOW)).must_not is None
    assert index.may_expire("acme", NOW + 60)  # once it has passed
    expired = point(axis(0), expires_at=NOW - 1)
    await index.upsert([expired])
    assert index.may_expire("acme", NOW)
    for leg in ("dense", "sparse"):
        assert await ids(index, flt, leg=leg) == {durable.id, later.id}  # hidden
    revived = dataclasses.replace(expired, expires_at=None)  # pinned: no expiry
    await index.upsert([revived])
    assert not index.may_expire("acme", NOW)
    assert await ids(index, flt) == {durable.id, later.id, expired.id}
    await index.upsert([expired])
    await index.close()
    reopened = edge_factory(tmp_path)()
    await reopened.ensure(DIM)
    assert reopened.may_expire("acme", NOW) and reopened.may_expire("globex", NOW)
    assert await ids(reopened, flt) == {durable.id, later.id}
    await reopened.delete("acme", [expired.id])
    assert not reopened.may_expire("acme", NOW) and reopened.may_expire("acme", NOW + 60)
    await reopened.close()


async def test_edge_layout_counts_points_not_yet_in_a_graph(tmp_path: Path) -> None:
    """Qdrant Edge: points below the indexing threshold are reported as not yet indexed."""
    index = edge_factory(tmp_path)()
    await index.ensure(DIM)
    assert index.layout()["points"] == 0
    await index.upsert([point(axis(i % DIM)) for i in range(5)])
    layout = index.layout()
    assert layout["points"] == 5 and layout["unindexed_points"] == 5 and layout["segments"] >= 1
    await index.close()


async def test_edge_points_without_the_exact_owner_key_are_refused(tmp_path: Path) -> None:
    """A shard holding points without the exact owner key (another layout) is refused on
    open: own reads over it could not be exact."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    p = point(axis(0), user="ann", agent=None)
    await first.upsert([p])
    first.shard.update(qe.UpdateOperation.delete_payload([p.id], ["o_x"]))
    await first.close()
    second = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="without owner keys"):
        await second.ensure(DIM)

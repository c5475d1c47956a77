"""The VectorIndex contract, part 2: the keyword (BM25) leg. IDF over the tenant (or the
owner, or the collection), weighted sums, statistics that follow every write, and the terms
that match nothing. Every test runs against Qdrant Edge and the server adapter (local)."""

from __future__ import annotations

import pytest
from indexpoints import DIM, LOCAL_MODE, Factory, axis, bm25_idf, ids, point

from memstream.storage.ports import IdfScope, VectorFilter, VectorIndex

pytestmark = [LOCAL_MODE]


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

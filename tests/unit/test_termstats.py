"""TermStats: the per-corpus document frequencies behind the Edge adapter's keyword leg."""

from __future__ import annotations

import math

import pytest

from memstream.storage.ports import VectorFilter
from memstream.storage.termstats import TermStats, idf


def test_idf_is_qdrants_formula() -> None:
    """IDF is Qdrant's BM25 formula and falls as a term gets commoner."""
    assert idf(10, 1) == pytest.approx(math.log((10 - 1 + 0.5) / 1.5 + 1))
    assert idf(10, 10) < idf(10, 5) < idf(10, 1)


def test_weigh_multiplies_query_weights_by_the_corpus_idf() -> None:
    """Query weights are scaled by the IDF of the filtered corpus only; unknown terms and
    corpora weigh nothing."""
    stats = TermStats("tenant")
    acme = stats.corpora("acme", "ann", None)
    for terms in ([1, 2], [1], [1, 3]):
        stats.add(acme, terms)
    stats.add(stats.corpora("globex", "bob", None), [2])
    weights = stats.weigh(stats.corpus_of(VectorFilter(tenant="acme")), {1: 2.0, 2: 1.0, 9: 1.0})
    assert weights == {1: pytest.approx(2.0 * idf(3, 3)), 2: pytest.approx(idf(3, 1))}
    assert stats.weigh(("t", "initech"), {1: 1.0}) == {}


def test_removing_every_point_forgets_the_corpus() -> None:
    """A corpus whose points are all removed has no points and weighs nothing."""
    stats = TermStats("tenant")
    acme = stats.corpora("acme", None, "bot")
    stats.add(acme, [1, 2])
    stats.add(acme, [1, 2], -1)
    assert stats.points(("t", "acme")) == 0
    assert stats.weigh(("t", "acme"), {1: 1.0}) == {}


def test_a_point_without_terms_is_in_no_corpus() -> None:
    """A point without terms is counted in no corpus."""
    stats = TermStats("collection")
    stats.add(stats.corpora("acme", "ann", None), [])
    assert stats.points(("",)) == 0


@pytest.mark.parametrize(
    ("user", "agent", "corpus"),
    [
        ("ann", "bot", ("ua", "acme", "ann", "bot")),
        ("ann", None, ("u", "acme", "ann")),
        (None, "bot", ("a", "acme", "bot")),
        (None, None, ("t", "acme")),
    ],
)
def test_owner_scope_picks_the_owner_the_filter_names(
    user: str | None, agent: str | None, corpus: tuple[str, ...]
) -> None:
    """An owner-scoped index picks the corpus of exactly the owner the filter names."""
    stats = TermStats("owner")
    stats.add(stats.corpora("acme", "ann", "bot"), [1])
    stats.add(stats.corpora("acme", "ann", "other"), [1])
    stats.add(stats.corpora("acme", "zed", "bot"), [2])
    flt = VectorFilter(tenant="acme", user=user, agent=agent)
    assert stats.corpus_of(flt) == corpus
    expected_n = {"ua": 1, "u": 2, "a": 2, "t": 3}[corpus[0]]
    assert stats.points(corpus) == expected_n


def test_owner_keys_are_unambiguous_and_short() -> None:
    """The Edge adapter's owner keys: a point carries the key of its tenant, its user, its
    agent and of both, each in its own field; ids holding separators or quotes cannot collide
    with other owners; every key fits the engine's 15-byte inline keyword values."""
    from memstream.storage.edge_layout import EXACT_FIELD, OWNER_FIELDS, owner_key, owner_payload

    assert owner_payload("acme", "ann", "bot") == {
        OWNER_FIELDS["t"]: owner_key("acme", None, None),
        OWNER_FIELDS["u"]: owner_key("acme", "ann", None),
        OWNER_FIELDS["a"]: owner_key("acme", None, "bot"),
        OWNER_FIELDS["ua"]: owner_key("acme", "ann", "bot"),
        EXACT_FIELD: owner_key("acme", "ann", "bot"),
    }
    tenant_key = owner_key("acme", None, None)
    assert owner_payload("acme", None, None) == {
        OWNER_FIELDS["t"]: tenant_key,
        EXACT_FIELD: tenant_key,
    }
    assert owner_payload("acme", "ann", None)[EXACT_FIELD] == owner_key("acme", "ann", None)
    assert len(set(owner_payload("acme", "ann", "bot").values())) == 4
    assert owner_key('a","u', "b", None) != owner_key("a", 'u","b', None)
    assert owner_key("acme", "ann", None) != owner_key("acme", None, "ann")
    assert owner_key("acme", None, None) != owner_key("acme", "", None)
    long_id = "x" * 500
    for key in (*owner_payload("acme", "ann", "bot").values(), owner_key(long_id, long_id, None)):
        assert len(key.encode()) <= 15


def test_weigh_leaves_out_terms_in_nearly_every_point_when_others_remain() -> None:
    """A term in 19 of 20 points (IDF ~0.05) is left out next to a rarer term, kept alone."""
    stats = TermStats("tenant")
    acme = stats.corpora("acme", "ann", None)
    for i in range(20):
        stats.add(acme, [1, 2] if i < 2 else [1] if i < 19 else [3])
    corpus = stats.corpus_of(VectorFilter(tenant="acme"))
    assert idf(20, 19) < 0.1 < idf(20, 2)
    assert stats.weigh(corpus, {1: 1.0, 2: 1.0}, min_idf=0.1) == {2: pytest.approx(idf(20, 2))}
    assert stats.weigh(corpus, {1: 1.0}, min_idf=0.1) == {1: pytest.approx(idf(20, 19))}
    assert set(stats.weigh(corpus, {1: 1.0, 2: 1.0})) == {1, 2}  # no threshold: both

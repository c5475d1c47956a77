"""BM25 term weights and score fusion."""

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from memstream.pipeline.fuse import linear
from memstream.pipeline.lexical import document_vector, query_vector, term_id, terms
from memstream.schemas.memory import dated


def test_terms_lowercase_stem_and_drop_stopwords() -> None:
    """Stopwords go, case folds, inflections share a stem."""
    assert terms("The Support Groups were helping") == ["support", "group", "help"]
    assert terms("group") == terms("groups")


def test_term_ids_are_stable_and_non_negative() -> None:
    """Ids do not depend on the process (no salted hash) and fit a signed 32-bit int."""
    assert term_id("support") == term_id("support")
    assert 0 <= term_id("support") < 2**31


def test_context_counts_less_than_own_words() -> None:
    """A word from an earlier turn weighs less than the same word said in the turn."""
    own = document_vector("I adopted a puppy", [])
    ctx = document_vector("I adopted it", ["We talked about a puppy"])
    pup = term_id("puppi")
    assert 0 < ctx[pup] < own[pup]


def test_only_the_last_context_turns_count() -> None:
    """Only the two turns right before the current one add context."""
    vec = document_vector("hello", ["zebra talk", "lion talk", "tiger talk"])
    assert term_id("zebra") not in vec and term_id("tiger") in vec


def test_longer_documents_weigh_each_term_less() -> None:
    """Length normalisation: one mention in a long turn counts less than in a short one."""
    short = document_vector("puppy")[term_id("puppi")]
    long = document_vector("puppy " + " ".join(f"word{i}" for i in range(80)))[term_id("puppi")]
    assert long < short


def test_query_vector_is_distinct_stems() -> None:
    """Repeated query words count once, with weight 1."""
    q = query_vector("groups group GROUP support")
    assert sorted(q.values()) == [1.0, 1.0]


def test_dated_writes_month_and_year_as_words() -> None:
    """The date prefix uses words a question would use."""
    assert dated("x", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)) == "[8 May 2023] x"


def test_linear_fusion_normalises_each_leg() -> None:
    """Each leg is min-max scaled, then weighted: agreement wins, weights tilt."""
    fused = linear(
        {"kw": [("a", 10.0), ("b", 5.0)], "dense": [("b", 0.9), ("c", 0.1)]},
        {"kw": 0.7, "dense": 0.3},
    )
    assert [i for i, _ in fused] == ["a", "b", "c"]
    assert fused[0][1] == 0.7 and abs(fused[1][1] - 0.3) < 1e-9


@given(st.lists(st.tuples(st.text(min_size=1, max_size=3), st.floats(0, 100)), max_size=20))
def test_linear_fusion_scores_stay_in_range(results: list[tuple[str, float]]) -> None:
    """Fused scores lie within 0..sum(weights)."""
    for _, s in linear({"kw": results}, {"kw": 0.7}):
        assert -1e-9 <= s <= 0.7 + 1e-9


_LEG = st.lists(
    st.tuples(st.sampled_from("abcdefgh"), st.sampled_from([0.0, 0.5, 1.0, 2.0])), max_size=8
)


@given(_LEG, _LEG)
def test_linear_fusion_breaks_ties_by_first_seen(
    dense: list[tuple[str, float]], keyword: list[tuple[str, float]]
) -> None:
    """Best first; equal fused scores keep the order in which the ids were first seen."""
    fused = linear({"dense": dense, "keyword": keyword}, {"dense": 0.5, "keyword": 0.5})
    first_seen = list(dict.fromkeys(mid for mid, _ in [*dense, *keyword]))
    assert [m for m, _ in fused] == sorted(
        first_seen, key=lambda m: (-dict(fused)[m], first_seen.index(m))
    )

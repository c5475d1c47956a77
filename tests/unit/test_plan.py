"""The store decision over a dedupe batch (pipeline/plan.py)."""

from datetime import UTC, datetime

from memstream.pipeline.dedupe import key
from memstream.pipeline.plan import Action, plan
from memstream.schemas.memory import Candidate, Owner

AT = datetime(2026, 1, 1, tzinfo=UTC)


def cand(content: str, cid: str, user: str = "u", tenant: str = "t") -> Candidate:
    return Candidate(
        candidate_id=cid,
        owner=Owner(tenant=tenant, user=user),
        session="s",
        content=content,
        source_event_id=f"e-{cid}",
        occurred_at=AT,
        redacted=True,
    )


def test_new_candidates_are_inserted_in_order() -> None:
    """With nothing stored and no neighbours, every candidate is an insert into its own id."""
    batch = [key(cand("I like tea", "1")), key(cand("we chose Postgres", "2"))]
    out = plan(batch, set(), {}, 0.9)
    assert [d.action for d in out] == [Action.INSERT, Action.INSERT]
    assert [d.target for d in out] == [k.memory_id for k in batch]
    assert [d.keyed for d in out] == batch


def test_exact_duplicate_of_a_stored_memory_merges() -> None:
    """A candidate whose (tenant, id) storage found live is merged into that memory; the same
    id in another tenant is not."""
    mine, other = key(cand("I like tea", "1")), key(cand("I like tea", "2", tenant="t2"))
    out = plan([mine, other], {("t", mine.memory_id)}, {}, 0.9)
    assert [d.action for d in out] == [Action.MERGE, Action.INSERT]
    assert out[0].target == mine.memory_id


def test_near_duplicate_merges_into_the_neighbour() -> None:
    """A close neighbour with mostly the same words takes the candidate; a close one with
    other words, or a mere echo of the candidate's own id, does not."""
    k = key(cand("I really like green tea in the morning", "1"))
    close = [("m-near", 0.95, "I really like green tea in the morning!")]
    assert plan([k], set(), {0: close}, 0.9)[0].action is Action.NEAR_MERGE
    assert plan([k], set(), {0: close}, 0.9)[0].target == "m-near"
    unlike = [("m-other", 0.97, "the deploy failed on Friday night")]
    assert plan([k], set(), {0: unlike}, 0.9)[0].action is Action.INSERT
    own = [(k.memory_id, 0.99, "I really like green tea in the morning")]
    assert plan([k], set(), {0: own}, 0.9)[0].action is Action.INSERT
    assert plan([k], set(), {0: close}, 0.99)[0].action is Action.INSERT  # below the bar


def test_neighbours_are_matched_by_position() -> None:
    """Neighbours found for one candidate never decide another's fate."""
    a, b = key(cand("I really like green tea", "1")), key(cand("we ship on Fridays", "2"))
    out = plan([a, b], set(), {1: [("m", 0.99, "I really like green tea")]}, 0.9)
    assert [d.action for d in out] == [Action.INSERT, Action.INSERT]


def test_a_redelivered_candidate_in_the_same_batch_is_skipped() -> None:
    """The second copy of one candidate id is skipped; a different candidate with the same
    content (another source event) still goes on, for the store stage to merge in order."""
    first, again = key(cand("I like tea", "1")), key(cand("I like tea", "1"))
    twin = key(cand("I like tea", "3"))
    out = plan([first, again, twin], set(), {}, 0.9)
    assert [d.action for d in out] == [Action.INSERT, Action.SKIP, Action.INSERT]
    assert out[2].target == first.memory_id


def test_a_candidate_folded_on_an_earlier_try_stays_folded() -> None:
    """A redelivered candidate that an earlier try folded is refolded into the same memory,
    even with no neighbours (index away), ahead of any near-duplicate decision, and ahead of
    an exact duplicate stored since (another turn with the same text): merged there too, its
    turn would be held by two memories (seen in `memstream bench faults`)."""
    k = key(cand("I really like green tea", "1"))
    out = plan([k], set(), {}, 0.9, folded={0: "m-earlier"})
    assert [(d.action, d.target) for d in out] == [(Action.REFOLD, "m-earlier")]
    close = {0: [("m-other", 0.99, "I really like green tea a lot")]}
    assert plan([k], set(), close, 0.9, folded={0: "m-earlier"})[0].target == "m-earlier"
    live = plan([k], {("t", k.memory_id)}, {}, 0.9, folded={0: "m-earlier"})
    assert [(d.action, d.target) for d in live] == [(Action.REFOLD, "m-earlier")]
    unfolded = plan([k], {("t", k.memory_id)}, {}, 0.9)
    assert unfolded[0].action is Action.MERGE  # without a fold, the exact duplicate takes it


def test_near_duplicate_of_a_batch_mate_folds_into_it() -> None:
    """A candidate close to an earlier candidate of its batch that is inserted is folded into
    that one's memory; not into a mate that was itself folded elsewhere, and not without the
    words in common. Without batch neighbours both are inserted, as before."""
    first = key(cand("I really like green tea in the morning", "1"))
    twin = key(cand("I really like green tea in the morning!", "2"))
    other = key(cand("the deploy failed on Friday night", "3"))
    out = plan([first, twin, other], set(), {0: [], 1: [], 2: []}, 0.9, None, {1: [(0, 0.97)]})
    assert [d.action for d in out] == [Action.INSERT, Action.BATCH_MERGE, Action.INSERT]
    assert out[1].target == first.memory_id
    assert plan([first, twin], set(), {}, 0.9)[1].action is Action.INSERT
    stored = {0: [("m-old", 0.96, "I really like green tea in the morning.")]}
    out = plan([first, twin], set(), stored, 0.9, None, {1: [(0, 0.97)]})
    assert [d.action for d in out] == [Action.NEAR_MERGE, Action.INSERT]
    unlike = plan([first, other], set(), {}, 0.9, None, {1: [(0, 0.95)]})
    assert [d.action for d in unlike] == [Action.INSERT, Action.INSERT]

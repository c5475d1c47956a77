"""dedupe keys and near-duplicate decisions."""

from datetime import UTC, datetime

import numpy as np
import pytest

from memstream.pipeline.dedupe import (
    Unindexed,
    batch_neighbours,
    group_of,
    key,
    unindexed_neighbours,
    unit_rows,
)
from memstream.schemas.ids import content_hash, memory_id
from memstream.schemas.memory import Candidate, MemoryType, Owner, Scope


def cand(content: str, user: str = "u", tenant: str = "t") -> Candidate:
    return Candidate(
        candidate_id="c",
        owner=Owner(tenant=tenant, user=user),
        session="s",
        content=content,
        source_event_id="e",
        occurred_at=datetime.now(UTC),
    )


def test_exact_duplicates_share_an_id_per_owner() -> None:
    """Case and white-space variants of one text by one owner map to one memory id."""
    assert key(cand("I like  Tea")).memory_id == key(cand("i like tea")).memory_id
    assert key(cand("I like tea", user="v")).memory_id != key(cand("I like tea")).memory_id
    assert key(cand("I like tea", tenant="t2")).memory_id != key(cand("I like tea")).memory_id


def test_exact_duplicates_share_an_id_per_reach() -> None:
    """The same text in another scope, another project (project scope) or another session
    (session and run scopes) is another memory; a user memory keeps the id it had before
    scope took part, so dedupe goes on across a deploy."""

    def of(scope: Scope, project: str | None = None, session: str = "s") -> str:
        c = cand("we ship on friday").model_copy(
            update={"scope": scope, "project": project, "session": session}
        )
        return key(c).memory_id

    legacy = memory_id("t", "u", None, "episode", content_hash("we ship on friday"))
    assert of(Scope.USER) == legacy == of(Scope.USER, project="p", session="s2")
    ids = [
        of(Scope.USER),
        of(Scope.GLOBAL),
        of(Scope.PROJECT),
        of(Scope.PROJECT, "alpha"),
        of(Scope.PROJECT, "beta"),
        of(Scope.SESSION),
        of(Scope.SESSION, session="s2"),
        of(Scope.RUN),
    ]
    assert len(set(ids)) == len(ids)
    assert of(Scope.PROJECT, "alpha", session="s2") == of(Scope.PROJECT, "alpha")
    assert of(Scope.GLOBAL, "alpha") == of(Scope.GLOBAL)


def test_near_duplicate_needs_closeness_and_shared_words() -> None:
    """Cosine alone does not merge (short turns of one day embed alike); cosine plus mostly the
    same words does; the candidate's own id never counts."""
    from memstream.pipeline.dedupe import near_duplicate

    text = "I have a meeting with the dentist on Friday morning!!"
    same = [("m1", 0.97, "I have a meeting with the dentist on Friday morning.")]
    other = [("m2", 0.97, "Wow, that sounds great!")]
    assert near_duplicate(text, same, "own", 0.95) == "m1"
    assert near_duplicate(text, other, "own", 0.95) is None
    assert near_duplicate(text, [("own", 0.99, text)], "own", 0.95) is None
    assert near_duplicate(text, [("m1", 0.90, text)], "own", 0.95) is None


def test_near_duplicates_name_the_same_numbers() -> None:
    """Texts alike in meaning and words but naming other numbers (a time, a note, an amount)
    are not folded: the fold would keep only the old number; the same numbers are."""
    from memstream.pipeline.dedupe import near_duplicate

    text = "remember that the flight to Lisbon leaves at 10:30 from gate 12"
    moved = [("m1", 0.98, "remember that the flight to Lisbon leaves at 11:30 from gate 12")]
    again = [("m2", 0.98, "remember that the flight to Lisbon leaves at 10:30 from gate 12!")]
    note = "please remember note 30 for the project review"
    assert near_duplicate(text, moved, "own", 0.95) is None
    assert near_duplicate(text, again, "own", 0.95) == "m2"
    assert (
        near_duplicate(
            note, [("m3", 0.97, "please remember note 20 for the project review")], "own", 0.95
        )
        is None
    )


def test_batch_neighbours_are_earlier_same_owner_same_type_and_close() -> None:
    """Each looked-up candidate gets the earlier ones of its owner and type at least as close
    as the bar (cosine of the vectors, whatever their length); another owner, another type,
    another reach (here a session memory), a later candidate or one not looked up never
    counts."""
    batch = [
        cand("a"),
        cand("b"),
        cand("c", user="other"),
        cand("d").model_copy(update={"type": MemoryType.PREFERENCE}),
        cand("e"),
        cand("f").model_copy(update={"scope": Scope.SESSION}),
    ]
    x, near, far = [1.0, 0.0], [2.0, 0.2], [0.0, 1.0]  # cos(x, near) = 0.995
    vectors = {0: x, 1: near, 2: x, 3: x, 4: far, 5: x}
    assert batch_neighbours(batch, vectors, 0.99) == {1: [(0, pytest.approx(0.995, abs=1e-3))]}
    assert batch_neighbours(batch, {1: near, 4: far}, 0.99) == {}
    assert batch_neighbours(batch, vectors, 0.999) == {}


def test_unindexed_neighbours_are_same_group_and_close_best_first() -> None:
    """A memory stored by the batch before, its point not yet written, is found for a close
    candidate of its owner, type and reach, best first; never for another owner, another
    reach or a distant vector, nor for a candidate without a vector."""
    stored = cand("we ship on friday")
    other_owner = cand("we ship on friday", user="v")
    session_bound = stored.model_copy(update={"scope": Scope.SESSION})
    waiting = [
        Unindexed("m-far", group_of(stored), [0.0, 1.0], "far"),
        Unindexed("m-close", group_of(stored), [1.0, 0.05], "close"),
        Unindexed("m-closer", group_of(stored), [2.0, 0.0], "closer"),  # not unit length
        Unindexed("m-other", group_of(other_owner), [1.0, 0.0], "other"),
        Unindexed("m-session", group_of(session_bound), [1.0, 0.0], "session"),
    ]
    batch = [cand("we ship on friday!"), cand("we ship on friday?", user="w"), cand("x")]
    found = unindexed_neighbours(batch, {0: [1.0, 0.0], 1: [1.0, 0.0]}, waiting, 0.9)
    assert list(found) == [0]
    assert [(mid, text) for mid, _, text in found[0]] == [
        ("m-closer", "closer"),
        ("m-close", "close"),
    ]
    assert found[0][0][1] == pytest.approx(1.0)
    assert unindexed_neighbours(batch, {0: [1.0, 0.0]}, [], 0.9) == {}


def test_unit_rows_feed_both_checks_as_the_lists_do() -> None:
    """The batch's vectors made unit float32 rows once, by position, give both checks the
    same answers as the lists of floats they were made from; none in, none out."""
    batch = [cand("a"), cand("b"), cand("c")]
    vectors = {0: [3.0, 0.0], 2: [2.0, 0.2]}
    units = unit_rows(vectors)
    assert list(units) == [0, 2]
    assert all(u.dtype == np.float32 for u in units.values())
    assert np.linalg.norm(units[0]) == pytest.approx(1.0) and units[0][0] == pytest.approx(1.0)
    from_units, from_lists = (
        batch_neighbours(batch, units, 0.99),
        batch_neighbours(batch, vectors, 0.99),
    )
    assert from_units == {2: [(0, pytest.approx(from_lists[2][0][1]))]}
    waiting = [Unindexed("m", group_of(batch[0]), [1.0, 0.0], "a")]
    by_units = unindexed_neighbours(batch, units, waiting, 0.9)
    by_lists = unindexed_neighbours(batch, vectors, waiting, 0.9)
    assert set(by_units) == set(by_lists) == {0, 2}
    for i, found in by_units.items():
        assert [(m, pytest.approx(sim), t) for m, sim, t in by_lists[i]] == found
    assert unit_rows({}) == {}


def test_a_waiting_memory_takes_its_unit_row_as_given() -> None:
    """A memory made to wait with the unit row its batch's dedupe made keeps that very array
    (no second conversion); with a list of floats it is made a unit float32 row itself."""
    row = unit_rows({0: [3.0, 4.0]})[0]
    given = Unindexed("m", group_of(cand("a")), row, "a")
    assert given.vector is row
    made = Unindexed("m", group_of(cand("a")), [3.0, 4.0], "a").vector
    assert isinstance(made, np.ndarray) and made.dtype == np.float32
    assert made.tolist() == pytest.approx([0.6, 0.8])

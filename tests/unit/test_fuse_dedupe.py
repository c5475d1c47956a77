"""dedupe keys and near-duplicate decisions."""

from datetime import UTC, datetime

from memstream.pipeline.dedupe import key
from memstream.schemas.memory import Candidate, Owner


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

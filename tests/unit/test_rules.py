"""Rule-based typed extraction."""

import pytest

from memstream.pipeline.extract import extract
from memstream.pipeline.rules import RuleExtractor, fact_key
from memstream.schemas.events import Message, Role, TurnEvent


def typed(text: str, role: Role = Role.USER, threshold: float = 0.55) -> list[tuple[str, str]]:
    ev = TurnEvent(tenant="t", user="u", messages=[Message(role=role, content=text)])
    return [(c.type.value, c.content) for c in RuleExtractor(threshold).candidates(ev)]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("I prefer window seats on long flights.", "preference"),
        ("Always answer me in Portuguese.", "rule"),
        ("Never call me before 9am.", "rule"),
        ("We decided to ship the beta on Friday.", "decision"),
        ("My name is Ana Souza.", "profile"),
        ("I work at Globex as a data engineer.", "profile"),
        ("The fix was to pin urllib3 below 2.", "fix"),
        ("Remind me to renew my passport.", "todo"),
        ("My home city is Lisbon.", "fact"),
        ("Lesson learned: run the migrations before the deploy.", "lesson_learned"),
    ],
)
def test_cues_give_their_type(text: str, kind: str) -> None:
    """Each cue phrase yields a candidate of its memory type."""
    assert typed(text) == [(kind, text)]


def test_chit_chat_and_plain_statements_stay_episodes() -> None:
    """Acks and sentences without a cue give no typed candidate, only the episode."""
    assert typed("ok thanks") == []
    assert typed("The weather was nice on the walk today.") == []
    ev = TurnEvent(tenant="t", user="u", messages=[Message(role=Role.USER, content="ok thanks")])
    assert [c.type.value for c in extract(ev)] == ["episode"]


def test_threshold_gates_weak_candidates() -> None:
    """Raising the salience threshold drops weaker types (fact 0.6) but keeps strong (profile)."""
    text = "My home city is Lisbon. My name is Ana."
    assert [k for k, _ in typed(text, threshold=0.85)] == ["profile"]


def test_user_only_types_ignore_the_assistant() -> None:
    """An assistant saying 'I prefer' is not the user's preference; a fix it explains is kept."""
    assert typed("I prefer concise answers.", role=Role.ASSISTANT) == []
    assert typed("The fix was to restart the worker.", role=Role.ASSISTANT)[0][0] == "fix"


def test_fact_key_names_the_subject() -> None:
    """Facts carry the subject they can later be updated by."""
    assert fact_key("My home city is Lisbon") == "home city"
    assert fact_key("my dog is called Rex") == "dog"
    assert fact_key("nothing here") is None


def test_sentences_never_split_inside_a_token() -> None:
    """An email, URL or version number with dots stays whole in a typed candidate, so the
    redact stage sees (and replaces) the whole value, never a fragment."""
    out = typed("My email is alice@example.com and my site is www.alice.dev. I prefer v2.5 builds.")
    assert out == [
        ("fact", "My email is alice@example.com and my site is www.alice.dev."),
        ("preference", "I prefer v2.5 builds."),
    ]

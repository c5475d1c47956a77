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


# Sentences where RE2 and Python's re read a character differently: Turkish capitals that
# re.I folds to "i", the Kelvin sign and the long s, non-ASCII word characters and spaces, a
# leading space before an anchored cue
_AWKWARD = [
    "\u0130 prefer tea.",
    "\u0131 need to call the bank.",
    "My café is on Rua Augusta.",
    "my naïve plan is ready",
    "My favourite\u00a0tea is sencha, says Zoë.",
    "Rem\u0131nd me to water the plants.",
    "The \u017folution was to restart it.",
    "We decided to use the \u212aelvin scale.",
    "   always reply in English.",
    "I'm an ingénieur at Airbus.",
    "First, preheat the oven; then bake for 20 minutes.",
    "Tip: keep the receipts.",
    "I learned that the hard way.",
]


def _corpus() -> list[TurnEvent]:
    from memstream.consumers.bench.conversations import long_text, sessions, turns

    events = [
        TurnEvent(tenant="t", user="u", messages=[Message(role=role, content=text)])
        for text in _AWKWARD
        for role in (Role.USER, Role.ASSISTANT)
    ]
    for t in turns(600, sessions(2, 2, 2), 11, text=long_text, replies=1.0):
        messages = [Message(role=Role(role), content=content) for role, content in t.messages]
        events.append(TurnEvent(tenant=t.tenant, user=t.user, messages=messages))
    return events


def test_the_screen_never_drops_what_the_rules_take() -> None:
    """The RE2 screen only skips work: over the benchmark's generated turns and sentences
    where RE2 and re disagree (Turkish i, Kelvin sign, Unicode words and spaces), screened
    extraction gives exactly what every rule's regex on every sentence gives, and the
    sentences the screen passes on include every one a rule matches."""
    from memstream.pipeline.rules import _SCREEN, _SENTENCE, RULES

    screened, reference = RuleExtractor(), RuleExtractor(screened=False)
    typed_total = 0
    for ev in _corpus():
        got = reference.candidates(ev)
        assert screened.candidates(ev) == got
        typed_total += len(got)
        for m in ev.messages:
            for sm in _SENTENCE.finditer(m.content):
                sentence = sm.group(0).strip()
                matching = [i for i, r in enumerate(RULES) if r.pattern.search(sentence)]
                assert set(matching) <= set(_SCREEN.rules(sentence)), sentence
    assert typed_total > 300  # the corpus does exercise the rules
    for text in _AWKWARD:  # each awkward sentence is typed, screened or not
        assert typed(text), text


def test_a_cue_the_screen_cannot_loosen_is_refused() -> None:
    """A cue with syntax the screen has no RE2 form for (a digit class, an end anchor) is
    refused when the rules load, instead of being screened wrongly."""
    from memstream.pipeline.rules import _loosened

    assert _loosened(r"\bmy (\w+ )?is\b") == r"(?i)my ([^\s]+ )?is"
    for cue in (r"\bstep \d\b", r"\bdone$"):
        with pytest.raises(ValueError, match="no RE2 screen"):
            _loosened(cue)

"""Redaction: the Python-side prefilters and shortcuts give the same answers as what they skip."""

from __future__ import annotations

import hmac
import random

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.pipeline.redact import (
    _DETECTORS,
    _PHONE_TRIGGER,
    Redactor,
    _assign,
    _core,
    _cues,
    _pii,
    _secrets,
)
from memstream.pipeline.redact._core import Solo
from memstream.pipeline.redact._gitleaks import GitleaksRules


def _words(words: list[str], min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[str]:
    """Strings made of the given pieces (several characters each, unlike ``st.text``)."""
    return st.lists(st.sampled_from(words), min_size=min_size, max_size=max_size).map("".join)


_TRIGGERS = [t for _, _, t in _DETECTORS if t is not None] + [_PHONE_TRIGGER]


def _pattern(t: _core.Trigger) -> str:
    return t.pattern if isinstance(t, Solo) else t


def _one_set(text: str) -> list[int]:
    s = re2.Set.SearchSet()
    for t in _TRIGGERS:
        s.Add(_pattern(t))
    s.Compile()
    return sorted(s.Match(text) or ())


_TRIGGER_TEXTS = [
    "",
    "plain chat without anything",
    "-----begin rsa private key-----",
    "a" * 31 + " " + "b" * 32,
    '{"kty": "oct"}',
    "s" + "u" + "a" * 56,
    "swmkey-1-abc age-secret-key-1xyz",
    "eyjhbgcioijiuzi1niis",
    "x0123456789abcdef",
    "https://u:p@h password=1 @ 4111 de44 1.2 ::1 123 45",
    "passport 12 usns mercy (555) 123-4567",
    "bl\u00e5b\u00e6r 1234 \u20ac 12-34 x" * 3,
]


@pytest.mark.parametrize("text", _TRIGGER_TEXTS)
def test_split_triggers_agree_with_one_set(text: str) -> None:
    """Triggers searched on their own (Solo) give the same answer as one set of all triggers."""
    assert _core.compile_set(_TRIGGERS).Match(text) == _one_set(text)


def test_each_solo_trigger_fires_on_its_own() -> None:
    """Each Solo trigger fires on a text made of its own run, and an empty set matches nothing."""
    solos = [i for i, t in enumerate(_TRIGGERS) if isinstance(t, Solo)]
    assert solos
    for text, want in [("a" * 32, 1), ("x" * 16, 1), ("s" + "u" + "a" * 56, 1)]:
        found = _core.compile_set(_TRIGGERS).Match(text)
        assert len(set(found) & set(solos)) >= want, text
    assert _core.compile_set([]).Match("anything") == []


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="aB1 \n\u00e9\u20ac\U0001f600\u07ff\u0800\uffff\U00010000", max_size=300))
def test_offset_table_maps_bytes_to_str(text: str) -> None:
    """The byte-to-str offset table of a non-ASCII text matches a per-character reference."""
    _, data, ends, extra = _core._encoded(text)
    if ends is None:
        assert data.isascii()
        return
    # reference: byte offset just past each non-ASCII character, extra bytes up to there
    want_ends, want_extra, total = [], [], 0
    for i, ch in enumerate(text):
        if ord(ch) > 0x7F:
            total += len(ch.encode()) - 1
            want_ends.append(i + 1 + total)
            want_extra.append(total)
    assert (ends, extra) == (want_ends, want_extra)


@pytest.mark.parametrize("n", [1, 16, 32, 64, 65, 200])
def test_placeholders_are_hmac_sha256_of_tenant_and_value(n: int) -> None:
    """The copied keyed state gives hmac.digest's result for keys of any length, every time."""
    rng = random.Random(n)
    key = bytes(rng.randrange(1, 256) for _ in range(n))
    r = Redactor(key=key)
    for value in ("ann@example.com", "x" * 300):
        want = hmac.digest(key, b"t\x00" + value.encode(), "sha256")[:4].hex()
        assert (
            r.placeholder("EMAIL", value, "t")
            == f"[EMAIL:{want}]"
            == r.placeholder("EMAIL", value, "t")
        )


_VALUES = st.text(alphabet="0123456789-./ +()x", max_size=14)


@settings(max_examples=300, deadline=None)
@given(_VALUES)
def test_date_shortcut(value: str) -> None:
    """The date shortcut answers exactly as the date pattern on generated values."""
    assert _pii._date_like(value) == (_pii._DATE_LIKE.search(value) is not None)


@pytest.mark.parametrize("value", ["2023-01-31", "31/12/2023", "1.2.99", "12-31-2023x"])
def test_date_shortcut_examples(value: str) -> None:
    """The date shortcut answers exactly as the date pattern on the edge cases."""
    assert _pii._date_like(value) == (_pii._DATE_LIKE.search(value) is not None)


_UNIT_CHUNKS = _words([" ", "\t", "\n", ",", ">", "#", "Apt", "Apartment", "Suite",
                                 "Ste.", "Unit", "Flat", "Floor", "Fl.", "1", "B", "x"],
                       max_size=12)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(_UNIT_CHUNKS)
def test_unit_shortcut(chunk: str) -> None:
    """The unit shortcut finds the same span as the unit pattern, or none when it does not."""
    got, want = _cues._unit(chunk), _cues._UNIT.search(chunk)
    assert (got is None) == (want is None)
    if got is not None:
        assert got.span() == want.span()


_CODE = _words(
    ["(", ")", " ", "\t", "\n", '"', "'", "`", "@", "&quot;", ";", ",", "a",
              "secret", "password", ".assign", "x1", "="],
    max_size=16,
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(_CODE)
def test_call_prefilter_never_hides_a_match(scan: str) -> None:
    """The call prefilter passes every text on which the call pattern matches."""
    if _assign._CALL.search(scan) is not None:
        assert _assign._maybe_call(scan)


@pytest.mark.parametrize(
    "scan",
    [
        'secret("Xk9mQ2v7z")',
        "password( 'Xk9mQ2v7z' )",
        'db.secret.assign(\n  "Xk9mQ2v7z")',
        'set_password "Xk9mQ2v7z";',
        "token `Xk9mQ2v7z` )  ",
        "f(" * 40 + 'secret("Xk9mQ2v7z")',
        "password(" + " " * 100 + '"Xk9mQ2v7z")',
    ],
)
def test_call_prefilter_passes_each_form(scan: str) -> None:
    """Every form of call the pattern covers matches and passes the prefilter."""
    assert _assign._CALL.search(scan) is not None
    assert _assign._maybe_call(scan)


_REFS = _words(
    ["$", "{", "}", "<", ">", "%", "@", "[", "]", "(", ")", ".", "_", "a", "Z", "1",
              "os", "getenv", "env", "self", "this", "Config", "request", "params", "settings",
              "\u212a", "\u017f", " "],
    min_size=1, max_size=10,
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(_REFS)
def test_reference_prefilter_never_hides_a_match(v: str) -> None:
    """The reference prefilter passes every value the reference pattern matches."""
    if _assign._REFERENCE.search(v) is not None:
        assert _assign._maybe_reference(v)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=[",", ";", " ", "\n", "a", "_", "1", ":", "=", "-"], max_size=16))
def test_other_pair_shortcut(value: str) -> None:
    """The other-pair shortcut answers exactly as its pattern."""
    got, want = _assign._other_pair(value), _assign._OTHER_PAIR.search(value)
    assert (got is None) == (want is None)


@settings(max_examples=300, deadline=None)
@given(_words(["a", "n", "nan", "B", "Ch", "\u00c9", "1", "12345", "AB", "APO",
                         " ", "-", "(", ".", "z"], max_size=8))  # fmt: skip
def test_tail_part_first_character_rule(part: str) -> None:
    """Every tail part the pattern matches passes the first-character rule."""
    if _cues._TAIL_PART.search(part) is not None:
        assert _cues._maybe_tail(part)


# Detectors split out so that the trigger set decides whether they run: each trigger must
# be a necessary condition of its detector's candidates (checked on the lower-cased text with
# its placeholders blanked, as the redactor runs it).
_SPLIT = [
    (_cues.signoff_names, _cues.SIGNOFF_TRIGGER),
    (_cues.answer_names, _cues.ANSWER_TRIGGER),
    (_assign.comparisons, _assign.COMPARISON_TRIGGER),
    (_assign.cli_flags, _assign.CLI_TRIGGER),
    (_secrets.aws_key_ids, _secrets.AWS_TRIGGER),
]
_SPLIT_TEXT = _words(
    ["Regards", "best wishes", "Yours truly", "Thank you", "TAKE CARE", ",", "!", " ", "\t",
     "\n", ">", "Marta", "Kowalska", "What's your name?", "name on the account", "User:",
     '"Xk9mQ2v7z"', " == ", "!=", "password", "db_pass", "--PASSWORD=", "-pwd ", "IDENTIFIED BY ",
     "'s3cr3tV4l'", "-String -Force ", "AKIA", "ASIA", "A3TX", "ABCDEFGHIJ234567", "K", "\u017f",
     "[EMAIL:0123abcd]"],
    max_size=14,
)  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(_SPLIT_TEXT)
def test_split_detector_triggers_are_necessary(text: str) -> None:
    """A split detector that finds something on a text always has its trigger fire on it."""
    masked = _blanked_lower(text)
    for detector, trigger in _SPLIT:
        if list(detector(text, text.lower())):
            assert _core.compile_set([trigger]).Match(masked) == [0], (detector, text)


@pytest.mark.parametrize(
    ("detector", "text"),
    [
        (_cues.signoff_names, "Kind regards,\nMarta Kowalska"),
        (_cues.signoff_names, "Yours truly,\nMarta Kowalska"),
        (_cues.signoff_names, "Best wishes!\n> Marta Kowalska"),
        (_cues.answer_names, "What's your name? User: Marta Kowalska"),
        (_cues.answer_names, "what is the name on the account? Marta Kowalska"),
        (_assign.comparisons, 'if ("Xk9mQ2v7z" == db_pass) {'),
        (_assign.cli_flags, "CREATE USER u IDENTIFIED BY 'Xk9mQ2v7z';"),
        (_assign.cli_flags, "tool --api-key Xk9mQ2v7z"),
        (_secrets.aws_key_ids, "id AKIAIOSFODNN7EXAMPLE here"),
    ],
)
def test_split_detectors_find_and_pass_their_trigger(detector: object, text: str) -> None:
    """Each split detector finds its example and its trigger fires on it."""
    trigger = dict(_SPLIT)[detector]  # type: ignore[index]
    assert list(detector(text, text.lower()))  # type: ignore[operator]
    assert _core.compile_set([trigger]).Match(_blanked_lower(text)) == [0]


def _blanked_lower(text: str) -> str:
    lower = text.lower()
    for s, e in _core.placeholders(text):
        lower = lower[:s] + " " * (e - s) + lower[e:]
    return lower


_GITLEAKS = GitleaksRules.load()
_VAULT_TWILIO = _words(
    ["s.", "S.", "hvs.", "SK", "sk", "Sk", "\u017f", "\u212a", "a", "Z", "0", "9", "f", "F",
     "g", " ", "\n", "'", "deadbeef", "0123456789abcdef", "ABCDEF01", "x9Y8z7W6v5U4t3S2r1Q0p9O8"],
    max_size=12,
)  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(_VAULT_TWILIO)
def test_narrowed_gitleaks_keywords_are_necessary(text: str) -> None:
    """Where a narrowed rule's regex matches, its keyword pattern matches the lower-cased text
    (so the rule runs)."""
    from memstream.pipeline.redact._gitleaks import _NARROWED_KEYWORDS

    rules = {r.id: r for r in _GITLEAKS.rules}
    for (rid, _), pattern in _NARROWED_KEYWORDS.items():
        if rules[rid].regex.search(text) is not None:
            assert re2.search(pattern, text.lower()), (rid, text)


@pytest.mark.parametrize(
    "text",
    [
        "VAULT_TOKEN=s.x9Y8z7W6v5U4t3S2r1Q0p9O8",
        "token hvs." + "".join(random.Random(3).choices("abcdefXYZ0123456789_-", k=95)) + " end",
        "twilio SK0123456789abcdef0123456789abcdef",
    ],
)
def test_narrowed_gitleaks_rules_still_find_their_tokens(text: str) -> None:
    """The gitleaks rules with narrowed keywords still find their tokens."""
    found = [text[c.start : c.end] for c in _GITLEAKS(text, text.lower())]
    assert found and all(len(f) >= 24 for f in found), found


@pytest.mark.parametrize("text", ["s.\u017f" + "x9Y8z7W6v5U4t3S2r1Q0p9O", "s.\u212a" + "x" * 23])
def test_narrowed_vault_keyword_follows_the_rules_case_folding(text: str) -> None:
    """The narrowed vault keyword folds case as RE2 does for the rule (long s, Kelvin)."""
    from memstream.pipeline.redact._gitleaks import _NARROWED_KEYWORDS

    rule = {r.id: r for r in _GITLEAKS.rules}["vault-service-token"]
    assert rule.regex.search(text) is not None
    assert re2.search(_NARROWED_KEYWORDS[("vault-service-token", "s.")], text.lower())

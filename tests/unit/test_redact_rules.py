"""Redaction: rules that decide what is not a secret, the prefilter, and non-ASCII offsets."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redaction_checks import assert_redaction_properties, shared_redactor

from memstream.pipeline.redact import RedactionPolicy, Redactor

KEY = b"unit-test-key"


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor(key=KEY)


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("passwd = m1x{e}d!V4lue;", False),  # C-family statement: unquoted rhs is an expression
        ("secret[] = m1x{e}d!V4lue;", False),  # array declaration, same
        ('passwd = "m1x{e}d!V4lue";', True),  # a quoted literal in code
        ("passwd = m1x{e}d!V4lue", True),  # config line
        ("export PASSWD=m1x{e}d!V4lue; ./run", True),  # shell: no spaces, a literal
        ("passwd: m1x{e}d!V4lue;", True),  # YAML/prose colon: not a code statement
    ],
)
def test_unquoted_values_of_code_statements(redactor: Redactor, text: str, redacted: bool) -> None:
    """Unquoted values of code statements are redacted or kept as the table says."""
    out = redactor.redact(text, tenant="t")
    assert ("m1x{e}d!V4lue" not in out.text) is redacted


def test_json_member_names_are_not_tokens(redactor: Redactor) -> None:
    """A random-looking string used as a JSON member name is a name; as a value it is a token."""
    token = "c098f218-face-c0fe-dea0-0199cba"
    assert redactor.redact(f'{{"{token}": "x"}}', tenant="t").counts == {}
    assert redactor.redact(f'{{"x": "{token}"}}', tenant="t").counts == {"API_KEY": 1}


@pytest.mark.parametrize(
    ("text", "secret", "redacted"),
    [
        # a key with a 5-character sequence (5 = bits of its length, 29) is an example
        ("Activation key : ZAQWS-XCDER-VBGTR-FRTGU-KLMNO", "KLMNO", False),
        ("Activation key : ZAQWS-XCDER-VBGTR-FRTGU-KLMNX", "KLMNX", True),  # 4 only
        ("token: ABCDE-FGHIJ-KLMNO-PQRST", "ABCDE", False),
        # a value that also looks random is still a token (the random-token detector)
        ('api_key = "Qm7x-ABCDE-R8j3-T2v6w"', "Qm7x", True),
        # passwords are chosen by people: a sequence does not make them examples
        ("password = Summer12345!", "Summer12345", True),
        ('db_pass: "abcdefgh"', "abcdefgh", True),
    ],
)
def test_sequences_mark_example_keys_not_passwords(
    redactor: Redactor, text: str, secret: str, redacted: bool
) -> None:
    """A key with a long run of consecutive characters is an example (passwords exempt)."""
    assert (secret not in redactor.redact(text, tenant="t").text) is redacted


def test_random_keys_are_not_sequential() -> None:
    """The rule costs generated keys nothing: none of 20,000 random alphanumeric keys of
    16-80 characters holds a run long enough (the odds are ~1e-6 per key)."""
    import random

    from memstream.pipeline.redact._assign import _sequential

    rng = random.Random(7)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    keys = ["".join(rng.choices(alphabet, k=rng.randrange(16, 81))) for _ in range(20_000)]
    assert not [k for k in keys if _sequential(k)]
    assert _sequential("x" * 20 + "ABCDE") and not _sequential("x" * 40 + "ABCDE")
    assert _sequential("x" * 40 + "ABCDEF") and _sequential("x" * 40 + "FEDCBA")
    assert _sequential("k9Xm2-54321") and not _sequential("k9Xm2-5432")


def _jfrog_key(seed: int) -> str:
    import random

    from memstream.pipeline.redact._secrets import _BASE58

    rng = random.Random(seed)
    return "AKCp" + "".join(rng.choices(_BASE58, k=69))


def test_jfrog_keys_are_checked_for_their_base58_form(redactor: Redactor) -> None:
    """A JFrog API key is base58 of 54 bytes: one with a character base58 lacks is made up."""
    from memstream.pipeline.redact._secrets import malformed_token

    for seed in range(50):
        key = _jfrog_key(seed)
        assert not malformed_token(key)
        assert redactor.redact(f"artifactory: {key}", tenant="t").counts == {"API_KEY": 1}
        assert redactor.redact(key, tenant="t").counts == {"API_KEY": 1}
        for bad in "0OIl":
            broken = key[:-1] + bad
            assert malformed_token(broken)
            assert redactor.redact(broken, tenant="t").counts == {}, broken
    assert not malformed_token("AKCp" + "0" * 68)  # not the JFrog shape: left to the rest


def test_speaker_label_after_name_question(redactor: Redactor) -> None:
    """'What's the name on the account? User: Ann Lee': the answer is the name, not 'User'."""
    text = "Bot: What's the name on the account? User: Ann Lee\n"
    out = redactor.redact(text, tenant="t")
    assert out.text.startswith("Bot: What's the name on the account? User: [PERSON:")
    assert [text[s.start : s.end] for s in out.spans] == ["Ann Lee"]


def test_non_ascii_offsets(redactor: Redactor) -> None:
    """Spans are str offsets even when multi-byte characters precede the values."""
    text = "Zoë née Müller 日本 — mail zoe.m@example.com or call +49 30 1234567 😀 ok"
    out = redactor.redact(text, tenant="t")
    values = {s.label: text[s.start : s.end] for s in out.spans}
    assert values["PHONE"] == "+49 30 1234567"
    assert values["EMAIL"] == "zoe.m@example.com"
    assert out.text.endswith(" 😀 ok")


def test_values_next_to_placeholders_are_still_found(redactor: Redactor) -> None:
    """The re-check around new placeholders runs, and existing placeholders are never touched."""
    first = redactor.redact("[EMAIL:0123abcd] password=hunter22x and bob@x.io", tenant="t")
    assert first.text.startswith("[EMAIL:0123abcd] password=[PASSWORD:")
    assert "bob@x.io" not in first.text
    assert redactor.redact(first.text, tenant="t").text == first.text


_alphabet = st.sampled_from(
    [
        *"aéß日😀X09 .,:;@-_=+/'\"\n()[]{}",
        "password = ",
        "secret: ",
        "User: ",
        "What's the name on the account? ",
        "4111 1111 1111 1111",
        "zoë@x.io",
        "10.0.0.1",
        "ghp_0123456789abcdefghijABCDEFGHIJ012345",
        "[EMAIL:0123abcd]",
        "[API_KEY:89abcdef]",
    ]
)
_texts = st.lists(_alphabet, max_size=40).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_texts)
def test_idempotent_and_outside_spans_unchanged_non_ascii(text: str) -> None:
    """The properties of test_redact.py, on text mixing multi-byte characters and secrets."""
    assert_redaction_properties(shared_redactor(), text)


@pytest.mark.parametrize(
    "chunk",
    [
        "ghp_0123456789abcdefghijABCDEFGHIJ012345 password=hunter2x é [EMAIL:0123abcd] ",
        "Zoë née Müller 日本 +49 30 1234567 😀 key: ab12CD34ef56GH78ij90 ",
    ],
)
def test_megabyte_line_dense_with_values_is_bounded(redactor: Redactor, chunk: str) -> None:
    """1 MB on one line with a value every ~40 characters: linear work (no per-value rescans
    of the line for window bounds, line starts or line ends)."""
    text = (chunk * (1_000_000 // len(chunk) + 1))[:1_000_000]
    started = time.perf_counter()
    out = redactor.redact(text, tenant="t")
    assert time.perf_counter() - started < 10.0
    assert len(out.spans) > 20_000


def _assigned(text: str) -> list[str]:
    from memstream.pipeline.redact._assign import cli_flags, comparisons, pairs

    lower = text.lower()
    found = [*pairs(text, lower), *comparisons(text, lower), *cli_flags(text, lower)]
    return [text[c.start : c.end] for c in found]


@pytest.mark.parametrize(
    ("prefix", "suffix", "found"),
    [
        ("p" * 40 + "_", "", False),  # 41 characters before the keyword
        ("p" * 39 + "_", "", True),  # 40
        ("db_", "_" + "s" * 29, True),  # 30 characters after the keyword
        ("db_", "_" + "s" * 30, False),  # 31
    ],
)
def test_assignment_name_length_limits(prefix: str, suffix: str, found: bool) -> None:
    """Assignment names beyond the length limits are not taken for password names, in every form."""
    # the patterns' name repetitions are unbounded; the limits are checked in Python
    for template in (
        '{n} = "Xk9#mQ2v!"',
        "{n}=Xk9#mQ2v!",
        '"Xk9#mQ2v!" == {n}',
        '{n}("Xk9#mQ2v!")',
    ):
        text = "x " + template.format(n=prefix + "password" + suffix) + " y"
        assert (set(_assigned(text)) == {"Xk9#mQ2v!"}) is found, text


@pytest.mark.parametrize("n", [199, 200, 201, 500])
def test_assignment_value_length_limits(n: int) -> None:
    """A quoted value over 200 characters is no password; an unquoted one is cut at 200."""
    value = ("Xk9#mQ2v!" * 60)[:n]
    # quoted: a value over 200 characters is not a password
    for template in ('password = "{v}";', "--password '{v}'"):
        text = template.format(v=value)
        assert set(_assigned(text)) == ({value} if n <= 200 else set()), (template, n)
    # unquoted: cut at 200 characters (mid-line: no "rest of the line" extension)
    assert set(_assigned(f"x password={value}")) == {value[:200]}
    assert set(_assigned(f"x --password {value}")) == {value[:200]}


def test_long_unquoted_value_is_linear(redactor: Redactor) -> None:
    """A ~1 MB unquoted password value is redacted in well under 5 s of CPU."""
    text = "password=" + "Xk9mQ2v" * 150_000  # one value of ~1 MB
    started = time.process_time()
    out = redactor.redact(text, tenant="t")
    assert time.process_time() - started < 5.0
    assert out.text.startswith("password=[PASSWORD:")


@pytest.mark.parametrize(
    "text",
    [
        "mail [EMAIL:0123abcd] or ann@example.com, [X:1] [PHONE:deadbeef]\ncall +1 202-555-0143",
        "[API_KEY:00000000]password=Xk9#mQ2v! [US_SSN:12345678] 123-45-6789 [",
        "no placeholders: card 4111 1111 1111 1111",
    ],
)
def test_rendered_placeholders_are_known(redactor: Redactor, text: str) -> None:
    """The placeholders of the rendered text, taken from the spans, are those a scan would find."""
    # the re-check takes the placeholders of the rendered text from the spans, unscanned
    from memstream.pipeline.redact._core import placeholders
    from memstream.pipeline.redact._spans import all_placeholders

    out = redactor.redact(text, tenant="t")
    assert out.spans
    before = list(placeholders(text))
    assert all_placeholders(before, out.spans) == list(placeholders(out.text))


@pytest.mark.parametrize(
    "text",
    [
        "passport number: X1234567",
        "my BSN is 123456782",
        "Driver's license D1234-5678",
        "NINO: AB123456C",
        "tax id: 12-3456789",
        "Steuer-ID 12345678901",
        "ID card 9876-5432",
        "henkilötunnus 131052-308T",
        "PESEL 44051401359",
    ],
)
def test_national_id_cues_pass_the_prefilter(redactor: Redactor, text: str) -> None:
    """Each national-id cue reaches its detector through the prefilter."""
    labels = {s.label for s in redactor.redact(text, tenant="t").spans}
    assert labels & {"NATIONAL_ID", "PASSPORT", "DRIVER_LICENSE"}, text


def test_national_id_detector_runs_on_its_cue() -> None:
    """With only NATIONAL_ID enabled, a codice fiscale after its cue is found."""
    from memstream.pipeline.redact import _pii

    r = Redactor(key=KEY, policy=RedactionPolicy(labels=frozenset({"NATIONAL_ID"})))
    text = "codice fiscale RSSMRA85T10A562S"  # (with all labels, a random token wins)
    assert [s.label for s in r.redact(text, tenant="t").spans] == ["NATIONAL_ID"]
    assert list(_pii.national_ids(text, text.lower()))


@pytest.mark.parametrize(("n", "found"), [(64, True), (65, False)])
def test_email_local_part_limit(redactor: Redactor, n: int, found: bool) -> None:
    """An email local part of 64 characters is an email; 65 is not."""
    local = ("a1b2c3" * 20)[:n]
    out = redactor.redact(f"write to {local}@example.com today", tenant="t")
    assert ("EMAIL" in out.counts) is found


@pytest.mark.parametrize(
    "text",
    [
        "mysql --PASSWORD=Xk9mQ2v7z db",
        "psql -Pwd Xk9mQ2v7z",
        "CREATE USER u IDENTIFIED BY 'Xk9mQ2v7z';",
        "ALTER ROLE r WITH ENCRYPTED PASSWORD 'Xk9mQ2v7z';",
        "ConvertTo-SecureString -String -Force 'Xk9mQ2v7z'",
        "tool --api-key Xk9mQ2v7z",
    ],
)
def test_cli_and_sql_values(redactor: Redactor, text: str) -> None:
    """Passwords given as CLI flags or in SQL statements are redacted."""
    assert "Xk9mQ2v7z" not in redactor.redact(text, tenant="t").text


def test_value_after_a_placeholder_in_the_same_run(redactor: Redactor) -> None:
    """A second secret after a first in one unquoted run is redacted too; a fixed point."""
    # "PW:<v>,password:<v>": the first value hides the second pair in one unquoted run; once
    # it is a placeholder, the second pair is found (a placeholder's inside is not parsed
    # as "API_KEY: <value>" and does not swallow what follows)
    out = redactor.redact("PW:Prl23Db#@,password:Xk9#mQ2v7", tenant="t")
    assert "Prl23Db" not in out.text and "Xk9#mQ2v7" not in out.text
    assert redactor.redact(out.text, tenant="t").text == out.text


@pytest.mark.parametrize(
    "text",
    [
        "Kind regards,\nMarta Kowalska",
        "Thank you!\nMarta Kowalska",
        "Yours truly,\nMarta Kowalska",
        "Take care\nMarta Kowalska",
        "What's your name? Marta Kowalska",
        "what is the name on the account? Marta Kowalska",
    ],
)
def test_name_cues_pass_their_gates(redactor: Redactor, text: str) -> None:
    """Each name cue form reaches its detector through its gate."""
    assert "Marta" not in redactor.redact(text, tenant="t").text, text

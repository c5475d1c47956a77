"""Redaction: detectors, placeholders, policy, idempotency and bounded time on hostile input."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redaction_checks import assert_redaction_properties, shared_redactor

from memstream.pipeline.redact import (
    LABELS,
    DenyPattern,
    Redacted,
    RedactionPolicy,
    Redactor,
)

KEY = b"unit-test-key"
GHP = "ghp_0123456789abcdefghijABCDEFGHIJ012345"


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor(key=KEY)


def labels(out: Redacted) -> set[str]:
    return {s.label for s in out.spans}


@pytest.mark.parametrize(
    ("text", "value", "label"),
    [
        ("write to jane.doe+x@example.co.uk today", "jane.doe+x@example.co.uk", "EMAIL"),
        ("call me at +1 (202) 555-0143 please", "+1 (202) 555-0143", "PHONE"),
        ("Mobile: 0494 92 82 32", "0494 92 82 32", "PHONE"),
        ("my card 4111 1111 1111 1111 expired", "4111 1111 1111 1111", "CREDIT_CARD"),
        ("IBAN GB82WEST12345698765432 ok", "GB82WEST12345698765432", "IBAN"),
        ("server 192.168.10.24 is down", "192.168.10.24", "IP_ADDRESS"),
        ("v6 2001:db8:85a3::8a2e:370:7334 up", "2001:db8:85a3::8a2e:370:7334", "IP_ADDRESS"),
        ("Here's my SSN: 123-45-6789", "123-45-6789", "US_SSN"),
        (f"token {GHP}", GHP, "API_KEY"),
        ("AWS AKIAIOSFODNN7EXAMPL3 here", "AKIAIOSFODNN7EXAMPL3", "API_KEY"),
        ('password = "s3cr3t-P@ss"', "s3cr3t-P@ss", "PASSWORD"),
        ("db: postgres://app:Sup3rS3cret@db.internal:5432/x", "Sup3rS3cret", "PASSWORD"),
        ("my password is hunter2!", "hunter2!", "PASSWORD"),
        ("My name is Ada Lovelace.", "Ada Lovelace", "PERSON"),
        ("Regards,\nGrace Hopper\n", "Grace Hopper", "PERSON"),
        ("I live at 221 Baker Street, London", "221 Baker Street, London", "ADDRESS"),
    ],
)  # fmt: skip
def test_detects_and_replaces(redactor: Redactor, text: str, value: str, label: str) -> None:
    """Each detector finds its value, reports its span and removes the value from the text."""
    out = redactor.redact(text, tenant="t1")
    start = text.index(value)
    assert (start, start + len(value), label) in [tuple(s) for s in out.spans]
    assert value not in out.text
    assert out.counts[label] >= 1


def test_jwt_and_pem_block(redactor: Redactor) -> None:
    """JWTs and whole PEM private key blocks (header, body and footer) are replaced."""
    jwt = (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
        "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    )
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\nKUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQ==\n-----END RSA PRIVATE KEY-----"  # noqa: E501
    out = redactor.redact(f"auth {jwt}\nkey:\n{pem}\nend", tenant="t1")
    assert "JWT" in labels(out) and "PRIVATE_KEY" in labels(out)
    assert "MIIBOg" not in out.text and "END RSA" not in out.text and out.text.endswith("\nend")


def test_invalid_numbers_are_left_alone(redactor: Redactor) -> None:
    """Checksums decide: a card failing Luhn and an IBAN failing mod-97 are not redacted."""
    text = "order 4111 1111 1111 1112 and GB82WEST12345698765433 and version 1.2.3.4.5"
    assert not labels(redactor.redact(text, tenant="t1")) & {"CREDIT_CARD", "IBAN", "IP_ADDRESS"}


def test_ordinary_prose_is_untouched(redactor: Redactor) -> None:
    """Plain sentences, dates and amounts are not redacted."""
    text = (
        "The meeting moved to 2024-05-17 at 10:30; the budget is 12,500 EUR."
        " The password is incorrect."
    )
    out = redactor.redact(text, tenant="t1")
    assert out.text == text and out.counts == {}


def test_placeholders_stable_per_tenant_and_keyed(redactor: Redactor) -> None:
    """Same value -> same token in a tenant; other tenant or key -> other token."""
    a = redactor.redact("mail bob@example.com", tenant="t1").text
    b = redactor.redact("again: bob@example.com!", tenant="t1").text
    c = redactor.redact("mail bob@example.com", tenant="t2").text
    d = Redactor(key=b"other-key").redact("mail bob@example.com", tenant="t1").text
    token = a.removeprefix("mail ")
    assert token.startswith("[EMAIL:") and token in b
    assert token not in c and token not in d


def test_key_never_exposed() -> None:
    """The HMAC key does not appear in the repr or in outputs."""
    r = Redactor(key=b"very-secret-key-material")
    out = r.redact("very-secret-key-material and a@b.io", tenant="t")
    assert "very-secret" not in repr(r)
    assert "very-secret-key-material" in out.text  # only detected values are replaced


def test_policy_labels_allow_and_deny() -> None:
    """The policy picks detectors, spares allow-listed values, always redacts deny-listed ones."""
    policy = RedactionPolicy(
        labels=frozenset({"EMAIL"}),
        allow=frozenset({"support@example.com"}),
        deny=(
            DenyPattern(pattern="Project Falcon"),
            DenyPattern(pattern=r"ACME-\d{4}", regex=True, label="TICKET"),
        ),
    )
    r = Redactor(key=KEY, policy=policy)
    out = r.redact(
        "support@example.com, ann@example.com, project falcon, ACME-1234, +1 202 555 0143", "t"
    )
    assert out.counts == {"EMAIL": 1, "DENY": 1, "TICKET": 1}
    assert "support@example.com" in out.text and "+1 202 555 0143" in out.text
    with pytest.raises(ValueError):
        RedactionPolicy(labels=frozenset({"NOPE"}))
    assert RedactionPolicy().labels == LABELS


def test_gitleaks_rules_loaded_and_skips_counted(redactor: Redactor) -> None:
    """The vendored gitleaks rules load; file-path rules are skipped and reported."""
    assert "pkcs12-file" in redactor.gitleaks_skipped
    assert len(redactor.gitleaks_skipped) < 20


def test_adversarial_megabyte_is_bounded(redactor: Redactor) -> None:
    """1 MB of hostile text (digit runs, near-emails, key headers, quotes) finishes in < 5 s."""
    chunk = '1-2-3-4-5-6-7-8-9 a@a.a@ -----BEGIN PRIVATE KEY----- password="""\' 0000 ' * 16
    text = (chunk * (1_000_000 // len(chunk) + 1))[:1_000_000]
    started = time.perf_counter()
    out = redactor.redact(text, tenant="t")
    assert time.perf_counter() - started < 5.0
    assert isinstance(out.text, str)


_alphabet = st.sampled_from(
    [
        *"abcXYZ019 .,:;@-_=+/'\"\n()[]",
        "password=",
        "Mr. ",
        "+1 ",
        "4111 1111 1111 1111",
        "bob@x.io",
        "10.0.0.1",
        "[EMAIL:0123abcd]",
    ]
)
_texts = st.lists(_alphabet, max_size=40).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_texts)
def test_idempotent_and_outside_spans_unchanged(text: str) -> None:
    """redact(redact(x)) == redact(x), and text outside the reported spans is kept verbatim."""
    assert_redaction_properties(shared_redactor(), text)

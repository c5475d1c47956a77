"""What every redaction must satisfy, shared by the redaction property tests."""

from __future__ import annotations

from memstream.pipeline.redact import Redactor

KEY = b"unit-test-key"
_SHARED: list[Redactor] = []


def shared_redactor() -> Redactor:
    """One redactor for all property examples (building one compiles every rule)."""
    if not _SHARED:
        _SHARED.append(Redactor(key=KEY))
    return _SHARED[0]


def assert_redaction_properties(r: Redactor, text: str) -> None:
    """redact(redact(x)) == redact(x), and the output is the input with exactly the reported
    spans replaced by their placeholders (nothing else touched)."""
    out = r.redact(text, tenant="t")
    assert r.redact(out.text, tenant="t").text == out.text
    rebuilt, pos = [], 0
    for s in out.spans:
        assert pos <= s.start < s.end <= len(text)
        rebuilt.append(text[pos : s.start])
        rebuilt.append(r.placeholder(s.label, text[s.start : s.end], "t"))
        pos = s.end
    rebuilt.append(text[pos:])
    assert "".join(rebuilt) == out.text

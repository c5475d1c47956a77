"""Per-tenant redaction policies (MEMSTREAM_REDACTION_POLICIES)."""

from __future__ import annotations

import pytest

from memstream.consumers.redaction_key import make_redactor
from memstream.pipeline.redact import Redactor
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings

TEXT = "mail ann@example.com about Project Falcon, call +1 415 555 0100"


def test_a_tenant_policy_applies_to_that_tenant_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant with a policy gets its labels and deny-list; other tenants keep every detector,
    and a policy does not change a tenant's placeholders for the labels it keeps."""
    monkeypatch.setenv(
        "MEMSTREAM_REDACTION_POLICIES",
        '{"acme": {"labels": ["EMAIL"], "deny": [{"pattern": "Project Falcon"}]}}',
    )
    redactors = make_redactor(Settings(), b"k1")
    acme = redactors.redact(TEXT, "acme")
    assert acme.counts == {"EMAIL": 1, "DENY": 1}
    assert "+1 415 555 0100" in acme.text and "Falcon" not in acme.text
    other = redactors.redact(TEXT, "globex")
    assert other.counts == {"EMAIL": 1, "PHONE": 1} and "Falcon" in other.text
    plain = Redactor(b"k1").redact("ann@example.com", "acme").text
    assert plain in acme.text  # same key, same token for the same value in the same tenant


def test_an_invalid_policy_stops_the_start_without_echoing_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad field or a pattern RE2 cannot compile is a configuration error naming the tenant,
    never the deny-list's terms (they are what the tenant wants hidden)."""
    monkeypatch.setenv(
        "MEMSTREAM_REDACTION_POLICIES",
        '{"acme": {"deny": [{"pattern": "topsecret-term", "label": "lower case"}]}}',
    )
    with pytest.raises(ConfigurationError) as err:
        make_redactor(Settings(), b"k1")
    assert "tenant 'acme': deny.0.label" in str(err.value)
    assert "topsecret" not in str(err.value)
    monkeypatch.setenv(
        "MEMSTREAM_REDACTION_POLICIES",
        '{"acme": {"deny": [{"pattern": "topsecret(", "regex": true}]}}',
    )
    with pytest.raises(ConfigurationError) as err:
        make_redactor(Settings(), b"k1")
    assert "tenant 'acme'" in str(err.value) and "topsecret" not in str(err.value)

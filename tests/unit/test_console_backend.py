"""The console's pure helpers: whose a dead letter is, percentiles, rates over a window."""

from __future__ import annotations

import json

from memstream.console.backend import _percentile, _tenant_of


def test_tenant_of_a_turn_a_candidate_and_garbage() -> None:
    """A turn names its tenant at the top, a candidate in its owner; anything else, nobody."""
    assert _tenant_of(json.dumps({"tenant": "acme", "messages": []}).encode()) == "acme"
    candidate = {"owner": {"tenant": "beta", "user": "u"}, "content": "x"}
    assert _tenant_of(json.dumps(candidate).encode()) == "beta"
    assert _tenant_of(b"\xff not json") is None
    assert _tenant_of(b"[1, 2]") is None
    assert _tenant_of(json.dumps({"tenant": 7}).encode()) is None
    assert _tenant_of(json.dumps({"tenant": ""}).encode()) is None


def test_percentile_of_ordered_samples() -> None:
    """p50 and p95 pick the nearest rank; no samples, no value."""
    samples = [float(x) for x in range(1, 101)]
    assert _percentile(samples, 0.5) == 51.0
    assert _percentile(samples, 0.95) == 96.0
    assert _percentile([3.0], 0.95) == 3.0
    assert _percentile([], 0.5) is None

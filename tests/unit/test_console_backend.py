"""The console's pure helpers: whose a dead letter is, percentiles, rates over a window."""

from __future__ import annotations

from memstream.console.backend import _percentile


def test_percentile_of_ordered_samples() -> None:
    """p50 and p95 pick the nearest rank; no samples, no value."""
    samples = [float(x) for x in range(1, 101)]
    assert _percentile(samples, 0.5) == 51.0
    assert _percentile(samples, 0.95) == 96.0
    assert _percentile([3.0], 0.95) == 3.0
    assert _percentile([], 0.5) is None

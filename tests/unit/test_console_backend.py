"""The console's pure helpers: the overview's sums, rates over a window, percentiles, health
rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from memstream.console.overview import Rates, health, percentile, summary
from memstream.schemas.subjects import STAGES


def test_percentile_of_ordered_samples() -> None:
    """p50 and p95 pick the nearest rank; no samples, no value."""
    samples = [float(x) for x in range(1, 101)]
    assert percentile(samples, 0.5) == 51.0
    assert percentile(samples, 0.95) == 96.0
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([], 0.5) is None


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rates_over_the_window_from_its_oldest_sample() -> None:
    """No rate from a first sample or one younger than 0.5 s; then the growth since the
    oldest sample of the last 15 s, per second, never negative (a worker restarted and its
    counters began again); samples older than the window stop counting."""
    clock = Clock()
    rates = Rates(clock)
    assert rates.of({"a": 10.0}) == {}
    clock.now += 0.4
    assert rates.of({"a": 12.0}) == {}
    clock.now += 1.6  # 2 s after the first sample
    assert rates.of({"a": 30.0, "b": 4.0}) == {"a": pytest.approx(10.0), "b": pytest.approx(2.0)}
    clock.now += 1.0
    assert rates.of({"a": 0.0}) == {"a": 0.0}
    clock.now += 15.0  # the first three samples are out of the window: from the fourth on
    assert rates.of({"a": 30.0}) == {"a": pytest.approx(2.0)}


def _jet() -> dict[str, Any]:
    return {
        "consumers": {
            s: {"pending": 1, "ack_pending": 0, "redelivered": 0, "waiting": 1} for s in STAGES
        },
        "streams": {"turns": {"messages": 5, "bytes": 500}},
        "dlq": {"redact": 2},
    }


def test_summary_sums_the_workers_and_takes_shared_counts_once() -> None:
    """Stage counters are summed over workers, fused hand-offs count as throughput, recall
    percentiles pool every worker's samples, the cache rate is over both, redaction labels
    are summed most first; Postgres's count is read from one answer and the index's from the
    worker that opens it (not the extract/redact one)."""
    owner = {
        "worker": "w1",
        "stages": {
            "extract": {"processed": 10, "acked": 10},
            "redact": {"fused": 10, "busy_s": 0.5},
        },
        "recall": {"served": 3, "failed": 1, "latencies_ms": [1.0, 5.0, 3.0]},
        "cache": {"hits": 3, "misses": 1},
        "health": {"postgres": {"ok": True, "count": 40}, "index": {"ok": True, "count": 38}},
        "redactions": {"email": 2, "phone": 5},
    }
    helper = {
        "worker": "w2",
        "stages": {"extract": {"processed": 6, "acked": 5, "retried": 1}},
        "recall": {"served": 1, "latencies_ms": [2.0]},
        "cache": {"hits": 0, "misses": 4},
        "health": {"postgres": {"ok": False, "error": "connection refused", "count": 99}},
        "redactions": {"email": 4},
    }
    at = datetime(2026, 11, 27, tzinfo=UTC)
    o = summary([owner, helper], _jet(), Rates(Clock()), True, at)
    assert o["at"] == at and o["workers"] == 2
    assert o["stages"]["extract"]["processed"] == 16 and o["stages"]["extract"]["acked"] == 15
    assert o["stages"]["extract"]["retried"] == 1 and o["stages"]["redact"]["fused"] == 10
    assert o["stages"]["redact"]["dlq_waiting"] == 2 and o["stages"]["extract"]["dlq_waiting"] == 0
    assert o["stages"]["dedupe"]["consumer"]["pending"] == 1
    assert o["stages"]["extract"]["per_s"] is None  # one sample: no rate yet
    assert o["recall"] == {
        "served": 4,
        "failed": 1,
        "per_s": None,
        "p50": 3.0,
        "p95": 5.0,
        "samples": 4,
    }
    assert o["cache"] == {"hits": 3, "misses": 5, "rate": 3 / 8}
    assert o["counts"] == {"postgres": 40, "index": 38}
    assert list(o["redactions"].items()) == [("email", 6), ("phone", 5)]
    assert o["streams"] == _jet()["streams"]


def test_summary_rates_count_fused_work_as_throughput() -> None:
    """A stage's rate is of its messages acked plus those handed to it in memory."""
    clock = Clock()
    rates = Rates(clock)
    w: dict[str, Any] = {"stages": {"redact": {"acked": 0, "fused": 10}}}
    summary([w], _jet(), rates, True)
    clock.now += 2.0
    w = {"stages": {"redact": {"acked": 4, "fused": 26}}, "recall": {"served": 10}}
    o = summary([w], _jet(), rates, True)
    assert o["stages"]["redact"]["per_s"] == pytest.approx(10.0)
    assert o["recall"]["per_s"] == pytest.approx(5.0)


def test_health_rows_say_what_is_down_and_where() -> None:
    """The console's own NATS connection first, then each worker's view of each dependency
    with the error it reported; no worker answering is a failing row of its own."""
    assert health([], False) == [
        ("NATS (console)", False, "reconnecting"),
        ("workers", False, "no worker answered"),
    ]
    rows = health(
        [{"worker": "w1", "health": {"postgres": {"ok": False}, "nats": {"ok": True}}}], True
    )
    assert rows == [
        ("NATS (console)", True, "connected"),
        ("postgres (w1)", False, "down"),
        ("nats (w1)", True, "ok"),
    ]

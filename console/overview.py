"""The overview page's figures, from what the backend read (``console/backend.py``): the
workers' ``ops.stats`` answers and JetStream's stream and consumer info. Values in, values
out: summed over workers, turned into rates over a window of samples, and the health rows."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from memstream.schemas.subjects import STAGES

RATE_WINDOW_S = 15.0
# the per-stage counters of ``ops.stats`` the overview sums over workers
STAGE_COUNTERS = ("processed", "acked", "fused", "retried", "dead_lettered", "outputs", "busy_s")


class Rates:
    """Per-second rates of running totals over the last ``RATE_WINDOW_S`` of samples (the
    previous samples are a convenience: a restarted console has none, and shows no rate)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, keep: int = 120) -> None:
        self.clock = clock
        self._samples: deque[tuple[float, dict[str, float]]] = deque(maxlen=keep)

    def of(self, totals: Mapping[str, float]) -> dict[str, float]:
        """The rate of each total since the oldest sample of the window (none until a
        sample at least 0.5 s old); ``totals`` is kept as the newest sample."""
        now = self.clock()
        while self._samples and now - self._samples[0][0] > RATE_WINDOW_S:
            self._samples.popleft()
        rates: dict[str, float] = {}
        if self._samples and now - self._samples[0][0] > 0.5:
            then, old = self._samples[0]
            for key, value in totals.items():
                rates[key] = max(0.0, value - old.get(key, 0.0)) / (now - then)
        self._samples.append((now, dict(totals)))
        return rates


def summary(
    workers: Sequence[Mapping[str, Any]],
    jet: Mapping[str, Any],
    rates: Rates,
    nats_connected: bool,
    at: datetime | None = None,
) -> dict[str, Any]:
    """The overview: each stage's counters summed over ``workers`` with its consumer's lag
    and dead letters (``jet``: ``ConsoleBackend.jetstream``), throughput and recall rates,
    recall percentiles, the cache's hit rate, the stores' counts and a health row per
    dependency of each worker."""
    totals: dict[str, float] = {}
    stages: dict[str, dict[str, Any]] = {}
    for stage in STAGES:
        row: dict[str, Any] = {
            k: sum(w.get("stages", {}).get(stage, {}).get(k, 0) for w in workers)
            for k in STAGE_COUNTERS
        }
        row["consumer"] = jet["consumers"][stage]
        row["dlq_waiting"] = jet["dlq"].get(stage, 0)
        stages[stage] = row
        # a fused chain hands the stage its work in memory: that is throughput too
        totals[f"done:{stage}"] = row["acked"] + row["fused"]
    served = sum(w.get("recall", {}).get("served", 0) for w in workers)
    failed = sum(w.get("recall", {}).get("failed", 0) for w in workers)
    totals["recall"] = served + failed
    per_s = rates.of(totals)
    for stage in STAGES:
        stages[stage]["per_s"] = per_s.get(f"done:{stage}")
    latencies = sorted(x for w in workers for x in w.get("recall", {}).get("latencies_ms", []))
    hits = sum((w.get("cache") or {}).get("hits", 0) for w in workers)
    misses = sum((w.get("cache") or {}).get("misses", 0) for w in workers)
    first = workers[0] if workers else {}
    # the index's count from a worker whose roles open it (an extract/redact one does not)
    owner: Mapping[str, Any] = next((w for w in workers if "index" in (w.get("health") or {})), {})
    redactions: dict[str, int] = {}
    for w in workers:
        for label, n in (w.get("redactions") or {}).items():
            redactions[label] = redactions.get(label, 0) + n
    return {
        "redactions": dict(sorted(redactions.items(), key=lambda kv: -kv[1])),
        "at": at or datetime.now(UTC),
        "workers": len(workers),
        "stages": stages,
        "streams": jet["streams"],
        "recall": {
            "served": served,
            "failed": failed,
            "per_s": per_s.get("recall"),
            "p50": percentile(latencies, 0.50),
            "p95": percentile(latencies, 0.95),
            "samples": len(latencies),
        },
        "cache": {
            "hits": hits,
            "misses": misses,
            "rate": hits / (hits + misses) if hits + misses else None,
        },
        # every worker counts the same shared stores: one answer, not a sum
        "counts": {
            "postgres": (first.get("health") or {}).get("postgres", {}).get("count"),
            "index": (owner.get("health") or {}).get("index", {}).get("count"),
        },
        "health": health(workers, nats_connected),
    }


def health(
    workers: Sequence[Mapping[str, Any]], nats_connected: bool
) -> list[tuple[str, bool, str]]:
    """(what, ok, detail) rows: the console's own NATS connection, then each dependency of
    each worker as that worker sees it; no worker answering is a row of its own."""
    rows = [("NATS (console)", nats_connected, "connected" if nats_connected else "reconnecting")]
    if not workers:
        rows.append(("workers", False, "no worker answered"))
    for w in workers:
        name = w.get("worker", "?")
        for dep, state in (w.get("health") or {}).items():
            ok = bool(state.get("ok"))
            detail = "ok" if ok else state.get("error", "down")
            rows.append((f"{dep} ({name})", ok, str(detail)))
    return rows


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile of ``ordered`` samples; None without samples."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

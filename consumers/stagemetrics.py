"""What the stages count, for the ops surface, the metrics and ``memstream bench ingest``:
each stage's counters (``StageMetrics``), and the steps of a stored batch (``STEPS``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class StageMetrics:
    """Per-stage counters, read by the ops surface."""

    processed: int = 0
    acked: int = 0
    dead_lettered: int = 0
    retried: int = 0
    outputs: int = 0
    redactions: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    busy_s: float = 0.0
    batches: int = 0  # handler calls: processed / batches is the mean batch size
    held: int = 0  # retries in place during an outage (no delivery used)
    # messages handled that JetStream had delivered before: a retry (nack), or a deadline
    # that passed while a process held them (died, or was too slow to renew it)
    redelivered: int = 0
    # handed to the stage in memory by the stage before it in a fused chain (consumers/
    # chains.py): no message, so nothing acked
    fused: int = 0
    # pull requests JetStream refused (the consumer deleted, max_ack_pending reached): while
    # it lasts the stage takes nothing (``pull.request_refused`` in the log says why)
    refused: int = 0
    # wall time with at least one handler of the stage running (busy_s sums handlers that
    # overlap, so it can exceed the wall clock)
    active_s: float = 0.0
    inflight: int = 0
    _active_since: float = 0.0

    def enter(self) -> None:
        if self.inflight == 0:
            self._active_since = time.perf_counter()
        self.inflight += 1

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.active_s += time.perf_counter() - self._active_since

    def active_until_now(self) -> float:
        """``active_s`` with the span under way: a stage that has had a batch in hand since
        before a reading began (batches that overlap) adds nothing to ``active_s`` until it
        is idle again, so readings taken meanwhile would count none of that time."""
        under_way = time.perf_counter() - self._active_since if self.inflight else 0.0
        return self.active_s + under_way


# Steps of a stored batch that no stage's busy time tells apart (the fused chain's waits, and
# store's parts): what ``memstream bench ingest`` reports for each batch, and
# ``memstream_batch_step_seconds``. Each name, with what it times.
STEPS = {
    "behind": "waiting for the batch before to write its rows",
    "memory_off": "memory-off lookup",
    "helper": "waiting for the helper's candidates",
    "lookups": "dedupe's duplicate lookups (Postgres)",
    "search": "dedupe's near-duplicate search (the index)",
    "plan": "dedupe's checks and plan",
    "write": "the rows written (one transaction)",
    "index": "index points read, built and written",
    "rows": "  of which the rows read back (Postgres)",
    "contexts": "  of which session contexts read (Postgres)",
    "points": "  of which points embedded and built",
    "upsert": "  of which points written (the index)",
    "order": "waiting for the batch before to finish",
    "announce": "events, and indexed marks (after the points to write again)",
}

"""A worker's Prometheus metrics (``prometheus_client``), in a registry of its own.

Each ``Worker`` owns one ``CollectorRegistry`` (never the global one), so several workers in
one process (tests, ``memstream dev``) keep apart. Three kinds of series:

- counters read at scrape time from the state the console also reads (``StageMetrics``, the
  recall and cache counters): one source of truth for ``/metrics`` and ``<ns>.ops.stats``;
- histograms and counters observed as things happen: stage handling time and messages per
  handler call, recall latency overall and per leg, dead letters by stage and reason
  category;
- gauges refreshed every ``ops_refresh_s`` from JetStream (consumer lag, unacked,
  redelivered; stream sizes), so a scrape never waits on NATS;

plus the process collector (CPU, memory, file descriptors) and Python's GC and platform.

Label values are stage names, recall legs, fixed categories, redaction labels and stream
kinds: never a tenant, an owner, a subject or a value.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from memstream.consumers.logs import log
from memstream.consumers.ops import lag
from memstream.pipeline.redact import LABELS
from memstream.schemas.errors import DataRejected, InvalidMessage, PermanentError
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import STAGES

__all__ = ["DEAD_LETTER_CATEGORIES", "WorkerMetrics", "category_of"]

# Why a message was dead-lettered, as a small fixed set (the full reason is in the dead
# letter's headers: a free-text label would be unbounded and could quote input).
DEAD_LETTER_CATEGORIES = (
    "invalid_input",  # does not decode, validate, or match its subject
    "too_large",  # a store's size limit (Postgres SQLSTATE class 54)
    "data_rejected",  # a store refused the values (SQLSTATE class 22)
    "pipeline_order",  # reached a stage without the one before it (e.g. not redacted)
    "retries_exhausted",  # a transient error outlived max_deliver
    "internal_error",  # an unexpected exception outlived max_deliver
)

STAGE_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
RECALL_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
LEG_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
RECALL_LEGS = ("embed", "dense", "keyword", "fetch")


def category_of(exc: BaseException) -> str:
    """The dead-letter category of a permanent error."""
    if isinstance(exc, InvalidMessage):
        return "invalid_input"
    if isinstance(exc, DataRejected):
        # storage/postgres.py names the SQLSTATE; class 54 is "program limit exceeded"
        return "too_large" if "SQLSTATE 54" in str(exc) else "data_rejected"
    if isinstance(exc, PermanentError):
        return "pipeline_order"
    return "internal_error"


class _WorkerCounters(Collector):
    """Counters kept by the worker for the console too, exposed as Prometheus counters."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def collect(self) -> Iterator[CounterMetricFamily]:
        deps = getattr(self.worker, "deps", None)
        if deps is None:  # not started yet
            return
        stages = deps.metrics
        for field, text in (
            ("processed", "messages handled"),
            ("acked", "messages acked"),
            ("retried", "messages nacked for retry"),
            ("dead_lettered", "messages sent to the dead-letter subject"),
            ("outputs", "messages or rows produced"),
            ("held", "tries held in place during an outage (no delivery used)"),
            (
                "redelivered",
                "messages handled again: delivered before (a retry, or an ack deadline passed)",
            ),
            ("fused", "items handed to the stage in memory by the stage before (no message)"),
            (
                "refused",
                "pull requests JetStream refused (consumer deleted, max_ack_pending reached)",
            ),
        ):
            family = CounterMetricFamily(f"memstream_stage_{field}", text, labels=["stage"])
            for stage, m in stages.items():
                family.add_metric([stage], getattr(m, field))
            yield family
        busy = CounterMetricFamily(
            "memstream_stage_busy_seconds", "time spent handling", labels=["stage"]
        )
        for stage, m in stages.items():
            busy.add_metric([stage], m.busy_s)
        yield busy
        redactions = CounterMetricFamily(
            "memstream_redactions", "values replaced by placeholders, by type", labels=["type"]
        )
        found = stages["redact"].redactions if "redact" in stages else {}
        # every detector's series from zero (increase() sees the first); a tenant's deny
        # labels (operator-configured names) appear once used
        for label, n in sorted({**dict.fromkeys(LABELS, 0), **found}.items()):
            redactions.add_metric([label], n)
        yield redactions
        recall = CounterMetricFamily("memstream_recall", "recall requests", labels=["result"])
        recall.add_metric(["ok"], self.worker.recall.served)
        recall.add_metric(["error"], self.worker.recall.failed)
        yield recall
        helper = self.worker.services.helper
        if helper is not None:
            yield CounterMetricFamily(
                "memstream_helper_batches",
                "batches of turns the helper process extracted and redacted",
                value=helper.prepared,
            )
            yield CounterMetricFamily(
                "memstream_helper_restarts",
                "helper processes found gone (killed, out of memory) and replaced",
                value=helper.restarts,
            )
        if deps.cache is not None:
            cache = CounterMetricFamily(
                "memstream_recall_cache_lookups",
                "recall cache lookups (a miss is decided locally, without a KV call)",
                labels=["result"],
            )
            cache.add_metric(["hit"], deps.cache.hits)
            cache.add_metric(["miss"], deps.cache.misses)
            yield cache


class WorkerMetrics:
    """The metrics of one worker process: its registry, what the stages and the recall
    responder observe, and the JetStream gauges."""

    def __init__(self, worker: Any) -> None:
        self._worker = worker
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        r.register(_WorkerCounters(worker))
        self.stage_seconds = Histogram(
            "memstream_stage_duration_seconds",
            "time to handle one stage call (a message, or a batch of them)",
            ["stage"],
            buckets=STAGE_SECONDS,
            registry=r,
        )
        self.batch_steps = Histogram(
            "memstream_batch_step_seconds",
            "time a stored batch spent in one step of the fused chain (a wait, or a part of "
            "store that the stage's time does not tell apart)",
            ["step"],
            buckets=STAGE_SECONDS,
            registry=r,
        )
        self.batch_size = Histogram(
            "memstream_stage_batch_size",
            "messages handled per stage call",
            ["stage"],
            buckets=BATCH_SIZES,
            registry=r,
        )
        self.dead_letters = Counter(
            "memstream_dead_letters",
            "messages dead-lettered, by stage and reason category",
            ["stage", "category"],
            registry=r,
        )
        self.recall_seconds = Histogram(
            "memstream_recall_duration_seconds",
            "server time of one recall request (auth, cache, search, ranking)",
            buckets=RECALL_SECONDS,
            registry=r,
        )
        self.recall_leg_seconds = Histogram(
            "memstream_recall_leg_duration_seconds",
            "time spent in each part of a recall: embed the query, dense and keyword "
            "searches, fetch of the records",
            ["leg"],
            buckets=LEG_SECONDS,
            registry=r,
        )
        self.optimize_seconds = Histogram(
            "memstream_index_optimize_duration_seconds",
            "time of one optimization of the vector index (Qdrant Edge: the process that "
            "holds the shard, recall included, waits for all of it)",
            buckets=STAGE_SECONDS,
            registry=r,
        )
        gauge: dict[str, Any] = {"registry": r, "labelnames": ["stage"]}
        self.pending = Gauge(
            "memstream_consumer_pending", "messages not yet delivered to the stage", **gauge
        )
        self.ack_pending = Gauge(
            "memstream_consumer_ack_pending", "delivered, not yet acked", **gauge
        )
        self.redelivered = Gauge(
            "memstream_consumer_redelivered", "messages delivered more than once", **gauge
        )
        stream: dict[str, Any] = {"registry": r, "labelnames": ["stream"]}
        self.stream_messages = Gauge(
            "memstream_stream_messages", "messages held by each stream", **stream
        )
        self.stream_bytes = Gauge("memstream_stream_bytes", "bytes held by each stream", **stream)
        self.refreshed = Gauge(
            "memstream_jetstream_refreshed_timestamp_seconds",
            "when the JetStream gauges were last read successfully",
            registry=r,
        )
        self._refresher: asyncio.Task[None] | None = None
        # every labelled series exists from the start at zero, so rate() and increase() see
        # the first event (a counter born at 1 shows no increase)
        for stage in STAGES:
            self.stage_seconds.labels(stage)
            self.batch_size.labels(stage)
            for category in DEAD_LETTER_CATEGORIES:
                self.dead_letters.labels(stage, category)
        for leg in RECALL_LEGS:
            self.recall_leg_seconds.labels(leg)

    # --- observed as it happens ------------------------------------------------------------

    def stage_handled(self, stage: str, seconds: float, messages: int = 1) -> None:
        """One stage call finished (``messages``: how many it handled)."""
        self.stage_seconds.labels(stage).observe(seconds)
        self.batch_size.labels(stage).observe(messages)

    def batch_step(self, step: str, seconds: float) -> None:
        """A stored batch spent ``seconds`` in ``step`` (``stagemetrics.STEPS``)."""
        self.batch_steps.labels(step).observe(seconds)

    def dead_lettered(self, stage: str, category: str) -> None:
        if category not in DEAD_LETTER_CATEGORIES:
            category = "internal_error"
        self.dead_letters.labels(stage, category).inc()

    def recall_answered(self, seconds: float) -> None:
        self.recall_seconds.observe(seconds)

    def recall_parts(self, spent: Mapping[str, float]) -> None:
        """Seconds per part of one recall (``RecallService``'s ``spent``)."""
        for leg, seconds in spent.items():
            if leg in RECALL_LEGS:
                self.recall_leg_seconds.labels(leg).observe(seconds)

    # --- JetStream gauges -------------------------------------------------------------------

    def set_lag(self, lags: Mapping[str, Mapping[str, int]]) -> None:
        """Gauges from ``ops.lag``; an unknown value (-1: consumer or stream not there yet)
        removes the series rather than exporting a number that would sum wrongly."""
        for name, values in lags.items():
            pairs: tuple[tuple[Gauge, str], ...]
            if name.startswith("stream:"):
                kind = name.split(":", 1)[1]
                pairs = ((self.stream_messages, "messages"), (self.stream_bytes, "bytes"))
            else:
                kind = name
                pairs = (
                    (self.pending, "pending"),
                    (self.ack_pending, "ack_pending"),
                    (self.redelivered, "redelivered"),
                )
            for gauge, key in pairs:
                value = values.get(key, -1)
                if value < 0:
                    with contextlib.suppress(KeyError):
                        gauge.remove(kind)
                else:
                    gauge.labels(kind).set(value)

    async def refresh(self, js: Any, settings: Settings) -> None:
        """Read every stage consumer and stream once and set the gauges."""
        lags = await lag(js, settings)
        self.set_lag(lags)
        # lag() reads -1 for what did not answer: only a read that reached JetStream is fresh
        if any(v >= 0 for values in lags.values() for v in values.values()):
            self.refreshed.set_to_current_time()

    async def start_refreshing(self, js: Any, settings: Settings) -> None:
        """Refresh the JetStream gauges now (the first scrape has them), then every
        ``settings.ops_refresh_s`` in the background."""
        await self._refresh_once(js, settings)
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh_forever(js, settings))

    async def _refresh_once(self, js: Any, settings: Settings) -> None:
        try:
            await asyncio.wait_for(self.refresh(js, settings), max(settings.ops_refresh_s, 2.0))
        except Exception as exc:  # noqa: BLE001 - the gauges keep their last values; tried again
            log.warning("metrics.refresh_failed", error=type(exc).__name__)

    async def _refresh_forever(self, js: Any, settings: Settings) -> None:
        while True:
            await asyncio.sleep(settings.ops_refresh_s)
            await self._refresh_once(js, settings)

    def stop_refreshing(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            self._refresher = None

    def render(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)

    async def render_all(self) -> bytes:
        """``render``, with the series of this worker's index process (consumers/indexproc.py),
        if it has one, labelled ``process="index"``: it answers recall, so recall's series
        are its. Without an answer within ``CHILD_METRICS_S``, this worker's alone."""
        own = self.render()
        child = getattr(self._worker.vectors, "metrics", None)
        if child is None:
            return own
        try:
            async with asyncio.timeout(CHILD_METRICS_S):
                theirs: bytes = await child()
        except Exception:  # noqa: BLE001 - the index process away: this worker's series still
            return own
        return merged_exposition(own, theirs, ("process", "index"))


CHILD_METRICS_S = 2.0


def merged_exposition(own: bytes, other: bytes, label: tuple[str, str]) -> bytes:
    """The series of two expositions in one: ``other``'s carry ``label`` as well, beside
    ``own``'s of the same family (a family may appear once in an exposition)."""
    families = {f.name: f for f in text_string_to_metric_families(own.decode())}
    for family in text_string_to_metric_families(other.decode()):
        samples = [s._replace(labels={**s.labels, label[0]: label[1]}) for s in family.samples]
        mine = families.get(family.name)
        if mine is not None and mine.type == family.type:
            mine.samples.extend(samples)
        elif mine is None:
            family.samples = samples
            families[family.name] = family
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


class _Families:
    """A collector of already-made families."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families

"""The worker's Prometheus registry, without servers."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from memstream.consumers.metrics import DEAD_LETTER_CATEGORIES, WorkerMetrics, category_of
from memstream.consumers.stagemetrics import StageMetrics
from memstream.schemas.errors import (
    DataRejected,
    InvalidMessage,
    PermanentError,
    StorageUnavailable,
)


def samples(m: WorkerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_two_workers_in_one_process_keep_their_own_series() -> None:
    """Each worker has its own registry: creating two does not collide, and what one observes
    does not show in the other."""
    a, b = WorkerMetrics(object()), WorkerMetrics(object())
    a.stage_handled("store", 0.02, messages=3)
    a.dead_lettered("extract", "invalid_input")
    key = ("memstream_stage_batch_size_sum", (("stage", "store"),))
    assert samples(a)[key] == 3 and samples(b)[key] == 0
    dead = ("memstream_dead_letters_total", (("category", "invalid_input"), ("stage", "extract")))
    assert samples(a)[dead] == 1 and samples(b)[dead] == 0


def test_every_stage_and_category_series_starts_at_zero() -> None:
    """Labelled series exist before their first event, so increase() sees the first one;
    process metrics are exported too."""
    got = samples(WorkerMetrics(object()))
    for category in DEAD_LETTER_CATEGORIES:
        assert (
            got[("memstream_dead_letters_total", (("category", category), ("stage", "redact")))]
            == 0
        )
    assert ("memstream_recall_leg_duration_seconds_count", (("leg", "keyword"),)) in got
    assert any(name == "process_cpu_seconds_total" for name, _ in got)


def test_an_unknown_category_is_counted_as_internal_error() -> None:
    """The category label only ever takes one of the fixed values."""
    m = WorkerMetrics(object())
    m.dead_lettered("store", "tenant acme said no")
    got = samples(m)
    assert (
        got[("memstream_dead_letters_total", (("category", "internal_error"), ("stage", "store")))]
        == 1
    )
    assert not any("acme" in str(labels) for _, labels in got)


def test_dead_letter_categories_follow_the_error_tree() -> None:
    """Invalid input, store size limits, refused values and skipped stages map to their own
    categories."""
    assert category_of(InvalidMessage("invalid TurnEvent")) == "invalid_input"
    too_big = DataRejected("postgres refused the data: SQLSTATE 54000 (ProgramLimitExceededError)")
    assert category_of(too_big) == "too_large"
    assert (
        category_of(DataRejected("postgres refused the data: SQLSTATE 22021 (x)"))
        == "data_rejected"
    )
    assert category_of(PermanentError("candidate reached store without passing redact")) == (
        "pipeline_order"
    )
    assert category_of(StorageUnavailable("x")) == "internal_error"


def test_an_unknown_lag_removes_the_series_instead_of_exporting_minus_one() -> None:
    """A consumer JetStream could not describe leaves no gauge behind (a -1 would sum wrongly
    and hide the outage); a known value sets it."""
    m = WorkerMetrics(object())
    m.set_lag({"extract": {"pending": 3, "ack_pending": 1, "redelivered": 0}})
    m.set_lag({"stream:dlq": {"messages": 2, "bytes": 100}})
    got = samples(m)
    assert got[("memstream_consumer_pending", (("stage", "extract"),))] == 3
    assert got[("memstream_stream_messages", (("stream", "dlq"),))] == 2
    m.set_lag({"extract": {"pending": -1, "ack_pending": -1, "redelivered": -1}})
    assert ("memstream_consumer_pending", (("stage", "extract"),)) not in samples(m)


def test_a_stage_busy_since_before_a_reading_counts_its_time_so_far() -> None:
    """``StageMetrics.active_until_now``: with a batch in hand throughout (batches that
    overlap), ``active_s`` stays where it was until the stage is idle, so the ingest bench's
    paced run read 0.00 s busy for a stage busy all along; read with the span under way, it
    grows while the batch is in hand, and matches ``active_s`` once the stage is idle."""
    m = StageMetrics()
    assert m.active_until_now() == 0.0
    m.enter()
    m.enter()  # the next batch begins before the first ends
    time.sleep(0.01)
    first = m.active_until_now()
    m.leave()
    time.sleep(0.01)
    assert m.active_s == 0.0 and m.active_until_now() > first >= 0.01
    m.leave()
    assert m.active_until_now() == m.active_s >= 0.02

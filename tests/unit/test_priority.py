"""MEMSTREAM_STAGE__INGEST_NICE's edges in this process: a value out of range is refused by
name, a worker that answers recall itself is left as it is, and a thread that has exited
meanwhile is skipped, never an error (the real worker: tests/integration/test_ingest_nice.py)."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from memstream.consumers import priority
from memstream.consumers.run import _lower_ingest
from memstream.schemas.settings import Settings, StageSettings


@pytest.mark.parametrize("value", [-1, 20])
def test_a_nice_value_out_of_range_is_refused_by_name(value: int) -> None:
    """Nice values are 0 to 19: anything else is a settings error naming the field."""
    with pytest.raises(ValidationError, match="ingest_nice"):
        StageSettings(ingest_nice=value)


def test_a_worker_that_answers_recall_itself_is_not_niced() -> None:
    """Every role, recall included (no index process): no thread of the process changes."""
    before = {t: priority.nice_of(t) for t in priority.threads()}
    _lower_ingest(Settings(stage=StageSettings(ingest_nice=7)), None, None)
    assert {t: priority.nice_of(t) for t in priority.threads() if t in before} == before
    assert 7 not in before.values()


def test_a_thread_that_has_exited_is_skipped() -> None:
    """An id that names no thread (it exited between the listing and the change) is skipped;
    a thread already at or above the value is not lowered."""
    gone = 2**22 + 12345  # above the kernel's largest pid
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert priority.lower(own, [gone, *priority.threads()]) == 0

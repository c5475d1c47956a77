"""`memstream bench faults`, short: one fault of each kind during the ingest of a few hundred
turns, on servers and a worker process the benchmark starts itself (never the machine's)."""

from __future__ import annotations

import faultsbench
import pytest

from memstream.consumers.helper import usable_cpus

pytestmark = pytest.mark.integration

# the worker's helper and index processes (consumers/helper.py, consumers/indexproc.py) exist
# on two or more CPUs
HELPER = ",helper_kill,index_kill" if usable_cpus() >= 2 else ""
ONE_OF_EACH = f"worker_kill{HELPER},nats_kill,postgres_kill,index_offline"


@pytest.mark.timeout(280)
def test_short_fault_suite_meets_every_target() -> None:
    """With the worker SIGKILLed, its helper and index processes SIGKILLed, nats-server and
    PostgreSQL SIGKILLed and restarted and the index taken away during ingest, every acked
    turn is stored exactly once, the index holds what Postgres holds, nothing is dead-lettered, and
    all is processed within 60 s."""
    report, stderr, code = faultsbench.run(["--turns", "300", "--faults", ONE_OF_EACH], 270)
    assert [f["fault"] for f in report["faults"]] == ONE_OF_EACH.split(","), stderr[-2000:]
    faultsbench.assert_exactly_once(report, 300)
    assert report["drain_after_last_fault_s"] is not None
    assert report["drain_after_last_fault_s"] <= 60
    assert report["worker_starts"] == 2 and report["worker_exit_code"] == 0
    assert all(report["targets"].values()) and code == 0

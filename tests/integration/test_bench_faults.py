"""`memstream bench faults`, short: one fault of each kind during the ingest of a few hundred
turns, on servers and a worker process the benchmark starts itself (never the machine's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

MEMSTREAM = str(Path(sys.executable).parent / "memstream")
ONE_OF_EACH = "worker_kill,nats_kill,postgres_kill,index_offline"


@pytest.mark.timeout(280)
def test_short_fault_suite_meets_every_target() -> None:
    """With the worker SIGKILLed, nats-server and PostgreSQL SIGKILLed and restarted and the
    index taken away during ingest, every acked turn is stored exactly once, the index holds
    what Postgres holds, nothing is dead-lettered, and all is processed within 60 s."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    done = subprocess.run(
        [MEMSTREAM, "bench", "faults", "--turns", "300", "--faults", ONE_OF_EACH, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=270,
        check=False,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [f["fault"] for f in report["faults"]] == ONE_OF_EACH.split(","), done.stderr[-2000:]
    assert report["published"] == report["episodes_stored"] == 300
    assert report["lost"] == 0 and report["duplicated"] == 0 and report["unexpected"] == 0
    assert report["points_index"] == report["memories_live"] == report["memories_postgres"]
    assert report["memories_postgres"] > 300  # typed memories besides the episodes
    assert report["missing_in_index"] == 0
    assert report["dead_letters"] == 0, report["dead_letter_reasons"]
    assert report["drain_after_last_fault_s"] is not None
    assert report["drain_after_last_fault_s"] <= 60
    assert report["worker_starts"] == 2 and report["worker_exit_code"] == 0
    assert all(report["targets"].values()) and done.returncode == 0

"""MEMSTREAM_STAGE__INGEST_NICE on a real `memstream worker`: its stage threads and its helper
process run at the nice value, its index process (which answers recall) at the worker's own
value; an index process started again after a kill keeps the worker's own value, and a
helper started again keeps the nice one."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from memstream.consumers.bench.processes import WorkerProcess
from memstream.consumers.helper import usable_cpus
from memstream.consumers.priority import nice_of, threads
from memstream.producers.client import MemoryClient

pytestmark = pytest.mark.integration

NICE = 6


def _nices(pid: int) -> list[int]:
    return [nice_of(t) for t in threads(pid)]


async def _restarted(
    worker: WorkerProcess, mem: MemoryClient, index: int, helper: int
) -> tuple[int, int]:
    """Publish a turn every 0.3 s until the worker has started a new index process and a new
    helper (each is started again by the next call that needs it); their ids."""
    deadline = time.monotonic() + 90.0
    i = 0
    while time.monotonic() < deadline:
        new_index = [p for p in worker.index_pids() if p != index]
        new_helper = [p for p in worker.helper_pids() if p != helper]
        if new_index and new_helper:
            return new_index[0], new_helper[0]
        await mem.publish_turn([("user", f"note {i}: the zeppelin lands at {i % 12} pm")])
        i += 1
        await asyncio.sleep(0.3)
    raise AssertionError("the worker did not start a new index process and helper")


@pytest.mark.timeout(240)
async def test_ingest_runs_niced_and_the_index_process_does_not(
    tmp_path: Path, nats_url: str, database_url: str, namespace: str
) -> None:
    """Every worker thread but the one that starts index processes, and every helper thread,
    at nice 6; the index process at this test's own value, before and after a SIGKILL; a new
    helper after a SIGKILL at nice 6; the turns published meanwhile are all processed."""
    if usable_cpus() < 2:
        pytest.skip("a worker on one CPU has no helper and no index process")
    own = os.getpriority(os.PRIO_PROCESS, 0)  # what the worker starts with
    assert own < NICE, "the test must run below the nice value it checks"
    worker = WorkerProcess(
        {
            "MEMSTREAM_NATS_URL": nats_url,
            "MEMSTREAM_DATABASE_URL": database_url,
            "MEMSTREAM_NAMESPACE": namespace,
            "MEMSTREAM_CONSOLE_PORT": "0",
            "MEMSTREAM_STAGE__INGEST_NICE": str(NICE),
        },
        tmp_path / "state",
        tmp_path / "worker.log",
    )
    try:
        await asyncio.to_thread(worker.start)
        assert worker.proc is not None
        assert sorted(_nices(worker.proc.pid)).count(own) == 1  # the launcher thread only
        assert set(_nices(worker.proc.pid)) == {own, NICE}
        [index] = worker.index_pids()
        [helper] = worker.helper_pids()
        assert set(_nices(index)) == {own}
        assert set(_nices(helper)) == {NICE}

        async with MemoryClient("acme", user="ann", nats_url=nats_url, namespace=namespace) as mem:
            worker.kill_index()
            worker.kill_helper()
            new_index, new_helper = await _restarted(worker, mem, index, helper)
            assert await mem.flush(within_s=60)
        assert set(_nices(new_index)) == {own}
        assert set(_nices(new_helper)) == {NICE}
    finally:
        await asyncio.to_thread(worker.stop)

"""A pass over a batch hands the event loop back between its pieces."""

from __future__ import annotations

import asyncio
import time

from memstream.consumers import offload
from memstream.consumers.offload import SLICE_S, Slices


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_a_tick_after_a_slice_of_work_lets_other_tasks_run() -> None:
    """Once a slice of synchronous work has passed, ``tick`` yields: a task that became ready
    meanwhile (a recall request) runs before the pass goes on."""
    ran: list[str] = []
    slices = Slices()
    other = asyncio.get_running_loop().call_soon(ran.append, "other")
    _busy(SLICE_S * 1.5)
    await slices.tick()
    ran.append("pass")
    assert ran == ["other", "pass"]
    other.cancel()


async def test_a_tick_before_the_slice_is_used_keeps_the_loop(monkeypatch) -> None:
    """Within a slice, ``tick`` does not yield: small batches pay nothing for it."""
    monkeypatch.setattr(offload, "SLICE_S", 60.0)  # a slice no busy machine can use up here
    ran: list[str] = []
    slices = Slices()
    asyncio.get_running_loop().call_soon(ran.append, "other")
    await slices.tick()
    ran.append("pass")
    assert ran[0] == "pass"

"""The worker runs on uvloop (consumers/loops.py), and so do the tests (tests/conftest.py)."""

from __future__ import annotations

import asyncio

import uvloop

from memstream.consumers import loops


async def test_tests_run_on_the_workers_loop() -> None:
    """An async test runs on uvloop, as the worker does: a test on another loop would not
    exercise the loop the worker's sockets run on."""
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


def test_a_worker_runs_on_the_loop_its_settings_name() -> None:
    """``MEMSTREAM_EVENT_LOOP`` picks the loop: uvloop by default, the standard one when
    set to ``asyncio``."""

    async def kind() -> type[asyncio.AbstractEventLoop]:
        return type(asyncio.get_running_loop())

    assert loops.run(kind(), "uvloop") is uvloop.Loop
    assert not issubclass(loops.run(kind(), "asyncio"), uvloop.Loop)

"""The worker's own event loop, seen from another thread's loop.

A worker's Postgres pool, its bus connection, the recall cache's watches and the helper's
pipes belong to the event loop that made them: asyncpg and nats-py objects may only be used
from that loop. The recall responder runs on a thread of its own (consumers/recall_lane.py)
and reaches them through ``Home``: a coroutine that needs them runs on the worker's loop,
and the caller awaits its result from wherever it is. On the worker's loop itself, ``Home``
adds nothing: the coroutine is awaited in place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Home:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: the worker's loop (by default the one running now)."""
        self.loop = loop or asyncio.get_running_loop()

    def here(self) -> bool:
        """Whether the caller runs on the worker's loop."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:  # no loop runs in this thread
            return False

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result, run on the worker's loop."""
        if self.here():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on the worker's loop: now when the caller is on it, else soon."""
        if self.here():
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

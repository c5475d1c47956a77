"""Heavy pure work off the event loop.

Stage work on a large input (extracting a megabyte turn, redacting a 50,000-character
candidate) takes a tenth of a second to seconds of CPU. On the event loop that time is taken
from recall, which shares the process and answers in milliseconds. Above ``OFFLOAD_CHARS`` the
work runs in a worker thread: the loop keeps running between the interpreter's switch
intervals, at the cost of a thread hop that small inputs, done sooner than the hop, are
spared.

A batch of small inputs is the same time in small pieces: ``Slices`` hands the loop back
between them, so that a recall request waits for one piece, not for the whole batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

OFFLOAD_CHARS = 16_000  # beyond it, rules or redaction hold the loop longer than recall may wait


async def offload(size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``, in a thread when ``size`` (characters or bytes of input)
    exceeds ``OFFLOAD_CHARS``, else right here."""
    if size <= OFFLOAD_CHARS:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


EMBED_SLICE = 16  # texts per embedding call inside a batch: a few milliseconds of the loop

SLICE_S = 0.002  # the longest a pass over a batch holds the event loop between yields


class Slices:
    """Yields to the event loop once ``SLICE_S`` of synchronous work has passed since the last
    yield (``await slices.tick()`` between the items of a batch)."""

    def __init__(self) -> None:
        self._since = time.perf_counter()

    async def tick(self) -> None:
        if time.perf_counter() - self._since >= SLICE_S:
            await asyncio.sleep(0)
            self._since = time.perf_counter()

"""The event loop a worker process runs on (``MEMSTREAM_EVENT_LOOP``).

uvloop by default: a worker's loop spends its time on socket reads and writes to NATS,
PostgreSQL and its index process, which uvloop does in C. Side by side on this 2-core machine
(docs/benchmarks.md, "eleventh session") the ingest bench's recall p95 fell by about a fifth
and its throughput rose ~5 %. The test suite runs on uvloop too (tests/conftest.py), so the
worker is tested on the loop it runs on. Where uvloop is not installed the standard loop runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """``asyncio.run(main)`` on the loop named (``Settings.event_loop``)."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:  # not installed (no wheel for Windows): the standard loop
            return asyncio.run(main)
        return uvloop.run(main)
    return asyncio.run(main)

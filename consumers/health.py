"""``/healthz``: can this worker reach every server it needs, right now?

Three checks, run together, each bounded by ``TIMEOUT_S``: NATS (both of the worker's
connections are connected, not reconnecting), Postgres (``SELECT 1`` on a pooled connection)
and the vector index (a count of a tenant nobody has; only in a process whose roles use it:
an extract/redact process is healthy without it). Healthy only when all pass; the reply names
what is missing, never a URL or a credential.
"""

from __future__ import annotations

import asyncio
from typing import Any

from memstream.consumers.roles import holds_index

TIMEOUT_S = 2.0


async def _within(check: Any) -> str | None:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            await check
    except TimeoutError:
        return "no answer"
    except Exception as exc:  # noqa: BLE001 - a health check reports, never raises
        return type(exc).__name__
    return None


def _nats(worker: Any) -> str | None:
    broker = worker.broker.config.connection_state.connection
    control = worker._nc
    if control is None or not control.is_connected or not broker.is_connected:
        return "disconnected"
    return None


async def problems(worker: Any) -> dict[str, str]:
    """What cannot be reached, by server ({} when healthy)."""
    checks = [_within(worker.pg.ping())]
    if holds_index(worker.settings.stages):
        checks.append(_within(worker.vectors.count("-healthz-")))
    pg, *vectors = await asyncio.gather(*checks)
    found = {"nats": _nats(worker), "postgres": pg, "vector_index": next(iter(vectors), None)}
    return {name: why for name, why in found.items() if why is not None}

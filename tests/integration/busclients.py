"""Helpers for the bus tenancy tests: a connection to the operator-mode bus with one
credential, and the permission violations the server sent it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nats
from natsservers import Bus

from memstream.producers.connection import NatsAuth


class Violations:
    """The permission errors the server sent one connection."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.changed = asyncio.Event()

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))
        self.changed.set()

    async def wait_for(self, kind: str, subject: str, within_s: float = 5.0) -> None:
        """Until the server refused ``kind`` (publish/subscription) on ``subject``."""
        needle = f'permissions violation for {kind} to "{subject}"'.lower()

        async def until() -> None:
            while not any(needle in s.lower() for s in self.seen):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), within_s)


async def connect(bus: Bus, creds_file: Path, **kw: Any) -> tuple[Any, Violations]:
    errors = Violations()
    opts = NatsAuth(creds=creds_file).connect_options()
    nc = await nats.connect(bus.url, error_cb=errors.record, allow_reconnect=False, **opts, **kw)
    return nc, errors

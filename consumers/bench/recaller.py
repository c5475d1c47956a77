"""The ingest benchmark's recall client, in a process of its own.

An agent's recall comes from the agent's process, not from the one that publishes every turn
and follows every event. In the benchmark's process, even on a thread of its own, the client
shares an interpreter lock with that publisher: a reply that has arrived waits for the lock
(Python hands it over every 5 ms), and that wait was counted as recall latency. So the client
runs in a spawned process with its own connections, and sends back what it measured.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from memstream.consumers.bench.conversations import DAYS, THINGS, Session

QUERIES = [
    "what did we decide about {thing}?",
    "what does the user prefer in the morning?",
    "where does the user live?",
    "what was the fix for {thing}?",
    "what do I need to review before {day}?",
    "contact details for the invoice",
]
_ANSWER_S = 60.0  # for the process to connect, and to send its figures once stopped


@dataclass(frozen=True)
class RecallLoad:
    """What the client asks: random owners of ``pool``, back to back (``rate`` 0) or at most
    ``rate`` requests a second."""

    nats_url: str
    namespace: str
    pool: list[Session]
    seed: int
    rate: float = 0.0


@dataclass
class RecallResult:
    latency_ms: list[float] = field(default_factory=list)  # at the client
    server_ms: list[float] = field(default_factory=list)  # the worker's own time, from its reply
    errors: int = 0


async def _loop(load: RecallLoad, stop: Any, conn: Connection) -> RecallResult:
    from memstream.producers.client import MemoryClient

    result = RecallResult()
    own = {}
    for tenant in {s.tenant for s in load.pool}:
        client = MemoryClient(tenant, nats_url=load.nats_url, namespace=load.namespace)
        own[tenant] = await client.connect()
    conn.send("ready")
    rng = random.Random(load.seed)
    gap = 1.0 / load.rate if load.rate > 0 else 0.0
    due = time.perf_counter()
    try:
        while not stop.is_set():
            if gap:  # one request per slot; a late one starts at once
                due += gap
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
            sess = rng.choice(load.pool)
            query = rng.choice(QUERIES).format(thing=rng.choice(THINGS), day=rng.choice(DAYS))
            t0 = time.perf_counter()
            try:
                reply = await own[sess.tenant].recall(query, user=sess.user, top_k=10)
            except Exception:  # noqa: BLE001 - counted and reported: the bench goes on
                result.errors += 1
                continue
            result.latency_ms.append((time.perf_counter() - t0) * 1000)
            if "total" in reply.timings_ms:  # a cached reply carries none
                result.server_ms.append(reply.timings_ms["total"])
    finally:
        for c in own.values():
            await c.close()
    return result


def _main(load: RecallLoad, stop: Any, conn: Connection) -> None:
    try:
        conn.send(asyncio.run(_loop(load, stop, conn)))
    except BaseException as exc:  # the parent reports it instead of waiting for a result
        conn.send(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        conn.close()


class RecallClient:
    """``start`` the process and wait until it is connected; ``finish`` stops it and returns
    what it measured."""

    def __init__(self, load: RecallLoad) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self._conn, child = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_main, args=(load, self._stop, child), name="memstream-bench-recall", daemon=True
        )
        self._child = child

    @property
    def pid(self) -> int | None:
        return self._process.pid

    async def start(self) -> None:
        self._process.start()
        self._child.close()
        first = await asyncio.to_thread(self._receive, _ANSWER_S)
        if first != "ready":
            raise RuntimeError(f"the recall client did not start: {first}")

    async def finish(self) -> RecallResult:
        self._stop.set()
        try:
            result = await asyncio.to_thread(self._receive, _ANSWER_S)
        finally:
            await asyncio.to_thread(self._process.join, 5)
            if self._process.is_alive():
                self._process.kill()
        if not isinstance(result, RecallResult):
            raise RuntimeError(f"the recall client failed: {result}")
        return result

    def _receive(self, timeout: float) -> Any:
        if not self._conn.poll(timeout):
            raise TimeoutError(f"the recall client did not answer in {timeout:.0f} s")
        return self._conn.recv()

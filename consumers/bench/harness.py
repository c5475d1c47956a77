"""A throwaway memstream for benchmarks: the embedded stack (or the configured services) with
every worker in-process, under a fresh namespace and Postgres schema, removed afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from memstream.consumers import helper
from memstream.consumers.app import Worker
from memstream.consumers.logs import configure as configure_logging
from memstream.consumers.natsconn import nats_options
from memstream.consumers.redaction_key import redaction_key
from memstream.consumers.run import make_worker
from memstream.consumers.stack import Stack
from memstream.consumers.topology import drained, topology
from memstream.producers.client import MemoryClient
from memstream.schemas.settings import Settings
from memstream.storage.embedding import make_embedder


def cpu_gauge() -> float:
    """Seconds a fixed pure-Python loop takes now: machines (and one machine over an hour)
    differ by 40% here, so results are printed with it."""
    t0 = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return round(time.perf_counter() - t0, 2)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def progress(label: str, done: int, total: int, started: float) -> None:
    """One self-overwriting progress line on stderr."""
    rate = done / max(time.perf_counter() - started, 1e-9)
    end = "\n" if done >= total else "\r"
    print(f"  {label}: {done}/{total} ({rate:,.0f}/s)", end=end, file=sys.stderr, flush=True)


@dataclass
class Bench:
    settings: Settings
    stack: Stack
    worker: Worker

    def client(self, tenant: str, **kw: Any) -> MemoryClient:
        return MemoryClient(
            tenant, nats_url=self.stack.nats_url, namespace=self.settings.namespace, **kw
        )

    async def drained(self) -> bool:
        return await drained(self.worker.deps.js, self.settings)

    async def wait_drained(self, limit_s: float = 600.0) -> float:
        return await until_drained(self.drained, limit_s)


async def until_drained(is_drained: Callable[[], Awaitable[bool]], limit_s: float) -> float:
    """Seconds until every stage consumer is empty (checked twice, 100 ms apart)."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        if await is_drained():
            await asyncio.sleep(0.1)
            if await is_drained():
                return time.perf_counter() - started
        await asyncio.sleep(0.05)
    raise TimeoutError(f"ingestion did not finish within {limit_s:.0f} s")


@contextlib.asynccontextmanager
async def bench_stack(keep: bool = False) -> AsyncIterator[Bench]:
    """Start (or connect to) the services, run the workers, clean up after."""
    configure_logging("WARNING")  # the benchmark prints its own progress and results
    base = Settings()
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="memstream-bench-") as tmp:
        settings = base.model_copy(
            update={
                "namespace": namespace,
                "state_dir": base.state_dir if keep else Path(tmp),
                "collection": f"{base.collection}_{namespace}",
            }
        )
        embedder = make_embedder(settings.embedding_model, settings.embedding_path)
        stack = await Stack.open(settings, schema=namespace, dim=embedder.dim)
        worker = make_worker(stack, embedder)
        if helper.wanted(settings):  # as `memstream worker` has one: the path users run
            worker.services.helper = helper.Helper(settings, redaction_key(settings, dev=True))
        await worker.vectors.ensure(embedder.dim)
        await worker.start()
        try:
            yield Bench(settings, stack, worker)
        finally:
            await worker.stop()
            if not keep:
                await _cleanup(stack, settings)
            await stack.close()


async def _cleanup(stack: Stack, settings: Settings) -> None:
    nc = await nats.connect(stack.nats_url, **nats_options(settings))
    js = nc.jetstream()
    for s in topology(settings).streams:
        with contextlib.suppress(Exception):
            await js.delete_stream(s.name or "")
    await nc.close()
    await stack.pg.drop_schema(stack.schema)

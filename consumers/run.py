"""``memstream dev`` (embedded stack + every worker in one process) and
``memstream worker`` (workers against configured services; ``--stages`` picks the roles of
this process, consumers/roles.py). The stack they run against is opened in
consumers/stack.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memstream.consumers import helper, indexproc, loops, priority, roles
from memstream.consumers.announce import announcement as announce_text
from memstream.consumers.app import Worker
from memstream.consumers.cpulatency import CpuLatencyHold, hold_cpu_latency
from memstream.consumers.logs import configure, log
from memstream.consumers.memlock import lock_memory
from memstream.consumers.redaction_key import make_redactor, redaction_key
from memstream.consumers.services import Services
from memstream.consumers.stack import Stack
from memstream.pipeline.redact import Redacts
from memstream.producers.connection import display_url
from memstream.schemas.errors import ConfigurationError, StorageUnavailable
from memstream.schemas.settings import ROLES, Settings
from memstream.schemas.stack import remove_stack, write_stack
from memstream.storage.embedding import make_embedder
from memstream.storage.ports import Embedder


def make_worker(
    stack: Stack, embedder: Embedder | None = None, redactor: Redacts | None = None
) -> Worker:
    s = stack.settings
    embedder = embedder or make_embedder(s.embedding_model, s.embedding_path)
    # the configured key, else the state directory's development key (benchmarks)
    redactor = redactor or make_redactor(s, redaction_key(s, dev=True))
    return Worker(Services(s, stack.pg, stack.vectors, embedder, redactor), stack.nats_url)


async def ensure_index(worker: Worker) -> None:
    """Create the collection; if the vector server is down, start degraded (keyword recall
    from Postgres, memories kept unindexed) and let the maintenance loop retry."""
    try:
        await worker.vectors.ensure(worker.embedder.dim)
    except StorageUnavailable:
        log.warning("startup.vector_index_unreachable", action="starting degraded")


def locked(wanted: bool) -> bool:
    """``mlockall`` the process if ``wanted`` (``MEMSTREAM_LOCK_MEMORY``); logs the outcome."""
    if not wanted:
        return False
    why = lock_memory()
    if why is None:
        log.info("worker.memory_locked")
        return True
    log.warning("worker.memory_lock_failed", reason=why)
    return False


def cpu_latency(us: int | None) -> CpuLatencyHold | None:
    """Hold the CPUs' wake-up latency at ``us`` µs (``MEMSTREAM_CPU_LATENCY_US``) if set;
    logs the outcome. The hold lasts until it is closed or the process exits."""
    if us is None:
        return None
    hold = hold_cpu_latency(us)
    if isinstance(hold, str):
        log.warning("worker.cpu_latency_failed", reason=hold)
        return None
    log.info("worker.cpu_latency_held", us=us)
    return hold


def _lower_ingest(
    settings: Settings, remote: indexproc.RemoteIndex | None, child: helper.Helper | None
) -> None:
    """``MEMSTREAM_STAGE__INGEST_NICE`` for a worker that does not answer recall itself: its
    threads, but the one that starts its index processes, and its helper process
    (consumers/priority.py)."""
    nice = settings.stage.ingest_nice
    if not nice:
        return
    if "recall" in settings.stages:
        log.warning("stage.ingest_nice_ignored", reason="this process answers recall itself")
        return
    keep = {remote.launcher_thread} if remote is not None and remote.launcher_thread else set()
    priority.lower_ingest(nice, keep, child.pid if child is not None else None)


@dataclass
class Running:
    """What ``serve`` has started so far, stopped in reverse by ``close`` whether start-up
    finished or a signal cut it short."""

    stack: Stack | None = None
    worker: Worker | None = None
    started: bool = False  # the whole start-up finished
    ops: Any = None
    console: Any = None
    gateway: Any = None
    latency_hold: CpuLatencyHold | None = None

    async def close(self, lost: bool = False) -> None:
        if self.ops is not None:
            self.ops.close()
        if self.gateway is not None:
            await self.gateway.stop()
        if self.console is not None:
            await self.console.stop()
        if self.worker is not None:
            if lost or not self.started:  # connections gone or half made: stop what can be
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.worker.stop(), 15)
            else:
                await self.worker.stop()
        if self.stack is not None:
            await self.stack.close()
        if self.latency_hold is not None:
            self.latency_hold.close()


async def serve(settings: Settings, announce: bool, dev_key: bool = False) -> int:
    """``dev_key``: without MEMSTREAM_REDACTION_KEY, use the state directory's random key
    (``memstream dev`` always may; ``memstream worker`` only with --dev-redaction-key)."""
    try:  # before anything starts: a worker without a secret key must not run at all
        roles.check(settings)
        key = redaction_key(settings, dev=announce or dev_key)
    except ConfigurationError as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 2
    configure(settings.log_level)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    # from the first step: a supervisor's stop or a Ctrl-C while the servers come up stops
    # what has started (the embedded servers run in sessions of their own, and a signal's
    # default action would leave them running)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    up = Running()
    starting = asyncio.create_task(_start(up, settings, key, announce))
    signalled = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, signalled], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        print("stopping ...", flush=True)
        starting.cancel()
        with contextlib.suppress(BaseException):
            await starting
        await up.close()
        print("stopped.", flush=True)
        return 0
    try:
        starting.result()
    except ConfigurationError as exc:  # e.g. a shard another process holds
        signalled.cancel()
        log.error("startup.failed", error=str(exc))
        print(f"memstream: {exc}", file=sys.stderr)
        with contextlib.suppress(Exception):
            await up.close()
        return 2
    except BaseException:
        signalled.cancel()
        with contextlib.suppress(Exception):
            await up.close()
        raise
    assert up.stack is not None and up.worker is not None
    stack, worker = up.stack, up.worker
    # what clients on this host need to find the stack; never a credential (they come from
    # the MEMSTREAM_NATS_* variables, see docs/security.md)
    found = {"nats_url": display_url(stack.nats_url), "namespace": settings.namespace}
    if up.gateway is not None:
        found["gateway_url"] = up.gateway.url
    if not settings.database_url:  # the embedded database: loopback, no password
        found["database_url"] = stack.database_url
    if up.console is not None:
        found["console_url"] = up.console.url
    write_stack(settings.state_dir, found)
    if announce:
        print(announce_text(settings, up), flush=True)
    # a NATS connection that closed for good (it reconnects forever: only if the client gave
    # up anyway) ends the worker non-zero, for its supervisor to restart it
    ended = [signalled, asyncio.create_task(worker.lost.wait())]
    await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
    for task in ended:
        task.cancel()
    code = 1 if worker.lost.is_set() else 0
    print("stopping ...", flush=True)
    await up.close(lost=bool(code))
    with contextlib.suppress(OSError):
        remove_stack(settings.state_dir)
    print("stopped.", flush=True)
    return code


async def _start(up: Running, settings: Settings, key: bytes, announce: bool) -> None:
    """Start everything, recording each part in ``up`` as soon as it exists (so that a stop
    part way stops it)."""
    embedder = make_embedder(settings.embedding_model, settings.embedding_path)
    redactor = make_redactor(settings, key)  # before any server starts: a bad policy stops here
    stack = up.stack = await Stack.open(settings, dim=embedder.dim)
    remote: indexproc.RemoteIndex | None = None
    if indexproc.wanted(stack.settings):  # the shard opens (and locks) in that process
        remote = indexproc.RemoteIndex(
            stack.settings, stack.nats_url, stack.database_url, key, stack.schema
        )
        stack.vectors, stack.settings = remote, indexproc.without_recall(stack.settings)
        await remote.start()
    worker = up.worker = make_worker(stack, embedder, redactor)
    worker.dev_redaction_key = settings.redaction_key is None
    if helper.wanted(settings):
        worker.services.helper = helper.Helper(settings, key)
    if roles.holds_index(settings.stages):  # a Qdrant Edge shard opens (and locks) here
        await ensure_index(worker)
    await worker.start()
    up.started = True  # the worker: a stop from here on drains it in full
    _lower_ingest(stack.settings, remote, worker.services.helper)
    locked(settings.lock_memory)
    up.latency_hold = cpu_latency(settings.cpu_latency_us)
    if settings.ops_port is not None:
        from memstream.consumers.ops import serve_http

        try:
            up.ops = await serve_http(worker, settings.ops_host, settings.ops_port)
        except OSError:  # port taken: a second worker on this host; take any free one
            up.ops = await serve_http(worker, settings.ops_host, 0)
    from memstream.consumers import webconsole

    up.console = await webconsole.start(settings, stack.nats_url, worker.redactor, dev=announce)
    if announce:
        up.gateway = await _start_gateway(settings, stack.nats_url)


async def _start_gateway(settings: Settings, nats_url: str) -> Any:
    """The HTTP gateway next to the workers (``memstream dev``): on MEMSTREAM_GATEWAY_PORT,
    or any free port if that one is taken; None when disabled or not installed."""
    if settings.gateway_port is None:
        return None
    try:
        from memstream.gateway.cli import start_gateway
    except ImportError:  # installed without the gateway extra
        log.warning("gateway.not_installed", hint="pip install 'memstream[gateway]'")
        return None
    try:
        return await start_gateway(settings, nats_url, settings.gateway_host, settings.gateway_port)
    except OSError:  # port taken (another stack on this host): take any free one
        return await start_gateway(settings, nats_url, settings.gateway_host, 0)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="run the whole pipeline (embedded stack unless URLs are set)")
    dev.add_argument("--state-dir", type=Path, default=None)
    dev.add_argument(
        "--bus-auth",
        action="store_true",
        help="run the embedded NATS in operator mode: tenants apart, credentials and API keys "
        "required (docs/security.md)",
    )
    dev.set_defaults(func=lambda a: _serve_on_its_loop(_settings(a), announce=True))
    worker = sub.add_parser("worker", help="run the workers against configured services")
    worker.add_argument("--state-dir", type=Path, default=None)
    worker.add_argument(
        "--stages",
        type=_roles,
        default=None,
        help="the roles of this process, comma-separated, from "
        f"{','.join(ROLES)} (default: all). With Qdrant Edge, dedupe, store and recall run "
        "together in the one process that owns the shard; extra processes take "
        "extract,redact (docs/ingest.md)",
    )
    worker.add_argument(
        "--dev-redaction-key",
        action="store_true",
        help="development only: without MEMSTREAM_REDACTION_KEY, key redaction placeholders "
        "with a random key kept in the state directory",
    )
    worker.set_defaults(
        func=lambda a: _serve_on_its_loop(_settings(a), False, dev_key=a.dev_redaction_key)
    )


def _serve_on_its_loop(settings: Settings, announce: bool, dev_key: bool = False) -> int:
    return loops.run(serve(settings, announce, dev_key=dev_key), settings.event_loop)


def _roles(text: str) -> tuple[str, ...]:
    try:
        return roles.parse(text)
    except ConfigurationError as exc:  # argparse prints it with the usage, exit code 2
        raise argparse.ArgumentTypeError(str(exc)) from None


def _settings(a: argparse.Namespace) -> Settings:
    s = Settings()
    update: dict[str, Any] = {"state_dir": a.state_dir} if a.state_dir else {}
    if getattr(a, "bus_auth", False):
        update["embedded_bus_auth"] = True
    if getattr(a, "stages", None):
        update["stages"] = a.stages
    return s.model_copy(update=update) if update else s

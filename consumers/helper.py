"""Extraction and redaction in a helper process, beside the one that owns the index.

A worker that owns a Qdrant Edge shard is one Python process: every stage of a fused batch
takes turns on its interpreter lock, and the index engine's calls hold that lock too, so the
process uses about one core however many the machine has (docs/benchmarks.md). Extraction,
redaction and the embedding of the candidates are pure: they need the settings, the
redaction key and the model, not the stores. ``Helper`` runs them for a whole batch in a
child process, so that they take the other core, and the batch after is prepared there while
this one is deduplicated and stored (``BatchStage.begin``; docs/ingest.md, "Fused stages").

The child is started with ``spawn`` (never ``fork``: the parent has threads and open
connections) and builds its redactor and embedder from the same settings and key as the
parent (``consumers/run.py``). What it returns is the same as the in-process path: the
candidates of each turn, redacted, each carrying its vector. A batch the child cannot
prepare (an error, the child gone) fails as any batch does, to singles, which run in this
process; a new child is started for the next batch.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memstream.consumers.logs import configure, log
from memstream.consumers.stages import embedded, redact_candidate
from memstream.pipeline.extract import extract
from memstream.pipeline.redact import Redacts
from memstream.schemas.events import TurnEvent
from memstream.schemas.memory import Candidate
from memstream.schemas.settings import Settings
from memstream.storage.ports import Embedder


@dataclass(frozen=True)
class Prepared:
    """A batch's turns made ready for dedupe: the candidates of each turn (in order), and
    the child's time spent extracting and redacting (with the embedding), for the stages'
    metrics."""

    candidates: list[list[Candidate]]
    extract_s: float
    redact_s: float


PARENT_CHECK_S = 0.5  # how often the helper checks that its worker is still there
_tools: tuple[Redacts, Embedder] | None = None  # the child's redactor and embedder


def _start_child(settings: Settings, key: bytes) -> None:
    """The child's initializer: its redactor and embedder, as the parent builds them."""
    global _tools
    # Ctrl-C reaches the whole process group: the parent stops the child, not the signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker killed outright (kill -9, out of memory) cannot stop its helper, and the
    # helper's work queue never ends: the child holds both ends of its pipe. It leaves on its
    # own once it has been handed to another parent.
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()
    from memstream.consumers.redaction_key import make_redactor
    from memstream.storage.embedding import make_embedder

    configure(settings.log_level)  # the worker's log format and level
    _tools = (
        make_redactor(settings, key),
        make_embedder(settings.embedding_model, settings.embedding_path),
    )


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def prepare(events: Sequence[TurnEvent], redactor: Redacts, embedder: Embedder) -> Prepared:
    """Each turn's candidates, redacted and embedded: what the fused extract and redact
    stages make in process, made here in one call (the child's work)."""
    started = time.perf_counter()
    found = [extract(e) for e in events]
    extracted_at = time.perf_counter()
    # one embedding call for the whole batch (no event loop here to hand back to); a text's
    # vector does not depend on the others of the call
    flat = embedded(embedder, [redact_candidate(redactor, c) for cands in found for c in cands])
    done: list[list[Candidate]] = []
    at = 0
    for cands in found:
        done.append(flat[at : at + len(cands)])
        at += len(cands)
    return Prepared(done, extracted_at - started, time.perf_counter() - extracted_at)


def _prepare_in_child(events: list[TurnEvent]) -> Prepared:
    if _tools is None:  # pragma: no cover - the initializer always ran first
        raise RuntimeError("helper process without its tools")
    return prepare(events, *_tools)


def _noop() -> None:
    return None


class Helper:
    """One helper process (``MEMSTREAM_STAGE__HELPER``) that prepares batches of turns."""

    def __init__(self, settings: Settings, key: bytes) -> None:
        self._settings, self._key = settings, key
        self._pool: ProcessPoolExecutor | None = None
        self.prepared = 0  # batches the helper prepared
        self.restarts = 0  # times a helper process was found gone and replaced

    def __repr__(self) -> str:
        return f"Helper(running={self._pool is not None}, key=<hidden>)"

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_child,
            initargs=(self._settings, self._key),
        )

    async def start(self) -> None:
        """Start the child and wait until it is ready (its model loaded)."""
        self._pool = self._new_pool()
        await asyncio.get_running_loop().run_in_executor(self._pool, _noop)

    async def prepare(self, events: list[TurnEvent]) -> Prepared:
        """``prepare`` for the batch, in the child. If the child is gone, a new one is
        started for the next call and this one raises (the batch goes to singles)."""
        pool = self._pool or self._new_pool()
        self._pool = pool
        try:
            done = await asyncio.get_running_loop().run_in_executor(pool, _prepare_in_child, events)
        except BrokenProcessPool:
            log.warning("helper.restarted", reason="the helper process exited")
            if self._pool is pool:
                self._pool = None
                self.restarts += 1
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        self.prepared += 1
        return done

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)


def wanted(settings: Settings) -> bool:
    """Whether a worker of these settings gets a helper process: it runs extract and redact
    fused, with the rules extractor alone (the LLM extractor calls out from the worker), on
    a machine with a core to spare."""
    stage = settings.stage
    return (
        stage.helper
        and stage.batched
        and stage.fused
        and settings.extractor == "rules"
        and {"extract", "redact"} <= set(settings.stages)
        and usable_cpus() >= 2
    )


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, and a cgroup's CPU quota (a container
    limited to one CPU sees every CPU of its host in ``os.cpu_count``)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit to read: the affinity stands
    return n


def retrieved(task: asyncio.Task[Any]) -> None:
    """Done callback: a prepared batch nobody awaited (it went to singles) does not log
    'exception was never retrieved'."""
    if not task.cancelled():
        task.exception()

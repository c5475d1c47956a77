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

The child has two pipes of its own, the work in and the answers out, and the worker keeps only
its ends of them. A child killed while it writes an answer (the answer of a batch is large:
each candidate carries its vector) then ends the worker's read with EOF. (A
``ProcessPoolExecutor`` holds both ends of its result queue in the parent: a child killed in
the middle of a write left its manager thread waiting for the rest of the answer for ever,
and the worker with it; seen in the fault suite's ``helper_kill``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from memstream.consumers import spawned
from memstream.consumers.logs import configure, log
from memstream.consumers.quietgc import quieter_gc
from memstream.consumers.stages import embedded, redaction
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


def _child(work: Connection, answers: Connection, settings: Settings, key: bytes) -> None:
    """The child's main: its redactor and embedder, built as the parent builds them, then one
    answer per batch of turns until the worker closes the work pipe."""
    # Ctrl-C reaches the whole process group: the parent stops the child, not the signal
    spawned.ignore_ctrl_c()
    # A worker killed outright (kill -9, out of memory) cannot stop its helper: the child
    # leaves on its own once it has been handed to another parent (or its work pipe ends).
    threading.Thread(target=spawned.exit_with, args=(os.getppid(),), daemon=True).start()
    try:
        from memstream.consumers.redaction_key import make_redactor
        from memstream.storage.embedding import make_embedder

        configure(settings.log_level)  # the worker's log format and level
        tools = (
            make_redactor(settings, key),
            make_embedder(settings.embedding_model, settings.embedding_path),
        )
    except Exception as exc:  # noqa: BLE001 - the worker's start raises it
        _answer(answers, ("error", exc))
        return
    quieter_gc()
    _answer(answers, ("ready", None))
    while True:
        try:
            events = pickle.loads(work.recv_bytes())
        except (EOFError, OSError):
            return  # the worker closed the pipe, or is gone
        try:
            answer: tuple[str, Any] = ("done", prepare(events, *tools))
        except Exception as exc:  # noqa: BLE001 - that batch fails in the worker, to singles
            answer = ("error", exc)
        _answer(answers, answer)


def _answer(answers: Connection, answer: tuple[str, Any]) -> None:
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an error that does not pickle: its type only
        data = pickle.dumps(("error", RuntimeError(f"helper: {type(exc).__name__}")))
    with contextlib.suppress(OSError):  # the worker is gone
        answers.send_bytes(data)


def prepare(events: Sequence[TurnEvent], redactor: Redacts, embedder: Embedder) -> Prepared:
    """Each turn's candidates, redacted and embedded: what the fused extract and redact
    stages make in process, made here in one call (the child's work)."""
    started = time.perf_counter()
    found = [extract(e) for e in events]
    extracted_at = time.perf_counter()
    # one embedding call for the whole batch (no event loop here to hand back to); a text's
    # vector does not depend on the others of the call, but for float rounding (~1e-9)
    every = [c for cands in found for c in cands]
    flat = embedded(embedder, every, [redaction(redactor, c) for c in every])
    done: list[list[Candidate]] = []
    at = 0
    for cands in found:
        done.append(flat[at : at + len(cands)])
        at += len(cands)
    return Prepared(done, extracted_at - started, time.perf_counter() - extracted_at)


class HelperGone(RuntimeError):
    """The helper process exited (killed, out of memory) before it answered."""


@dataclass
class _Child:
    proc: Any  # multiprocessing's Process (spawn)
    work: Connection  # the worker's end: batches out
    answers: Connection  # the worker's end: answers in

    def stop(self, wait_s: float) -> None:
        for end in (self.work, self.answers):
            with contextlib.suppress(OSError):
                end.close()  # the child reads EOF and leaves
        self.proc.join(wait_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class Helper:
    """One helper process (``MEMSTREAM_STAGE__HELPER``) that prepares batches of turns."""

    def __init__(self, settings: Settings, key: bytes) -> None:
        self._settings, self._key = settings, key
        self._child: _Child | None = None
        self._lock = asyncio.Lock()  # one batch at a time in the child, answers in order
        self.prepared = 0  # batches the helper prepared
        self.restarts = 0  # times a helper process was found gone and replaced

    def __repr__(self) -> str:
        return f"Helper(running={self._child is not None}, key=<hidden>)"

    @property
    def pid(self) -> int | None:
        """The helper process's id while one runs."""
        return self._child.proc.pid if self._child is not None else None

    async def _spawn(self) -> _Child:
        ctx = multiprocessing.get_context("spawn")
        work_in, work_out = ctx.Pipe(duplex=False)
        answers_in, answers_out = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_child,
            args=(work_in, answers_out, self._settings, self._key),
            name="memstream-helper",
            daemon=True,
        )
        spawned.start(proc)
        # only the worker's ends stay here: a child that dies closes the last write end of
        # its answers, and a read waiting for them ends with EOF
        work_in.close()
        answers_out.close()
        child = _Child(proc, work_out, answers_in)
        try:
            kind, value = await self._receive(child)
        except BaseException:
            await asyncio.to_thread(child.stop, 0)
            raise
        if kind != "ready":
            await asyncio.to_thread(child.stop, 5)
            raise value
        return child

    @staticmethod
    async def _receive(child: _Child) -> tuple[str, Any]:
        try:
            data = await asyncio.to_thread(child.answers.recv_bytes)
        except (EOFError, OSError):
            # not chained: a broken pipe is a ConnectionError, which the stages hold as a
            # server's outage and retry in place; a child that is gone fails its batch now
            raise HelperGone("the helper process exited") from None
        answer: tuple[str, Any] = pickle.loads(data)
        return answer

    async def start(self) -> None:
        """Start the child and wait until it is ready (its model loaded)."""
        async with self._lock:
            if self._child is None:
                self._child = await self._spawn()

    async def prepare(self, events: list[TurnEvent]) -> Prepared:
        """``prepare`` for the batch, in the child. If the child is gone, this call raises
        (the batch goes to singles) and the next one starts a new child."""
        async with self._lock:
            child = self._child or await self._spawn()
            self._child = child
            done = False
            try:
                data = pickle.dumps(events, protocol=pickle.HIGHEST_PROTOCOL)
                try:
                    await asyncio.to_thread(child.work.send_bytes, data)
                except OSError:  # a broken pipe: the child is gone (not an outage, as above)
                    raise HelperGone("the helper process exited") from None
                kind, value = await self._receive(child)
                done = True
            except HelperGone:
                log.warning("helper.restarted", reason="the helper process exited")
                self.restarts += 1
                raise
            finally:
                if not done:  # gone, or this call cancelled with an answer still to come
                    self._child = None
                    await asyncio.to_thread(child.stop, 0)
            if kind == "error":
                raise value
            self.prepared += 1
            prepared: Prepared = value
            return prepared

    async def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            await asyncio.to_thread(child.stop, 10)


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

"""Fused stages: a process hands a batch on in memory through the consecutive stages it runs
(docs/ingest.md, "Fused stages"). With all four, a batch of turns goes through redact, dedupe
and store in the same call, and the turns are acked once their memories are durable, with no
hand-off message in between; each stage of the chain is still timed and counted as a stage."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from memstream.consumers.batch_dedupe import Merges, deduped
from memstream.consumers.batch_stages import (
    BATCH_STAGES,
    count_redactions,
    extracted,
    memory_on,
    redacted,
)
from memstream.consumers.batch_store import Tail, publish_to_stage, settle, store_begun, stored
from memstream.consumers.batching import OVERLAP, BatchStage, BatchWork, Begin, Overlap
from memstream.consumers.helper import retrieved
from memstream.consumers.stagemetrics import StageMetrics
from memstream.consumers.stages import Deps
from memstream.schemas.events import TurnEvent
from memstream.schemas.memory import Candidate
from memstream.schemas.subjects import STAGES

R = TypeVar("R")


async def _phase(deps: Deps, stage: str, size: int, work: Awaitable[R]) -> R:
    """One stage's step inside a fused batch, counted in that stage's metrics as a batch of
    ``size`` handled (not acked: no message of its own was delivered)."""
    m = deps.metrics.setdefault(stage, StageMetrics())
    started = time.perf_counter()
    m.enter()
    try:
        out = await work
    finally:
        elapsed = time.perf_counter() - started
        m.busy_s += elapsed
        m.leave()
        if deps.telemetry is not None:
            deps.telemetry.stage_handled(stage, elapsed, size)
    m.batches += 1
    m.processed += size
    m.fused += size
    return out


def chain_of(stages: Sequence[str], roles: Collection[str]) -> dict[str, tuple[str, ...]]:
    """Each stage of ``roles`` with the stages it hands on to in memory: the run of
    consecutive stages from it that this process also runs (``("dedupe", "store")`` for a
    process running dedupe and store)."""
    chains = {}
    for i, first in enumerate(stages):
        if first not in roles:
            continue
        run = [first]
        for later in stages[i + 1 :]:
            if later not in roles:
                break
            run.append(later)
        chains[first] = tuple(run)
    return chains


async def _step(
    deps: Deps,
    stage: str,
    cands: list[Candidate],
    merges: Merges | None,
    steps: Sequence[str],
    tails: list[Tail] | None = None,
) -> tuple[list[Candidate], Merges | None, int]:
    """One candidate stage of a fused chain ``steps``: (what it hands on, the merges still
    to settle, its output count). Store settles the merges with its own writes, and hands on
    nothing; with ``tails``, it leaves its index write and events there, to be awaited."""
    if stage == "redact":
        out = await redacted(deps, cands)
        return out, merges, len(out)
    if stage == "dedupe":
        out, found = await deduped(deps, cands, mates="store" in steps)
        return out, found, len(out)
    if tails is None:
        return [], None, await stored(deps, cands, merges)
    kept, tail = await store_begun(deps, cands, merges)
    tails.append(tail)
    return [], None, kept


async def _later(
    deps: Deps,
    steps: Sequence[str],
    done: int,
    cands: list[Candidate],
    merges: Merges | None,
    tails: list[Tail] | None = None,
) -> None:
    """The stages of ``steps`` after the first ``done``, in memory; then what the last one
    made goes to the stage after it (nothing after store). ``tails``: as in ``_step``."""
    for stage in steps[done:]:
        cands, merges, made = await _phase(
            deps, stage, len(cands), _step(deps, stage, cands, merges, steps, tails)
        )
        deps.metrics[stage].outputs += made
    if steps[-1] != "store":
        if merges is not None:
            await settle(deps, merges)
        await publish_to_stage(deps, STAGES[STAGES.index(steps[-1]) + 1], cands)


def fused(chain: Sequence[str]) -> BatchWork[Any]:
    """The batch work of ``chain``'s first stage with the later ones of ``chain`` done in
    memory, in this process: what each would publish to the next is handed on directly, and
    what the last one makes goes to the stage after it (nothing after store). The runner acks
    the first stage's messages once that is durable; a failure goes the way of any batch
    failure, to singles, whose single path publishes to the next stage's subject."""
    steps = tuple(chain)

    async def work(deps: Deps, values: list[Any]) -> int:
        cands, merges, outputs = await _first(deps, steps, values)
        await _later(deps, steps, 1, cands, merges)
        return outputs

    return work


async def _first(
    deps: Deps, steps: Sequence[str], values: list[Any]
) -> tuple[list[Candidate], Merges | None, int]:
    """The first stage of a fused chain over its decoded batch: (what it hands on, the
    merges still to settle, its output count). The runner counts that stage's batch."""
    if steps[0] == "extract":
        cands = await extracted(deps, values)
        return cands, None, len(cands)
    return await _step(deps, steps[0], values, None, steps)


def _helped(chain: Sequence[str]) -> Begin[TurnEvent]:
    """``BatchStage.begin`` of a chain that starts with extract and redact: the batch's turns
    go to the helper process at once (``consumers/helper.py``); the rest of the work takes
    its candidates from there, then runs the later stages here. Without a helper (or with
    the LLM extractor, which calls out from this process), the work of ``_after_rows``."""
    steps = tuple(chain)
    unhelped = _after_rows(chain)

    def begin(deps: Deps, events: list[TurnEvent]) -> Callable[[], Awaitable[int]]:
        helper = deps.services.helper
        if helper is None or deps.llm is not None:
            return unhelped(deps, events)
        ahead = asyncio.ensure_future(helper.prepare(events))
        ahead.add_done_callback(retrieved)

        async def rest() -> int:
            started = time.perf_counter()
            on = await memory_on(deps, events)
            deps.stepped("memory_off", started)
            started = time.perf_counter()
            prepared = await ahead
            deps.stepped("helper", started)
            cands = [
                c for keep, cs in zip(on, prepared.candidates, strict=True) if keep for c in cs
            ]
            # redact's step ran in the helper: counted as the stage's, with the helper's time
            m = deps.metrics.setdefault("redact", StageMetrics())
            m.batches += 1
            m.processed += len(cands)
            m.fused += len(cands)
            m.outputs += len(cands)
            m.busy_s += prepared.redact_s
            m.active_s += prepared.redact_s
            if deps.telemetry is not None:
                deps.telemetry.stage_handled("redact", prepared.redact_s, len(cands))
            count_redactions(deps, cands)
            overlap = OVERLAP.get()
            if overlap is None:
                await _later(deps, steps, 2, cands, None)
            else:
                await _overlapping(deps, steps, 2, cands, None, overlap)
            return len(cands)

        return rest

    return begin


def _after_rows(chain: Sequence[str]) -> Begin[Any]:
    """``BatchStage.begin`` of a chain through dedupe and store whose batch has nothing to
    start ahead (no helper: the chain dedupe, store of an index owner beside extract/redact
    processes, or a whole chain with the LLM extractor or without a helper process): the
    batch's work is the plain fused one, but it overlaps the batch before as a helped one
    does (``_overlapping``), so the next batch's head begins once this one's rows are
    written, not after its index write, events and acks. One batch at a time, each through
    all its round trips, left an index owner's dedupe busy nearly all the time while it used
    a third of a core (docs/benchmarks.md, "fourteenth session")."""
    steps = tuple(chain)
    plain = fused(chain)

    def begin(deps: Deps, values: list[Any]) -> Callable[[], Awaitable[int]]:
        async def rest() -> int:
            overlap = OVERLAP.get()
            if overlap is None:
                return await plain(deps, values)
            cands, merges, outputs = await _first(deps, steps, values)
            await _overlapping(deps, steps, 1, cands, merges, overlap)
            return outputs

        return rest

    return begin


async def _overlapping(
    deps: Deps,
    steps: Sequence[str],
    done: int,
    cands: list[Candidate],
    merges: Merges | None,
    overlap: Overlap,
) -> None:
    """``_later`` for a batch that shares the pipeline with the one before it: once its rows
    are written, the next batch's dedupe may begin (``Overlap.head_done``); its index write
    and events follow, the events only after the batch before has finished."""
    tails: list[Tail] = []
    await _later(deps, steps, done, cands, merges, tails)
    overlap.head_done.set()
    for tail in tails:
        await _timed_tail(deps, tail(overlap.after_before))


async def _timed_tail(deps: Deps, tail: Awaitable[None]) -> None:
    """A store tail (index write, events) counted in the store stage's busy time."""
    started = time.perf_counter()
    try:
        await tail
    finally:
        deps.metrics.setdefault("store", StageMetrics()).busy_s += time.perf_counter() - started


def batch_stage(chain: Sequence[str], helped: bool = False) -> BatchStage[Any]:
    """The batch stage of ``chain[0]``, fused through the rest of ``chain``; ``helped``: its
    extraction and redaction started ahead, in the helper process. A chain through dedupe
    and store overlaps its batches (``Overlap``), helped or not."""
    plain = BATCH_STAGES[chain[0]]
    if len(chain) == 1:
        return plain
    begin: Begin[Any] | None = None
    if helped and tuple(chain[:2]) == ("extract", "redact"):
        begin = _helped(chain)
    elif "dedupe" in chain and "store" in chain:
        begin = _after_rows(chain)
    return BatchStage(plain.decode, fused(chain), plain.single, begin)

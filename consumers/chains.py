"""Fused stages: a process hands a batch on in memory through the consecutive stages it runs
(docs/ingest.md, "Fused stages"). With all four, a batch of turns goes through redact, dedupe
and store in the same call, and the turns are acked once their memories are durable, with no
hand-off message in between; each stage of the chain is still timed and counted as a stage."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Collection, Sequence
from typing import Any, TypeVar

from memstream.consumers.batch_stages import (
    BATCH_STAGES,
    Merges,
    deduped,
    extracted,
    publish_to_stage,
    redacted,
    settle,
    stored,
)
from memstream.consumers.batching import BatchStage, BatchWork
from memstream.consumers.stages import Deps, StageMetrics
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
    deps: Deps, stage: str, cands: list[Candidate], merges: Merges | None
) -> tuple[list[Candidate], Merges | None, int]:
    """One candidate stage of a fused chain: (what it hands on, the merges still to settle,
    its output count). Store settles the merges with its own writes, and hands on nothing."""
    if stage == "redact":
        out = await redacted(deps, cands)
        return out, merges, len(out)
    if stage == "dedupe":
        out, found = await deduped(deps, cands)
        return out, found, len(out)
    return [], None, await stored(deps, cands, merges)


def fused(chain: Sequence[str]) -> BatchWork[Any]:
    """The batch work of ``chain``'s first stage with the later ones of ``chain`` done in
    memory, in this process: what each would publish to the next is handed on directly, and
    what the last one makes goes to the stage after it (nothing after store). The runner acks
    the first stage's messages once that is durable; a failure goes the way of any batch
    failure, to singles, whose single path publishes to the next stage's subject."""
    steps = tuple(chain)

    async def work(deps: Deps, values: list[Any]) -> int:
        if steps[0] == "extract":
            cands, merges = await extracted(deps, values), None
            outputs = len(cands)
        else:  # the runner counts the first stage's batch
            cands, merges, outputs = await _step(deps, steps[0], values, None)
        for stage in steps[1:]:
            cands, merges, made = await _phase(
                deps, stage, len(cands), _step(deps, stage, cands, merges)
            )
            deps.metrics[stage].outputs += made
        if steps[-1] != "store":
            if merges is not None:
                await settle(deps, merges)
            await publish_to_stage(deps, STAGES[STAGES.index(steps[-1]) + 1], cands)
        return outputs

    return work


def batch_stage(chain: Sequence[str]) -> BatchStage[Any]:
    """The batch stage of ``chain[0]``, fused through the rest of ``chain``."""
    plain = BATCH_STAGES[chain[0]]
    if len(chain) == 1:
        return plain
    return BatchStage(plain.decode, fused(chain), plain.single)

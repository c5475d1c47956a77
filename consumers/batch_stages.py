"""The four stages over a pull batch (the contract: consumers/batching.py): decode and check
each message, then one call per step over the whole batch.

Each stage's work is a function from its batch to what it hands on (``extracted``,
``redacted`` here; ``deduped`` in consumers/batch_dedupe.py, ``stored`` in
consumers/batch_store.py, with what they write);
a stage publishes that to the next stage's subject. A process hands a batch on in memory
through the consecutive stages it runs (consumers/chains.py; docs/ingest.md, "Fused
stages")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstream.consumers.batch_store import dedupe_batch, publish_to_stage, store_batch
from memstream.consumers.batching import BatchStage, Decode
from memstream.consumers.offload import EMBED_SLICE, Slices, offload
from memstream.consumers.stagemetrics import StageMetrics
from memstream.consumers.stages import (
    STAGE_WORK,
    Deps,
    _redact_candidate,
    decode,
    redacted_here,
    with_vectors,
)
from memstream.pipeline import llm_extract
from memstream.pipeline.extract import extract
from memstream.schemas.errors import InvalidMessage
from memstream.schemas.events import TurnEvent
from memstream.schemas.ids import owner_key
from memstream.schemas.memory import Candidate


def decode_turn(deps: Deps, body: bytes, subject: str) -> TurnEvent:
    event = decode(TurnEvent, body)
    if why := deps.subjects.turn_mismatch(subject, event.tenant, event.owner, event.session):
        raise InvalidMessage(why)
    return event


def candidate_on(stage: str) -> Decode[Candidate]:
    def decode_candidate(deps: Deps, body: bytes, subject: str) -> Candidate:
        c = decode(Candidate, body)
        if why := deps.subjects.stage_mismatch(subject, stage, c.owner.tenant, c.owner.key):
            raise InvalidMessage(why)
        return c if stage == "redact" else redacted_here(deps, c, stage)

    return decode_candidate


async def memory_on(deps: Deps, events: Sequence[TurnEvent]) -> list[bool]:
    """Per turn, whether its session keeps memories (a turn of a session whose memory is off
    is consumed, nothing is stored)."""
    keys = [(e.tenant, owner_key(e.user, e.agent), e.session) for e in events]
    off = await deps.pg.memory_off_among(list(set(keys)))
    return [k not in off for k in keys]


def count_redactions(deps: Deps, cands: Sequence[Candidate]) -> None:
    metrics = deps.metrics.setdefault("redact", StageMetrics()).redactions
    for c in cands:
        for label, n in c.redactions.items():
            metrics[label] = metrics.get(label, 0) + n


async def extracted(deps: Deps, events: Sequence[TurnEvent]) -> list[Candidate]:
    """The turns' candidates (none for a session whose memory is off)."""
    on = await memory_on(deps, events)
    out: list[Candidate] = []
    slices = Slices()
    for event, keep in zip(events, on, strict=True):
        await slices.tick()
        if not keep:
            continue
        size = sum(len(m.content) for m in event.messages)
        candidates = await offload(size, extract, event)
        if deps.llm is not None and candidates:
            candidates = llm_extract.complement(candidates, await deps.llm.candidates(event))
        out.extend(candidates)
    return out


async def extract_batch(deps: Deps, events: list[TurnEvent]) -> int:
    out = await extracted(deps, events)
    await publish_to_stage(deps, "redact", out)
    return len(out)


async def redacted(deps: Deps, cands: Sequence[Candidate]) -> list[Candidate]:
    """The candidates redacted (counted by label), each with the dense vector of its text."""
    out = []
    slices = Slices()
    for c in cands:
        await slices.tick()
        size = len(c.content) + sum(len(str(v)) for v in c.metadata.values())
        out.append(await offload(size, _redact_candidate, deps, c))
    count_redactions(deps, out)
    vectored: list[Candidate] = []
    for lo in range(0, len(out), EMBED_SLICE):
        await slices.tick()
        vectored.extend(with_vectors(deps, out[lo : lo + EMBED_SLICE]))
    return vectored


async def redact_batch(deps: Deps, cands: list[Candidate]) -> int:
    out = await redacted(deps, cands)
    await publish_to_stage(deps, "dedupe", out)
    return len(out)


BATCH_STAGES: dict[str, BatchStage[Any]] = {
    "extract": BatchStage(decode_turn, extract_batch, STAGE_WORK["extract"]),
    "redact": BatchStage(candidate_on("redact"), redact_batch, STAGE_WORK["redact"]),
    "dedupe": BatchStage(candidate_on("dedupe"), dedupe_batch, STAGE_WORK["dedupe"]),
    "store": BatchStage(candidate_on("store"), store_batch, STAGE_WORK["store"]),
}

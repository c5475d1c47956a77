"""What the vector index holds for a memory: a dense vector and BM25 weights of its dated
text (episodes also carry the two earlier turns of their session as light context), and the
record recall answers from, so the hot path needs no Postgres read."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from memstream.consumers.offload import EMBED_SLICE, Slices
from memstream.pipeline.lexical import document_vector
from memstream.schemas.memory import MemoryRecord, MemoryType, dated
from memstream.storage.pgports import IndexRows
from memstream.storage.ports import Embedder, VectorIndex, VectorPoint

# points per index upsert: Qdrant Edge holds the interpreter lock for a whole write (~40 us a
# point), so a recall in the same process waits for one slice (~2.5 ms), not a whole batch
UPSERT_SLICE = 64


def record_of(m: MemoryRecord) -> dict[str, Any]:
    """The fields a recall hit shows (JSON-able)."""
    return {
        "id": m.id,
        "text": m.content,
        "type": m.type.value,
        "scope": m.scope.value,
        "project": m.project,
        "session": m.session,
        "user": m.user,
        "agent": m.agent,
        "source_event_ids": list(m.source_event_ids),
        "metadata": dict(m.metadata),
        "occurred_at": m.occurred_at.isoformat(),
        "created_at": m.created_at.isoformat(),
        "pinned": m.pinned,
        "tags": list(m.tags),
    }


def point(m: MemoryRecord, vector: Sequence[float], context: Sequence[str]) -> VectorPoint:
    return VectorPoint(
        id=m.id,
        vector=list(vector),
        tenant=m.tenant,
        user=m.user,
        agent=m.agent,
        session=m.session,
        type=m.type,
        scope=m.scope,
        project=m.project,
        occurred_at=m.occurred_at.timestamp(),
        expires_at=m.expires_at.timestamp() if m.expires_at and not m.pinned else None,
        sparse=document_vector(dated(m.content, m.occurred_at), context),
        record=record_of(m),
        pinned=m.pinned,
        tags=tuple(m.tags),
        version=m.updated_at.timestamp(),
    )


async def index(
    pg: IndexRows,
    vectors: VectorIndex,
    embedder: Embedder,
    memories: Sequence[MemoryRecord],
    followers: bool | AbstractSet[str] = False,
    known: Mapping[str, Sequence[float]] | None = None,
) -> None:
    """Embed and upsert memories (idempotent), then mark them indexed in Postgres
    (``upserted``, then ``IndexRows.mark_indexed``), each only if its row is still the one
    its point was built from (the followers' rows unchecked)."""
    ids = await upserted(pg, vectors, embedder, memories, followers, known)
    read = {m.id: m.updated_at for m in memories}
    await pg.mark_indexed(ids, [read.get(i) for i in ids])


async def upserted(
    pg: IndexRows,
    vectors: VectorIndex,
    embedder: Embedder,
    memories: Sequence[MemoryRecord],
    followers: bool | AbstractSet[str] = False,
    known: Mapping[str, Sequence[float]] | None = None,
    stepped: Callable[[str, float], None] | None = None,
    kept: dict[str, VectorPoint | None] | None = None,
) -> list[str]:
    """Embed and upsert memories (idempotent); the ids upserted, for the caller to mark
    indexed in Postgres once it may (the store stage does it while its events go out).

    ``followers``: also re-index the episodes that come right after each one (or each one
    whose id is in the set) in its session, whose keyword context includes it (turns can
    reach the store stage out of order). ``known``: vectors already computed for the dated
    content of some memories (by id): only the others are embedded. ``stepped``: told the
    time spent reading contexts, embedding and building points, and upserting
    (``Deps.stepped``). ``kept``: ids whose points the caller writes again later; each is
    given the point written."""
    if not memories:
        return []
    step = stepped or _untimed
    started = time.perf_counter()
    episodes = [m for m in memories if m.type is MemoryType.EPISODE]
    extra: list[MemoryRecord] = []
    if followers:
        seen = {m.id for m in memories}
        arrived = [m for m in episodes if followers is True or m.id in followers]
        # both reads at once: the followers' own contexts are read after, when there are any
        after, found = await asyncio.gather(
            pg.session_followers_many(arrived), pg.session_contexts(episodes)
        )
        extra = [f for f in after if f.id not in seen and f.indexed]
        memories = [*memories, *extra]
        if extra:
            found |= await pg.session_contexts([m for m in extra if m.type is MemoryType.EPISODE])
    else:
        found = await pg.session_contexts(episodes)
    step("contexts", started)
    started = time.perf_counter()
    contexts = [found.get(str(uuid.UUID(m.id)), []) for m in memories]
    known = known or {}
    todo = [m for m in memories if m.id not in known]
    fresh: dict[str, Sequence[float]] = {}
    slices = Slices()
    for lo in range(0, len(todo), EMBED_SLICE):
        await slices.tick()
        part = todo[lo : lo + EMBED_SLICE]
        fresh.update(
            zip(
                (m.id for m in part),
                embedder.embed([dated(m.content, m.occurred_at) for m in part]),
                strict=True,
            )
        )
    vecs = [known[m.id] if m.id in known else fresh[m.id] for m in memories]
    points = []
    for m, v, c in zip(memories, vecs, contexts, strict=True):
        await slices.tick()
        points.append(point(m, v, c))
    step("points", started)
    started = time.perf_counter()
    await write_points(vectors, points)
    step("upsert", started)
    if kept:
        kept.update((p.id, p) for p in points if p.id in kept)
    return [m.id for m in memories]


async def write_points(vectors: VectorIndex, points: Sequence[VectorPoint]) -> None:
    """Upsert points in slices of ``UPSERT_SLICE`` (why: there)."""
    for lo in range(0, len(points), UPSERT_SLICE):
        await vectors.upsert(points[lo : lo + UPSERT_SLICE])


def _untimed(step: str, started: float) -> None:
    return None

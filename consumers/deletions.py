"""Deleting vector points so that deletion converges.

Every change that retires a memory (forget, erasure, fact supersede, expiry) queues its point
in Postgres' ``vector_deletes`` in the same transaction. The caller then deletes the point at
once (``delete_points``); when the index does not answer, or the process dies first, the row
stays and the reconciler deletes the point later (``drain``). Recall answers from the index,
so a point left behind would keep a forgotten text recallable: the queue is what repairs it.
"""

from __future__ import annotations

from collections.abc import Sequence

from memstream.consumers.logs import log
from memstream.schemas.errors import TransientError
from memstream.storage.pgports import VectorDeletes
from memstream.storage.ports import VectorIndex


async def delete_points(
    pg: VectorDeletes, vectors: VectorIndex, tenant: str, ids: Sequence[str]
) -> bool:
    """Delete the queued points of ``ids`` now; False when a store did not answer (the queue
    keeps them for ``drain``)."""
    if not ids:
        return True
    try:
        await vectors.delete(tenant, ids)
        await pg.vector_deletes_done(tenant, ids)
    except TransientError as exc:
        log.warning(
            "vectors.delete_deferred", tenant=tenant, count=len(ids), reason=type(exc).__name__
        )
        return False
    return True


async def drain(pg: VectorDeletes, vectors: VectorIndex, limit: int = 1000) -> int:
    """Delete every queued point (up to ``limit``); returns how many. Idempotent: deleting a
    missing point is a no-op. Raises when a store does not answer (the next round retries)."""
    done = 0
    for tenant, ids in (await pg.pending_vector_deletes(limit)).items():
        await vectors.delete(tenant, ids)
        await pg.vector_deletes_done(tenant, ids)
        done += len(ids)
    return done

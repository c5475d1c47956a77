"""Fact versions may revert, and retired memories never stay recallable: a point whose delete
failed, or whose process died before the delete, is removed by the reconciler."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memstream.consumers.embedded import free_port
from memstream.consumers.stack import make_vector_index
from memstream.schemas.settings import Settings
from memstream.storage.postgres import PgStore
from memstream.storage.qdrant_server import ServerVectorIndex

pytestmark = pytest.mark.integration


async def test_fact_revert_and_retry(running, clock) -> None:
    """fact_put A, B, then A again opens a third version (it answered internal: the exact-
    dedupe index held the first A); a retried put of the current value changes nothing."""
    async with running.client("acme", user="rev") as mem:
        a1 = (await mem.fact_put("city", "Porto")).memory
        clock.advance(days=1)
        b = (await mem.fact_put("city", "Lisbon")).memory
        clock.advance(days=1)
        a2 = await mem.fact_put("city", "Porto")
        assert a2.detail["superseded"] == b.id and a2.memory.id not in (a1.id, b.id)
        clock.advance(days=1)
        again = await mem.fact_put("city", "Porto")
        assert again.memory.id == a2.memory.id and again.detail["superseded"] is None
        chain = await mem.fact_history("city")
        assert [m.content for m in chain] == ["city: Porto", "city: Lisbon", "city: Porto"]
        assert [m.valid_to is None for m in chain] == [False, False, True]
        hits = [h.text for h in (await mem.recall("which city?", top_k=5, cache=False)).hits]
        assert hits.count("city: Porto") == 1 and "city: Lisbon" not in hits


def unreachable_index(dim: int) -> ServerVectorIndex:
    return ServerVectorIndex(
        url=f"http://127.0.0.1:{free_port()}", timeout=1, check_compatibility=False, dim=dim
    )


async def test_failed_delete_is_repaired_by_the_reconciler(running, embedder) -> None:
    """forget, forget_owner and a fact supersede while the index cannot delete: each commits
    and answers; the stale points are still in the index; the maintenance loop, woken by the
    deferred deletes (its interval is 30 s), removes them within seconds of the index's
    return, and recall never returns the texts again."""
    live = running.worker.deps.vectors
    async with running.client("acme", user="del") as mem, running.client("acme", user="era") as era:
        gone = await mem.remember("the vault code is in the red binder")
        await mem.fact_put("pet", "a parrot called Rio")
        erased = await era.remember("my old locker is number 41")
        running.worker.services.vectors = unreachable_index(embedder.dim)
        try:
            await mem.forget(gone.id)
            superseded = (await mem.fact_put("pet", "a cat called Mia")).detail["superseded"]
            counts = await era.forget_owner()
            assert counts["memories"] == 1
            stale = [gone.id, superseded, erased.id]
            assert set(await live.fetch("acme", stale)) == set(stale)  # the deletes did not happen
        finally:
            running.worker.services.vectors = live
        for _ in range(100):  # a failed round is tried again every 1-5 s
            if not await live.fetch("acme", stale):
                break
            await asyncio.sleep(0.2)
        assert await live.fetch("acme", stale) == {}
        assert await running.pg.pending_vector_deletes() == {}
        for q, client in (("vault code", mem), ("pet parrot", mem), ("old locker", era)):
            texts = [h.text for h in (await client.recall(q, cache=False)).hits]
            assert not any("red binder" in t or "parrot" in t or "locker" in t for t in texts)


_CRASH = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from datetime import UTC, datetime
    from memstream.consumers import indexing
    from memstream.consumers.stack import make_vector_index
    from memstream.pipeline import dedupe
    from memstream.schemas.memory import Candidate, Owner
    from memstream.schemas.settings import Settings
    from memstream.storage.embedding import make_embedder
    from memstream.storage.postgres import OwnerFilter, PgStore

    async def main() -> None:
        dsn, schema, state = sys.argv[1:4]
        pg = await PgStore.connect(dsn, schema=schema)
        embedder = make_embedder(None, None)
        vectors = make_vector_index(Settings(state_dir=state))
        await vectors.ensure(embedder.dim)
        c = Candidate(candidate_id="c1", owner=Owner(tenant="acme", user="kim"), session="s",
                      content="the spare key is under the third flower pot",
                      source_event_id="e1", occurred_at=datetime.now(UTC), redacted=True)
        k = dedupe.key(c)
        await pg.upsert(k.memory_id, k.content_hash, c)
        rows = await pg.get_many(OwnerFilter(tenant="acme"), [k.memory_id])
        await indexing.index(pg, vectors, embedder, list(rows.values()))
        # forget, as the command does: the tombstone (and the queued delete) commits ...
        await pg.tombstone(OwnerFilter(tenant="acme", user="kim"), k.memory_id)
        print(k.memory_id, flush=True)
        # ... and the process dies before the point is deleted
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


async def test_crash_between_commit_and_delete_converges(
    database_url, namespace, tmp_path: Path, embedder
) -> None:
    """A process killed (SIGKILL) after the tombstone committed and before the point was
    deleted leaves the point in the index; the next reconcile round deletes it."""
    state = tmp_path / "state"
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _CRASH, database_url, namespace, str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    memory_id = proc.stdout.strip()
    pg = await PgStore.connect(database_url, schema=namespace)
    vectors = make_vector_index(Settings(state_dir=state))
    try:
        await vectors.ensure(embedder.dim)
        assert set(await vectors.fetch("acme", [memory_id])) == {memory_id}  # left behind
        assert await pg.pending_vector_deletes() == {"acme": [memory_id]}  # committed
        from memstream.consumers.deletions import drain

        assert await drain(pg, vectors) == 1
        assert await vectors.fetch("acme", [memory_id]) == {}
    finally:
        await vectors.close()
        await pg.close()

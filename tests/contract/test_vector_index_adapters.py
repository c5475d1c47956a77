"""The VectorIndex adapters' specifics, beside the contract: Qdrant Edge's shard on disk
(reopen, WAL replay, segments and optimize, refused layouts, expiry bookkeeping, query terms
left out) and the server adapter's unreachable server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import qdrant_edge as qe
from indexpoints import DIM, LOCAL_MODE, NOW, WORD, axis, bm25_idf, edge_factory, ids, point

from memstream.schemas.errors import ConfigurationError, StorageUnavailable
from memstream.storage.edge_layout import edge_filter
from memstream.storage.ports import VectorFilter
from memstream.storage.qdrant_edge import EdgeVectorIndex
from memstream.storage.qdrant_server import ServerVectorIndex

pytestmark = [LOCAL_MODE]


async def test_edge_data_survives_close_and_reopen(tmp_path: Path) -> None:
    """Qdrant Edge: points and payload indexes are on disk after close; a new instance sees them."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    p = point(axis(0), expires_at=NOW + 5)
    await first.upsert([p])
    await first.close()
    second = EdgeVectorIndex(tmp_path / "shard")
    await second.ensure(DIM)
    flt = VectorFilter(tenant="acme", user="ann", agent="bot", now=NOW)
    assert await second.search(axis(0), flt, 3) == [(p.id, pytest.approx(1.0, abs=1e-5))]
    assert set(second.shard.info().payload_schema) >= {"tenant", "user", "expires_at", "tags"}
    assert [
        i for i, _ in await second.search_sparse({WORD: 1.0}, VectorFilter(tenant="acme"), 3)
    ] == [p.id]
    await second.close()


async def test_edge_term_statistics_are_rebuilt_on_reopen(tmp_path: Path) -> None:
    """Qdrant Edge keeps BM25 statistics itself: a new instance over the shard counts them
    again from the stored points (the same scores as before), per tenant."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    await first.upsert([point(axis(0), sparse={1: 1.0, 2: 0.5}) for _ in range(3)])
    await first.upsert([point(axis(0), sparse={2: 1.0}) for _ in range(5)])
    await first.upsert([point(axis(0), tenant="globex", sparse={1: 1.0}) for _ in range(9)])
    flt = VectorFilter(tenant="acme")
    before = await first.search_sparse({1: 1.0, 2: 1.0}, flt, 10)
    await first.close()
    second = EdgeVectorIndex(tmp_path / "shard")
    await second.ensure(DIM)
    assert await second.search_sparse({1: 1.0, 2: 1.0}, flt, 10) == before
    # term 2 is in all 8 points of the tenant (IDF 0.06 < MIN_IDF): left out next to term 1
    assert before[0][1] == pytest.approx(bm25_idf(3, 8), rel=1e-4)
    alone = await second.search_sparse({2: 1.0}, flt, 10)  # alone it is kept, rebuilt IDF
    assert sorted(round(s / bm25_idf(8, 8), 3) for _, s in alone) == [0.5] * 3 + [1.0] * 5
    await second.close()


async def test_edge_searches_leave_the_loop_while_much_is_unoptimized(tmp_path: Path) -> None:
    """Qdrant Edge: searches run inline on a new shard, in a thread once more than
    inline_unoptimized_max points wait for optimize(), inline again after it; a loaded
    shard's state is unknown until its first optimize()."""
    idx = EdgeVectorIndex(tmp_path / "shard", inline_unoptimized_max=3)
    await idx.ensure(DIM)
    assert idx.searches_inline
    await idx.upsert([point(axis(i)) for i in range(4)])
    assert not idx.searches_inline
    assert len(await idx.search(axis(0), VectorFilter(tenant="acme"), 10)) == 4
    await idx.optimize()
    assert idx.searches_inline
    await idx.close()
    again = EdgeVectorIndex(tmp_path / "shard")
    await again.ensure(DIM)
    assert not again.searches_inline
    await again.optimize()
    assert again.searches_inline
    assert len(await again.search(axis(0), VectorFilter(tenant="acme"), 10)) == 4
    await again.close()


async def test_edge_optimize_builds_bounded_segments(tmp_path: Path) -> None:
    """Qdrant Edge: optimize() builds segments of at most segment_kb and indexes them, never
    merging the shard into one (whose rebuild held the process for seconds, growing with the
    shard), also on a shard created before with the engine's defaults; answers unchanged."""
    rng = random.Random(5)
    flt = VectorFilter(tenant="acme")
    first = EdgeVectorIndex(tmp_path / "shard", segment_kb=None)
    await first.ensure(DIM)
    await first.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(100)])
    await first.close()
    # 4 KB of 8-dim vectors: 128 points a segment at most, indexed from 64
    idx = EdgeVectorIndex(tmp_path / "shard", segment_kb=4)
    await idx.ensure(DIM)
    for _ in range(4):
        await idx.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(100)])
        await idx.optimize()
    layout = idx.layout()
    assert layout["points"] == 500
    assert layout["segments"] >= 4  # 500 points in segments of at most 128
    assert layout["unindexed_points"] == 0
    q = [rng.gauss(0, 1) for _ in range(DIM)]
    hits = await idx.search(q, flt, 500)
    assert len(hits) == 500
    await idx.close()


async def test_edge_segments_setting_reaches_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qdrant Edge: ``MEMSTREAM_INDEX_SEGMENTS`` becomes the engine's merge target, in the
    shard's persisted config, also for a shard created before without it (its load applies
    the setting); unset, the engine keeps its default."""
    from memstream.consumers.stack import make_vector_index
    from memstream.schemas.settings import Settings

    def optimizers() -> Any:
        config = json.loads((tmp_path / "qdrant" / "memories" / "edge_config.json").read_text())
        return (config.get("optimizers") or {}).get("default_segment_number")

    for wanted, expected in ((None, None), ("6", 6), ("3", 3)):
        if wanted is None:
            monkeypatch.delenv("MEMSTREAM_INDEX_SEGMENTS", raising=False)
        else:
            monkeypatch.setenv("MEMSTREAM_INDEX_SEGMENTS", wanted)
        idx = make_vector_index(Settings(state_dir=tmp_path, collection="memories"))
        await idx.ensure(DIM)
        assert optimizers() == expected
        await idx.close()


async def test_edge_writes_start_an_optimize_once_a_segment_waits(tmp_path: Path) -> None:
    """Qdrant Edge: once half a segment's worth of points is written since the last
    optimize, the writes start one themselves (each pause stays about that long, whatever
    the maintenance interval) and report its time; fewer points start none.
    optimize_builds says whether an optimize would build now."""
    told: list[tuple[float, BaseException | None]] = []
    idx = EdgeVectorIndex(
        tmp_path / "shard", segment_kb=4, on_optimized=lambda s, e: told.append((s, e))
    )
    await idx.ensure(DIM)
    rng = random.Random(6)
    await idx.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(60)])
    assert idx.optimizing is None  # 60 of the 64 points that make one due
    assert not idx.optimize_builds()
    await idx.upsert([point([rng.gauss(0, 1) for _ in range(DIM)]) for _ in range(10)])
    running = idx.optimizing
    assert running is not None
    assert idx.optimize_builds()  # what the writes' optimize is about to build
    await running
    assert idx.layout()["unindexed_points"] == 0
    assert not idx.optimize_builds()
    assert len(told) == 1 and told[0][0] >= 0 and told[0][1] is None
    await idx.close()


async def test_edge_shard_with_the_engine_idf_modifier_is_refused(tmp_path: Path) -> None:
    """Qdrant Edge: a shard whose bm25 is scored by the engine (another layout) is refused
    with a ConfigurationError that says how to recover, never answered with other scores."""
    dense = qe.EdgeVectorParams(size=DIM, distance=qe.Distance.Cosine)
    sparse = qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)
    config = qe.EdgeConfig(vectors={"dense": dense}, sparse_vectors={"bm25": sparse})
    qe.EdgeShard.create(str(tmp_path / "shard"), config).close()
    idx = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="rebuild the index from Postgres"):
        await idx.ensure(DIM)


def test_edge_acknowledged_upsert_survives_a_killed_process(tmp_path: Path) -> None:
    """Qdrant Edge: an upsert that returned is replayed from the WAL after the process dies."""
    p = point(axis(0))
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from memstream.storage.edge_layout import edge_filter
        from memstream.storage.qdrant_edge import EdgeVectorIndex
        from memstream.storage.ports import VectorPoint
        from memstream.schemas.memory import MemoryType, Scope

        async def main():
            idx = EdgeVectorIndex({str(tmp_path / "shard")!r}, flush_every_s=3600)
            await idx.ensure({DIM})
            await idx.upsert([VectorPoint(id={p.id!r}, vector={p.vector!r}, tenant="acme",
                user="ann", agent="bot", session="s1", type=MemoryType.FACT,
                scope=Scope.USER, occurred_at=1.0)])
            os._exit(0)  # no flush, no close

        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)

    async def reopen() -> list[tuple[str, float]]:
        idx = EdgeVectorIndex(tmp_path / "shard")
        await idx.ensure(DIM)
        try:
            return await idx.search(axis(0), VectorFilter(tenant="acme"), 3)
        finally:
            await idx.close()

    assert [i for i, _ in asyncio.run(reopen())] == [p.id]


async def test_edge_shard_open_elsewhere_is_a_configuration_error(tmp_path: Path) -> None:
    """Qdrant Edge: a second index over a shard already open refuses to start."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    second = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="another process"):
        await second.ensure(DIM)
    await first.close()


async def test_edge_used_before_ensure_is_a_configuration_error(tmp_path: Path) -> None:
    """Qdrant Edge: calls before ensure() fail loudly instead of creating a shard silently."""
    idx = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="ensure"):
        await idx.search(axis(0), VectorFilter(tenant="acme"), 3)


async def test_server_unreachable_is_storage_unavailable() -> None:
    """Server adapter: no Qdrant listening raises StorageUnavailable (transient), from the cause."""
    idx = ServerVectorIndex(
        url="http://127.0.0.1:9", collection="memories", timeout=2, check_compatibility=False
    )
    with pytest.raises(StorageUnavailable) as info:
        await idx.ensure(DIM)
    assert info.value.__cause__ is not None
    await idx.close()


async def test_edge_leaves_out_query_terms_in_nearly_every_point(tmp_path: Path) -> None:
    """Qdrant Edge only (the server applies IDF itself): a query term in every point of the
    corpus is left out next to a rarer one, so points sharing only that term are not hits;
    alone, it still finds them."""
    index = edge_factory(tmp_path)()
    await index.ensure(DIM)
    rare = point(axis(0), sparse={1: 1.0, 2: 1.0})
    common = [point(axis(0), sparse={1: 1.0, 3: 1.0}) for _ in range(30)]
    await index.upsert([rare, *common])
    flt = VectorFilter(tenant="acme")
    assert [mid for mid, _ in await index.search_sparse({1: 1.0, 2: 1.0}, flt, 50)] == [rare.id]
    assert len(await index.search_sparse({1: 1.0}, flt, 50)) == 31
    await index.close()


async def test_edge_checks_expiry_only_while_a_point_of_the_tenant_has_expired(
    tmp_path: Path,
) -> None:
    """Qdrant Edge keeps each tenant's expiry times (through overwrites, deletes and a reopen)
    and adds the expiry condition only while one of the tenant's points has expired; an
    expired point is hidden whenever it is stored."""
    index = edge_factory(tmp_path)()
    await index.ensure(DIM)
    flt = VectorFilter(tenant="acme", now=NOW)
    durable, later = point(axis(0)), point(axis(0), expires_at=NOW + 60)
    await index.upsert([durable, later, point(axis(0), tenant="globex", expires_at=NOW - 1)])
    assert not index.may_expire("acme", NOW) and index.may_expire("globex", NOW)
    assert edge_filter(flt, index.may_expire("acme", NOW)).must_not is None
    assert index.may_expire("acme", NOW + 60)  # once it has passed
    expired = point(axis(0), expires_at=NOW - 1)
    await index.upsert([expired])
    assert index.may_expire("acme", NOW)
    for leg in ("dense", "sparse"):
        assert await ids(index, flt, leg=leg) == {durable.id, later.id}  # hidden
    revived = dataclasses.replace(expired, expires_at=None)  # pinned: no expiry
    await index.upsert([revived])
    assert not index.may_expire("acme", NOW)
    assert await ids(index, flt) == {durable.id, later.id, expired.id}
    await index.upsert([expired])
    await index.close()
    reopened = edge_factory(tmp_path)()
    await reopened.ensure(DIM)
    assert reopened.may_expire("acme", NOW) and reopened.may_expire("globex", NOW)
    assert await ids(reopened, flt) == {durable.id, later.id}
    await reopened.delete("acme", [expired.id])
    assert not reopened.may_expire("acme", NOW) and reopened.may_expire("acme", NOW + 60)
    await reopened.close()


async def test_edge_layout_counts_points_not_yet_in_a_graph(tmp_path: Path) -> None:
    """Qdrant Edge: points below the indexing threshold are reported as not yet indexed."""
    index = edge_factory(tmp_path)()
    await index.ensure(DIM)
    assert index.layout()["points"] == 0
    await index.upsert([point(axis(i % DIM)) for i in range(5)])
    layout = index.layout()
    assert layout["points"] == 5 and layout["unindexed_points"] == 5 and layout["segments"] >= 1
    await index.close()


async def test_edge_points_without_the_exact_owner_key_are_refused(tmp_path: Path) -> None:
    """A shard holding points without the exact owner key (another layout) is refused on
    open: own reads over it could not be exact."""
    first = EdgeVectorIndex(tmp_path / "shard")
    await first.ensure(DIM)
    p = point(axis(0), user="ann", agent=None)
    await first.upsert([p])
    first.shard.update(qe.UpdateOperation.delete_payload([p.id], ["o_x"]))
    await first.close()
    second = EdgeVectorIndex(tmp_path / "shard")
    with pytest.raises(ConfigurationError, match="without owner keys"):
        await second.ensure(DIM)

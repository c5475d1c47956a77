"""The VectorIndex contract, part 4: congruence. Qdrant Edge and the server adapter (local)
answer the same random points and filters with the same ids, scores and records."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from indexpoints import DIM, LOCAL_MODE, NOW, edge_factory, local_factory, point

from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.ports import VectorFilter

pytestmark = [LOCAL_MODE]


async def test_edge_and_local_server_agree(tmp_path: Path) -> None:
    """Random points and filters: both adapters return the same ids and scores on both legs,
    and the same records."""
    rng = random.Random(7)
    edge, local = edge_factory(tmp_path)(), local_factory(tmp_path)()
    points = [
        point(
            [rng.gauss(0, 1) for _ in range(DIM)],
            tenant=rng.choice(["acme", "globex"]),
            user=rng.choice(["ann", "bob", None]),
            agent=rng.choice(["bot", "helper", None]),
            session=rng.choice(["s1", "s2"]),
            type=rng.choice([MemoryType.FACT, MemoryType.RULE]),
            scope=rng.choice([Scope.USER, Scope.SESSION]),
            expires_at=rng.choice([None, NOW - 10, NOW + 10]),
            occurred_at=NOW - rng.randrange(1000),
            tags=tuple(rng.sample(["red", "blue", "green"], rng.randrange(3))),
            sparse=rng.choice(
                [None, {rng.randrange(40): rng.uniform(0.1, 2) for _ in range(rng.randrange(1, 6))}]
            ),
            record={"n": rng.randrange(1000)},
        )
        for _ in range(300)
    ]
    filters = [
        VectorFilter(tenant="acme", now=NOW),
        VectorFilter(tenant="globex", user="bob"),
        VectorFilter(tenant="acme", session="s2", types=(MemoryType.RULE,), now=NOW),
        VectorFilter(tenant="globex", scopes=(Scope.SESSION,), user="ann"),
        VectorFilter(tenant="acme", tags=("red",), occurred_from=NOW - 500),
        VectorFilter(tenant="acme", user="ann", exclude_agent="bot", occurred_to=NOW - 200),
        VectorFilter(tenant="globex", agent="helper", tags=("blue",)),
    ]
    try:
        for idx in (edge, local):
            await idx.ensure(DIM)
            await idx.upsert(points)
        for flt in filters:
            q = [rng.gauss(0, 1) for _ in range(DIM)]
            a, b = await edge.search(q, flt, 10), await local.search(q, flt, 10)
            assert [i for i, _ in a] == [i for i, _ in b]
            assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-4)
            terms = {rng.randrange(40): 1.0 for _ in range(4)}
            sa = await edge.search_sparse(terms, flt, 300, with_records=True)
            sb = await local.search_sparse(terms, flt, 300, with_records=True)
            assert {i: (pytest.approx(s, rel=1e-4), r) for i, s, r in sa} == {
                i: (s, r) for i, s, r in sb
            }
        some = [p.id for p in points[:50]]
        assert await edge.fetch("acme", some) == await local.fetch("acme", some)
    finally:
        await edge.close()
        await local.close()

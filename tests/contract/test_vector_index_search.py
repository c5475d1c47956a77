"""The VectorIndex contract, part 1: dense search and batches of searches, and the filters
on both legs (dense and sparse): tenants, fields, expiry, tags, time ranges, and owners (own,
peer and shared reads). Every test runs against Qdrant Edge and the server adapter (local)."""

from __future__ import annotations

from typing import Any

import pytest
from indexpoints import LOCAL_MODE, NOW, Leg, axis, ids, point

from memstream.schemas.memory import MemoryType, Scope
from memstream.storage.ports import VectorFilter, VectorIndex

# mypy sees indexpoints as Any, as it sees storerows (tests/contract is not on its path), so
# the helpers in these tests that return what ids() returns would trip no-any-return
# mypy: disable-error-code="no-any-return"

pytestmark = [LOCAL_MODE]


async def test_search_returns_nearest_first(index: VectorIndex) -> None:
    """Search ranks points by cosine similarity, best first, with the similarity as score."""
    far, near, exact = point(axis(2)), point(axis(0, 0.5)), point(axis(0))
    await index.upsert([far, near, exact])
    hits = await index.search(axis(0), VectorFilter(tenant="acme"), 2)
    assert [i for i, _ in hits] == [exact.id, near.id]
    assert hits[0][1] == pytest.approx(1.0, abs=1e-5)
    assert hits[1][1] == pytest.approx(1 / (1 + 0.25) ** 0.5, abs=1e-4)


async def test_search_many_answers_each_query_as_search_does(index: VectorIndex) -> None:
    """A batch of searches returns, per query and in order, what ``search`` with records
    returns for it alone (tenant and owner filters included)."""
    a, b, theirs = point(axis(0)), point(axis(3)), point(axis(0), tenant="globex")
    await index.upsert([a, b, theirs])
    queries = [
        (axis(0), VectorFilter(tenant="acme")),
        (axis(3), VectorFilter(tenant="acme", user="ann", agent="bot")),
        (axis(0), VectorFilter(tenant="acme", user="other")),
        (axis(0), VectorFilter(tenant="globex")),
    ]
    many = await index.search_many(queries, 2)
    assert len(many) == len(queries)
    for (vector, flt), got in zip(queries, many, strict=True):
        alone = await index.search(vector, flt, 2, with_records=True)
        assert [(i, round(s, 4)) for i, s, _ in got] == [(i, round(s, 4)) for i, s, _ in alone]
    assert many[0][0][0] == a.id and many[1][0][0] == b.id
    assert many[2] == [] and [i for i, _, _ in many[3]] == [theirs.id]
    assert await index.search_many([], 2) == []


async def test_search_many_min_score_keeps_only_hits_that_close(index: VectorIndex) -> None:
    """``min_score``: each query's hits are those of the search without it that score at
    least that much, in the same order; a query with none gets an empty list."""
    exact, near, far = point(axis(0)), point(axis(0, 0.5)), point(axis(0, 3.0))
    await index.upsert([exact, near, far])
    queries = [(axis(0), VectorFilter(tenant="acme")), (axis(5), VectorFilter(tenant="acme"))]
    every = await index.search_many(queries, 3)
    assert [i for i, _, _ in every[0]] == [exact.id, near.id, far.id]  # far: cosine ~0.32
    close = await index.search_many(queries, 3, min_score=0.85)
    assert [(i, round(s, 4)) for i, s, _ in close[0]] == [
        (i, round(s, 4)) for i, s, _ in every[0] if s >= 0.85
    ]
    assert [i for i, _, _ in close[0]] == [exact.id, near.id] and close[1] == []
    assert close[0][0][2] == every[0][0][2]  # the records come with the hits kept


async def test_search_many_queries_that_share_a_filter(index: VectorIndex) -> None:
    """Queries of one batch that share a filter (dedupe's queries share a few owners), and a
    filter that holds lists (not hashable), are each answered as ``search`` answers them."""
    a, b = point(axis(0)), point(axis(3), type=MemoryType.PREFERENCE)
    await index.upsert([a, b])
    shared = VectorFilter(tenant="acme", user="ann", agent="bot", types=(MemoryType.FACT,))
    listed = VectorFilter(tenant="acme", user="ann", agent="bot", types=[MemoryType.PREFERENCE])
    queries = [(axis(0), shared), (axis(3), shared), (axis(3), listed), (axis(0), shared)]
    many = await index.search_many(queries, 2)
    for (vector, flt), got in zip(queries, many, strict=True):
        alone = await index.search(vector, flt, 2, with_records=True)
        assert [i for i, _, _ in got] == [i for i, _, _ in alone]
    assert [[i for i, _, _ in hits] for hits in many] == [[a.id], [a.id], [b.id], [a.id]]


async def test_search_many_keeps_order_past_one_engine_batch(index: VectorIndex) -> None:
    """More queries than one engine batch takes (the Edge adapter splits them): each answer
    still belongs to its own query."""
    points = [point(axis(i % 8), user=f"u{i}", agent=None) for i in range(80)]
    await index.upsert(points)
    queries = [(axis(i % 8), VectorFilter(tenant="acme", user=f"u{i}")) for i in range(80)]
    many = await index.search_many(queries, 1)
    assert [[i for i, _, _ in hits] for hits in many] == [[p.id] for p in points]


LEGS: list[Leg] = ["dense", "sparse"]
legs = pytest.mark.parametrize("leg", LEGS)


@legs
async def test_other_tenant_never_returned(index: VectorIndex, leg: Leg) -> None:
    """A point of tenant B never comes back for tenant A, even with identical vectors."""
    mine, theirs = point(axis(0)), point(axis(0), tenant="globex")
    await index.upsert([theirs, mine])
    assert await ids(index, VectorFilter(tenant="acme"), leg=leg) == {mine.id}
    assert await ids(index, VectorFilter(tenant="globex"), leg=leg) == {theirs.id}
    assert await ids(index, VectorFilter(tenant="initech"), leg=leg) == set()


FILTER_CASES = [
    ("user", {"user": "bob"}, {"user": "bob", "agent": "bot"}),
    ("agent", {"agent": "helper"}, {"user": "ann", "agent": "helper"}),
    ("session", {"session": "s2"}, {"session": "s2"}),
    ("types", {"type": MemoryType.RULE}, {"types": (MemoryType.RULE, MemoryType.TODO)}),
    ("scopes", {"scope": Scope.GLOBAL}, {"scopes": (Scope.GLOBAL, Scope.RUN)}),
    ("tags", {"tags": ("red", "blue")}, {"tags": ("blue",)}),
    ("occurred_from", {"occurred_at": NOW}, {"occurred_from": NOW - 1}),
    ("occurred_to", {"occurred_at": NOW - 3600}, {"occurred_to": NOW - 61}),
    ("exclude_agent", {"user": None, "agent": "helper"}, {"peer": True, "exclude_agent": "bot"}),
]


@legs
@pytest.mark.parametrize(("field", "odd", "narrow"), FILTER_CASES, ids=[c[0] for c in FILTER_CASES])
async def test_filter_field_narrows(
    index: VectorIndex, leg: Leg, field: str, odd: dict[str, Any], narrow: dict[str, Any]
) -> None:
    """Each filter field keeps only the matching points, on both legs; unset it keeps all."""
    plain, special = point(axis(0)), point(axis(0, 0.1), **odd)
    await index.upsert([plain, special])
    assert await ids(index, VectorFilter(tenant="acme", **narrow), leg=leg) == {special.id}
    assert await ids(index, VectorFilter(tenant="acme"), leg=leg) == {plain.id, special.id}


@legs
async def test_filters_combine_with_and(index: VectorIndex, leg: Leg) -> None:
    """Several filter fields must all match (AND), not any of them."""
    both = point(axis(0), user="bob", session="s2", tags=("x",))
    only_user = point(axis(0), user="bob", tags=("x",))
    await index.upsert([both, only_user])
    flt = VectorFilter(tenant="acme", user="bob", agent="bot", session="s2", tags=("x",))
    assert await ids(index, flt, leg=leg) == {both.id}


@legs
async def test_user_none_in_point_is_not_matched_by_user_filter(
    index: VectorIndex, leg: Leg
) -> None:
    """A point with no user (an agent memory) does not match a filter on a user."""
    agent_only = point(axis(0), user=None)
    await index.upsert([agent_only])
    assert await ids(index, VectorFilter(tenant="acme", user="ann"), leg=leg) == set()
    assert await ids(index, VectorFilter(tenant="acme", agent="bot"), leg=leg) == {agent_only.id}


@legs
async def test_expired_points_hidden(index: VectorIndex, leg: Leg) -> None:
    """Points whose expires_at <= now are hidden; points without expires_at are kept."""
    forever = point(axis(0))
    later = point(axis(0), expires_at=NOW + 1)
    at_now = point(axis(0), expires_at=NOW)
    past = point(axis(0), expires_at=NOW - 1)
    await index.upsert([forever, later, at_now, past])
    assert await ids(index, VectorFilter(tenant="acme", now=NOW), leg=leg) == {forever.id, later.id}
    everything = {forever.id, later.id, at_now.id, past.id}
    assert await ids(index, VectorFilter(tenant="acme"), leg=leg) == everything


@legs
async def test_tags_filter_needs_all_of_the_tags(index: VectorIndex, leg: Leg) -> None:
    """A tags filter keeps points holding every given tag; extra tags on the point are fine."""
    red_blue, red, untagged = (
        point(axis(0), tags=("red", "blue", "green")),
        point(axis(0), tags=("red",)),
        point(axis(0)),
    )
    await index.upsert([red_blue, red, untagged])

    async def tagged(*tags: str) -> set[str]:
        return await ids(index, VectorFilter(tenant="acme", tags=tags), leg=leg)

    assert await tagged("red", "blue") == {red_blue.id}
    assert await tagged("red") == {red_blue.id, red.id}
    assert await tagged("red", "yellow") == set()
    assert await tagged() == {red_blue.id, red.id, untagged.id}


@legs
async def test_occurred_range_is_inclusive_on_both_ends(index: VectorIndex, leg: Leg) -> None:
    """occurred_from/occurred_to keep occurred_at in [from, to], both bounds included."""
    old, mid, new = (point(axis(0), occurred_at=NOW + t) for t in (-100.0, -50.0, 0.0))
    await index.upsert([old, mid, new])

    async def between(lo: float | None, hi: float | None) -> set[str]:
        flt = VectorFilter(tenant="acme", occurred_from=lo, occurred_to=hi)
        return await ids(index, flt, leg=leg)

    assert await between(NOW - 50, None) == {mid.id, new.id}
    assert await between(None, NOW - 50) == {old.id, mid.id}
    assert await between(NOW - 50, NOW - 50) == {mid.id}
    assert await between(NOW - 49, NOW - 1) == set()


@legs
async def test_peer_filter_keeps_other_agents_own_points(index: VectorIndex, leg: Leg) -> None:
    """A peer read keeps agent-owned points (no user): of the named agent, or of every agent
    but the excluded one; never a user's point with that agent, never an agentless one."""
    mine = point(axis(0), user=None)  # agent bot's own
    peer = point(axis(0), user=None, agent="helper")
    users = point(axis(0), agent="helper")  # ann's memory with agent helper
    nobody = point(axis(0), user=None, agent=None)
    await index.upsert([mine, peer, users, nobody])
    flt = VectorFilter(tenant="acme", peer=True, exclude_agent="bot")
    assert await ids(index, flt, leg=leg) == {peer.id}
    assert await ids(index, VectorFilter(tenant="acme", peer=True, agent="helper"), leg=leg) == {
        peer.id
    }
    assert await ids(index, VectorFilter(tenant="acme", peer=True), leg=leg) == {mine.id, peer.id}


OWNERS = [("ann", "bot"), ("ann", None), (None, "bot"), ("bob", "bot"), ("ann", "helper")]


@legs
async def test_own_reads_match_the_owner_exactly(index: VectorIndex, leg: Leg) -> None:
    """A filter naming an owner keeps that owner's points only: both user and agent equal,
    an unset one matching only points without it (no widening to (ann, *) or (*, bot))."""
    pts = {o: point(axis(0), user=o[0], agent=o[1]) for o in OWNERS}
    await index.upsert(list(pts.values()))
    for (user, agent), p in pts.items():
        flt = VectorFilter(tenant="acme", user=user, agent=agent)
        assert await ids(index, flt, leg=leg) == {p.id}, (user, agent)


@legs
async def test_shared_reads_add_global_and_own_project(index: VectorIndex, leg: Leg) -> None:
    """``shared`` adds the tenant's global points and the project points of the caller's
    project, whoever owns them; not another project's, not another tenant's, not another
    owner's user-scope points."""
    own = point(axis(0), user="ann", agent=None)
    glob = point(axis(0), user="bob", scope=Scope.GLOBAL)
    proj = point(axis(0), user="bob", scope=Scope.PROJECT, project="apollo")
    other_proj = point(axis(0), user="bob", scope=Scope.PROJECT, project="gemini")
    no_proj = point(axis(0), user="bob", scope=Scope.PROJECT, project=None)
    private = point(axis(0), user="bob")
    foreign = point(axis(0), tenant="globex", user="bob", scope=Scope.GLOBAL)
    await index.upsert([own, glob, proj, other_proj, no_proj, private, foreign])
    flt = VectorFilter(tenant="acme", user="ann", project="apollo", shared=True)
    assert await ids(index, flt, leg=leg) == {own.id, glob.id, proj.id}
    flt = VectorFilter(tenant="acme", user="ann", shared=True)
    assert await ids(index, flt, leg=leg) == {own.id, glob.id}
    flt = VectorFilter(tenant="acme", user="ann", project="apollo")  # not shared: own only
    assert await ids(index, flt, leg=leg) == {own.id}
    narrowed = VectorFilter(
        tenant="acme", user="ann", project="apollo", shared=True, scopes=(Scope.PROJECT,)
    )
    assert await ids(index, narrowed, leg=leg) == {proj.id}


async def test_records_are_checked_with_the_same_rules(index: VectorIndex) -> None:
    """Searches with records keep exactly the points the filter's rules allow."""
    own = point(axis(0), user="ann", agent=None, record={"k": "own"})
    widened = point(axis(0), user="ann", agent="bot", record={"k": "widened"})
    glob = point(axis(0), user="bob", scope=Scope.GLOBAL, record={"k": "global"})
    await index.upsert([own, widened, glob])
    flt = VectorFilter(tenant="acme", user="ann", shared=True)
    hits = await index.search(axis(0), flt, 10, with_records=True)
    assert {r["k"] for _, _, r in hits} == {"own", "global"}

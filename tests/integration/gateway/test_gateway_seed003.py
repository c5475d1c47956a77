"""Seed 003: the search options of POST /memories/search over real HTTP."""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.integration

NOUNS = (
    "river mountain pencil garden window ladder violin harbor lantern carpet bicycle "
    "thunder orchard castle blanket compass meadow kettle glacier saddle tunnel mirror "
    "canyon feather pillow rocket marble forest anchor basket candle desert engine falcon "
    "helmet island jacket kitten lemon magnet needle ocean parrot quilt ribbon shovel "
    "tomato umbrella valley wagon yacht zipper bridge cactus dolphin"
).split()


async def _seeded(gateway, tenant):
    key = await gateway.key(tenant, user="alice")
    await gateway.add(key, "alice", "c1", "I prefer dark roast coffee from the corner shop")
    await gateway.add(key, "alice", "c2", "The quarterly report goes to finance on Fridays")
    assert (await gateway.flush(key, "alice", "c1")).json()["status"] == "flushed"
    assert (await gateway.flush(key, "alice", "c2")).json()["status"] == "flushed"
    return key


async def test_defaults(gateway, tenant) -> None:
    """Defaults: method hybrid, include_profile true, enable_llm_rerank true (reported as no
    reranker configured), agentic unset."""
    key = await _seeded(gateway, tenant)
    r = await gateway.search(key, "alice", "coffee")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "hybrid" and body["rerank"] == "not_configured"
    assert body["agentic"] is None
    assert "profile" in {x["memory_type"] for x in body["results"]}


async def test_custom_options(gateway, tenant) -> None:
    """agent_id searches that agent's memories; keyword method; top_k -1 returns every hit
    above the radius; both flags false: no profile results, no rerank report; agentic runs
    as hybrid and says so."""
    key = await _seeded(gateway, tenant)
    commit = {
        "agent_name": "helper",
        "content": "Coffee orders go through the corner shop app",
        "memory_type": "skill_heuristic",
    }
    r = await gateway.http.post(
        "/api/agent-memory/commit", json=commit, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 200
    r = await gateway.search(
        key,
        "alice",
        "corner shop coffee",
        agent_id="helper",
        method="keyword",
        radius=0.1,
        top_k=-1,
        include_profile=False,
        enable_llm_rerank=False,
    )
    body = r.json()
    assert r.status_code == 200 and body["method"] == "keyword" and body["rerank"] is None
    assert body["results"] and all(x["agent_id"] == "helper" for x in body["results"])
    assert all(x["score"] >= 0.1 for x in body["results"])
    r = await gateway.search(key, "alice", "coffee", include_profile=False, top_k=-1)
    assert r.json()["results"] and "profile" not in {x["memory_type"] for x in r.json()["results"]}
    r = await gateway.search(key, "alice", "coffee", method="agentic")
    assert r.json()["method"] == "hybrid" and r.json()["agentic"] == "ran_as_hybrid"


@pytest.mark.parametrize(
    "change",
    [
        {"method": "semantic"},
        {"radius": 1.5},
        {"radius": -0.1},
        {"top_k": 0},
        {"agent_id": ""},
        {"include_profile": "sometimes"},
        {"filters": {"session_id": {"like": "x"}}},
        {"filters": {"AND": []}},
        {"filters": {"AND": {"a": 1}}},
        {"filters": {"tags": {"in": "x"}}},
        {"filters": {"meta": {"eq": {"nested": 1}}}},
        {"filters": {}},
    ],
)
async def test_invalid_options_are_422(gateway, tenant, change) -> None:
    """Unknown method, radius outside 0..1, top_k 0, empty agent_id, a non-boolean flag and
    malformed filters (unknown operator, empty AND, AND of a non-list, in of a non-list,
    non-scalar value, empty filter) are 422."""
    key = await gateway.key(tenant, user="alice")
    r = await gateway.search(key, "alice", "q", **change)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "validation_error"


async def test_filters_are_and_composed_with_the_scope(gateway, tenant) -> None:
    """Caller filters AND the scope's session filter exactly as seed 003 writes it, and only
    matching results come back; OR and in work over memory fields."""
    key = await _seeded(gateway, tenant)
    caller = {"memory_type": "profile"}
    r = await gateway.search(
        key, "alice", "coffee roast", conversation_id="c1", scope=["current_chat"], filters=caller
    )
    body = r.json()
    assert body["filters"]["current_chat"] == {"AND": [caller, {"session_id": {"in": ["chat:c1"]}}]}
    assert body["results"] and {x["memory_type"] for x in body["results"]} == {"profile"}
    either = {"OR": [{"session_id": "chat:c2"}, {"memory_type": {"in": ["profile"]}}]}
    r = await gateway.search(key, "alice", "coffee report finance", filters=either, top_k=-1)
    got = r.json()["results"]
    assert got and all(x["session_id"] == "chat:c2" or x["memory_type"] == "profile" for x in got)
    assert {x["session_id"] for x in got} == {"chat:c1", "chat:c2"}
    r = await gateway.search(key, "alice", "coffee", filters={"session_id": {"nin": ["chat:c1"]}})
    assert all(x["session_id"] != "chat:c1" for x in r.json()["results"])


async def test_radius_is_an_absolute_threshold(gateway, tenant) -> None:
    """Without a radius an unrelated query still gets hits (ranking only); with radius 0.25
    the unrelated query gets none while the related one keeps its hit: the score is
    calibrated across queries."""
    key = await _seeded(gateway, tenant)
    unrelated = "lattice quantum chromodynamics gluon"
    r = await gateway.search(key, "alice", unrelated)
    assert r.json()["results"]  # ranking alone always returns something
    r = await gateway.search(key, "alice", unrelated, radius=0.25)
    assert r.json()["results"] == []
    r = await gateway.search(key, "alice", "quarterly report finance", radius=0.25)
    assert r.json()["results"] and "quarterly report" in r.json()["results"][0]["text"]


async def test_every_memory_type_is_labelled(gateway, tenant) -> None:
    """episode, profile, agent_case, agent_skill and unprocessed_message all appear, mapped
    from memstream's types."""
    key = await _seeded(gateway, tenant)
    h = {"Authorization": f"Bearer {key}"}
    r = await gateway.http.post(
        "/api/v1/memory/remember",
        json={
            "content": "We decided the coffee budget is 200 euros",
            "client_id": "alice",
            "memory_type": "decision",
            "session_id": "chat:c1",
        },
        headers=h,
    )
    assert r.status_code == 201, r.text
    r = await gateway.http.post(
        "/api/agent-memory/commit",
        json={
            "agent_name": "barista",
            "content": "Grind coffee just before brewing",
            "memory_type": "skill_heuristic",
        },
        headers=h,
    )
    assert r.status_code == 200
    await gateway.running.worker.broker.stop()  # the next turn stays unprocessed
    assert (
        await gateway.add(key, "alice", "c1", "more coffee thoughts for later")
    ).status_code == 202
    r = await gateway.search(
        key,
        "alice",
        "coffee",
        conversation_id="c1",
        scope=["current_chat", "all_user_memory"],
        top_k=20,
    )
    assert r.status_code == 200, r.text
    kinds = {x["memory_type"] for x in r.json()["results"]}
    assert kinds == {"episode", "profile", "agent_case", "unprocessed_message"}
    # the agent's learning is owned by (alice, barista), not by alice alone: it is found
    # when the search names the agent (owner semantics, docs/memory-model.md)
    r = await gateway.search(key, "alice", "grind coffee", agent_id="barista", top_k=20)
    assert r.status_code == 200, r.text
    assert {x["memory_type"] for x in r.json()["results"]} == {"agent_skill"}


async def test_resources_are_shared_within_the_project_named(gateway, tenant) -> None:
    """bob's decision, made in project p1, is a project memory: alice's resources search
    finds it when she names p1 (before, project_id never reached recall and she found
    nothing), and not when she names another project."""
    bob = await gateway.key(tenant, user="bob")
    alice = await gateway.key(tenant, user="alice")
    said = "We decided the release train leaves on Thursdays"
    assert (await gateway.add(bob, "bob", "b1", said, project_id="p1")).status_code == 202
    assert (await gateway.flush(bob, "bob", "b1", project_id="p1")).json()["status"] == "flushed"
    found = {}
    for project in ("p1", "p2"):
        r = await gateway.search(
            alice, "alice", "release train", scope=["resources"], project_id=project, top_k=-1
        )
        assert r.status_code == 200, r.text
        found[project] = [(x["user_id"], x["text"]) for x in r.json()["results"]]
    assert ("bob", said) in found["p1"] and found["p2"] == [], found


async def test_a_type_filter_ranks_among_the_memories_it_can_match(gateway, tenant) -> None:
    """150 preferences about espresso outrank the one decision that mentions it, in passing,
    in a long text; ``memory_type: agent_case`` must still find that decision: the type is
    pushed to recall, so the best 100 are taken among the owner's decisions, fixes, ... and
    not among all of them (where the decision came last, and was filtered out of the
    best 100 in the gateway)."""
    key = await gateway.key(tenant, user="bea")
    async with gateway.running.client(tenant, user="bea") as mem:
        rng = random.Random(3)
        for _ in range(150):  # distinct enough that none is a near duplicate of another
            topic = " and ".join(rng.sample(NOUNS, 6))
            await mem.remember(f"espresso espresso: {topic}", type="preference")
        decision = await mem.remember(
            "After a long review of vendors, budgets, delivery windows, office layout, noise "
            "and the cleaning rota, the team decided to lease the machine that also makes "
            "espresso for the third floor kitchen",
            type="decision",
        )
    r = await gateway.search(key, "bea", "espresso", top_k=-1)  # the best 100 unfiltered
    assert len(r.json()["results"]) == 100 and decision.id not in str(r.json())
    r = await gateway.search(key, "bea", "espresso", top_k=5, filters={"memory_type": "agent_case"})
    assert r.status_code == 200, r.text
    assert [x["id"] for x in r.json()["results"]] == [decision.id]
    both = {"AND": [{"memory_type": {"in": ["agent_case"]}}, {"scope": "user"}]}
    r = await gateway.search(key, "bea", "espresso", top_k=5, filters=both)
    assert [x["id"] for x in r.json()["results"]] == [decision.id]
    r = await gateway.search(  # no memory can match: nothing asked of recall, nothing found
        key, "bea", "espresso", top_k=5, filters={"type": "no-such-type"}
    )
    assert r.status_code == 200 and r.json()["results"] == []

"""Seed 004: /api/agent-memory/* over real HTTP with Bearer keys."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.integration

TC = {"task_description": "deploy the api", "skills_used": ["k8s", "helm"], "outcome": "success"}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_commit_query_list_peer_pending(gateway, tenant) -> None:
    """commit stores structured task_context, dedupes; query scores and counts accesses;
    list pages; peer-query reads another agent without counting; pending-review counts.
    Each agent has its own key, so its memories are agent-owned: what peers may read (a
    user's key naming an agent writes that user-and-agent's private memories)."""
    before = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    key = await gateway.key(tenant, agent="scout")
    h = auth(key)
    body = {
        "agent_name": "scout",
        "content": "Helm rollbacks need the previous release number from helm history",
        "memory_type": "lesson_learned",
        "task_context": TC,
    }
    r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=h)
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["duplicate_detected"] is False
    again = await gateway.http.post("/api/agent-memory/commit", json=body, headers=h)
    assert again.json() == {"memory_id": first["memory_id"], "duplicate_detected": True}
    other = {
        **body,
        "content": "Terraform state locks live in the dynamodb table",
        "memory_type": "domain_pattern",
    }
    assert (
        await gateway.http.post("/api/agent-memory/commit", json=other, headers=h)
    ).status_code == 200

    q = {"agent_name": "scout", "query": "how do I roll back a helm release?", "limit": 5}
    r = await gateway.http.post("/api/agent-memory/query", json=q, headers=h)
    assert r.status_code == 200, r.text
    top = r.json()["memories"][0]
    assert top["memory_id"] == first["memory_id"]
    assert top["task_context"] == TC
    assert 0 < top["score"] <= 1

    async def counted() -> bool:
        r = await gateway.http.post(
            "/api/agent-memory/list", json={"agent_name": "scout"}, headers=h
        )
        counts = {m["memory_id"]: m["access_count"] for m in r.json()["memories"]}
        return bool(counts[first["memory_id"]] >= 1)

    await gateway.running.wait_for(counted, 10, "the query's access to be counted")

    r = await gateway.http.post(
        "/api/agent-memory/list", json={"agent_name": "scout", "limit": 1, "offset": 0}, headers=h
    )
    page = r.json()
    assert r.status_code == 200 and len(page["memories"]) == 1 and page["next_offset"] == 1
    r = await gateway.http.post(
        "/api/agent-memory/list",
        json={"agent_name": "scout", "memory_type": "domain_pattern"},
        headers=h,
    )
    assert [m["memory_type"] for m in r.json()["memories"]] == ["domain_pattern"]

    peer_key = await gateway.key(tenant, agent="builder")
    pq = {"target_agent": "scout", "query": "helm release rollback", "limit": 3}
    r = await gateway.http.post("/api/agent-memory/peer-query", json=pq, headers=auth(peer_key))
    assert r.status_code == 200, r.text
    peers = r.json()["memories"]
    assert peers and peers[0]["agent_name"] == "scout" and "access_count" not in peers[0]
    assert peers[0]["created_at"]
    r = await gateway.http.post(
        "/api/agent-memory/peer-query",
        json={**pq, "memory_type": "domain_pattern"},
        headers=auth(peer_key),
    )
    assert all(m["memory_type"] == "domain_pattern" for m in r.json()["memories"])

    since = json.dumps({"scout": before, "builder": before})
    r = await gateway.http.get(
        "/api/agent-memory/pending-review", params={"since": since}, headers=h
    )
    assert r.status_code == 200, r.text
    assert r.json()["counts"]["scout"] == 2


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/agent-memory/query", {"agent_name": "a", "query": "q", "limit": 21}),
        ("/api/agent-memory/list", {"agent_name": "a", "limit": 101}),
        ("/api/agent-memory/list", {"agent_name": "a", "offset": -1}),
        ("/api/agent-memory/peer-query", {"target_agent": "b", "query": "q", "limit": 11}),
        ("/api/agent-memory/peer-query", {"target_agent": "", "query": "q"}),
        ("/api/agent-memory/commit", {"agent_name": "a", "content": "x", "memory_type": "episode"}),
        (
            "/api/agent-memory/commit",
            {
                "agent_name": "a",
                "content": "x",
                "memory_type": "lesson_learned",
                "task_context": {**TC, "outcome": "great"},
            },
        ),
    ],
)
async def test_limits_and_shapes_give_422(gateway, tenant, path, body) -> None:
    """Limits above the maximum and malformed bodies are 422 with the error shape."""
    key = await gateway.key(tenant, user="ops")
    r = await gateway.http.post(path, json=body, headers=auth(key))
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"code", "message"} and r.json()["code"] == "validation_error"


async def test_pending_review_rejects_bad_since(gateway, tenant) -> None:
    """since must be a JSON map of agents to ISO times."""
    key = await gateway.key(tenant, user="ops")
    for since in ("not json", "[1]", '{"a": "yesterday"}'):
        r = await gateway.http.get(
            "/api/agent-memory/pending-review", params={"since": since}, headers=auth(key)
        )
        assert r.status_code == 422 and r.json()["code"] == "validation_error"


async def test_pending_review_takes_iso_times_only(gateway, tenant) -> None:
    """since's times are ISO-8601 dates and times: Unix seconds (as a string or a number), a
    date alone or a space for the T are 422 saying so (pydantic read them as times), while
    Z, an offset or no zone are counted."""
    key = await gateway.key(tenant, agent="scout")
    for bad in ("1700000000", 1700000000, "2026-07-04", "2026-07-04 12:00:00", "1700000000.5"):
        since = json.dumps({"scout": bad})
        r = await gateway.http.get(
            "/api/agent-memory/pending-review", params={"since": since}, headers=auth(key)
        )
        assert r.status_code == 422 and r.json()["code"] == "validation_error", (bad, r.text)
        assert "ISO-8601" in r.json()["message"], r.text
    for good in ("2026-07-04T12:00:00Z", "2026-07-04T12:00:00.123+02:00", "2026-07-04T12:00"):
        since = json.dumps({"scout": good})
        r = await gateway.http.get(
            "/api/agent-memory/pending-review", params={"since": since}, headers=auth(key)
        )
        assert r.status_code == 200 and r.json()["counts"] == {"scout": 0}, (good, r.text)


async def test_agent_bound_key_cannot_act_as_another_agent(gateway, tenant) -> None:
    """A key bound to agent A cannot commit or query as agent B (403), nor without a key (401)."""
    key = await gateway.key(tenant, agent="a")
    body = {"agent_name": "b", "content": "x", "memory_type": "lesson_learned"}
    r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(key))
    assert r.status_code == 403 and r.json()["code"] == "forbidden"
    r = await gateway.http.post("/api/agent-memory/commit", json=body)
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"


async def test_an_agent_s_commit_and_query_stay_in_its_own_namespace(gateway, tenant) -> None:
    """(alice, scout) shares a global blueprint; the agent scout, with its own key, commits
    the same text: it is stored as scout's (before, it was reported a duplicate of alice's
    memory and nothing was stored); scout's queries and list show only scout's memories (the
    list showed alice's shared one too), and the queries count no access on alice's (before,
    every hit was counted)."""
    from memstream.schemas.memory import MemoryType, Scope
    from memstream.storage.postgres import OwnerFilter

    run = gateway.running
    scout = await gateway.key(tenant, agent="scout")
    alice_scout = await gateway.key(tenant, user="alice", agent="scout")
    text = (
        "Terraform plan must run before every apply in CI because the remote state backend "
        "can drift when two pipelines share a workspace; apply exactly the reviewed plan file"
    )
    async with run.client(tenant, user="alice", agent="scout", api_key=alice_scout) as sdk:
        hers = await sdk.command(
            "remember", content=text, type=MemoryType.TASK_BLUEPRINT, scope=Scope.GLOBAL
        )
    assert hers.memory is not None
    body = {"agent_name": "scout", "content": text, "memory_type": "task_blueprint"}
    r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
    assert r.status_code == 200, r.text
    assert r.json()["memory_id"] != hers.memory.id and r.json()["duplicate_detected"] is False
    mine = await run.pg.get(OwnerFilter(tenant=tenant, agent="scout"), r.json()["memory_id"])
    assert mine is not None and (mine.user, mine.agent) == (None, "scout")
    q = {"agent_name": "scout", "query": "terraform plan apply", "limit": 5}
    for _ in range(2):
        r = await gateway.http.post("/api/agent-memory/query", json=q, headers=auth(scout))
        assert r.status_code == 200, r.text
        assert [m["memory_id"] for m in r.json()["memories"]] == [mine.id]
    r = await gateway.http.post(
        "/api/agent-memory/list", json={"agent_name": "scout"}, headers=auth(scout)
    )
    assert [m["memory_id"] for m in r.json()["memories"]] == [mine.id], r.text
    await run.worker.recall.flush_touches()
    theirs = await run.pg.get(
        OwnerFilter(tenant=tenant, user="alice", agent="scout"), hers.memory.id
    )
    assert theirs is not None and theirs.access_count == 0


async def test_pending_review_counts_no_other_user_s_memories(gateway, tenant) -> None:
    """bob's private memory with the agent scout is in no one else's count: alice's key, the
    agent builder's and a tenant-wide key count scout's own learning only (before, each
    counted bob's too, and "*" the whole tenant)."""
    from memstream.schemas.memory import MemoryType

    run = gateway.running
    scout = await gateway.key(tenant, agent="scout")
    bob_scout = await gateway.key(tenant, user="bob", agent="scout")
    before = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    body = {
        "agent_name": "scout",
        "content": "Pin chart versions",
        "memory_type": "skill_heuristic",
    }
    r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
    assert r.status_code == 200, r.text
    async with run.client(tenant, user="bob", agent="scout", api_key=bob_scout) as sdk:
        await sdk.command("remember", content="bob's locker is 42", type=MemoryType.FACT)
    since = json.dumps({"scout": before, "*": before})
    keys = {
        "alice": await gateway.key(tenant, user="alice"),
        "builder": await gateway.key(tenant, agent="builder"),
        "tenant": await gateway.key(tenant),
    }
    for who, key in keys.items():
        r = await gateway.http.get(
            "/api/agent-memory/pending-review", params={"since": since}, headers=auth(key)
        )
        assert r.status_code == 200 and r.json()["counts"] == {"scout": 1, "*": 1}, (who, r.text)


async def test_a_peer_reads_an_agent_s_learnings_not_its_other_memories(gateway, tenant) -> None:
    """The agent scout holds a learning and a fact of its own: the peer builder's query
    returns the learning only (it returned every type: a peer read an agent's facts,
    profiles and conversation episodes), unless it names a tier."""
    from memstream.schemas.memory import MemoryType

    scout = await gateway.key(tenant, agent="scout")
    builder = await gateway.key(tenant, agent="builder")
    body = {
        "agent_name": "scout",
        "content": "The staging cluster restarts every night at two",
        "memory_type": "domain_pattern",
    }
    r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
    assert r.status_code == 200, r.text
    async with gateway.running.client(tenant, agent="scout", api_key=scout) as sdk:
        await sdk.command(
            "remember",
            content="The staging cluster admin is on call at night",
            type=MemoryType.FACT,
        )
    q = {"agent_name": "builder", "target_agent": "scout", "query": "staging cluster night"}
    r = await gateway.http.post("/api/agent-memory/peer-query", json=q, headers=auth(builder))
    assert r.status_code == 200, r.text
    assert [m["memory_type"] for m in r.json()["memories"]] == ["domain_pattern"]


async def test_a_commit_goes_through_while_the_vector_index_is_away(gateway, tenant) -> None:
    """The vector index unreachable: a commit skips its near-duplicate check and stores the
    learning (it was 503), and a second commit of it is still one memory (remember's exact
    duplicate check runs in Postgres)."""
    scout = await gateway.key(tenant, agent="scout")
    body = {
        "agent_name": "scout",
        "content": "Rotate the CI runner tokens every ninety days",
        "memory_type": "lesson_learned",
    }
    async with gateway.running.index_away():
        r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
        assert r.status_code == 200 and r.json()["duplicate_detected"] is False, r.text
        again = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
    assert again.status_code == 200, again.text
    assert again.json() == {"memory_id": r.json()["memory_id"], "duplicate_detected": True}


async def test_a_duplicate_commit_takes_the_new_task_context(gateway, tenant) -> None:
    """A commit that duplicates a learning updates its task_context (the seed's UPDATE; it
    kept the first one): found by the near-duplicate search, and by remember's exact check
    with the index away; the same context again writes nothing (one "updated" audit row),
    a commit without one keeps it, and another owner's copy is never changed."""
    from memstream.schemas.memory import MemoryType

    run = gateway.running
    scout = await gateway.key(tenant, agent="scout")
    alice_scout = await gateway.key(tenant, user="alice", agent="scout")
    text = (
        "Drain the node before upgrading the kubelet on a production cluster: cordon it, "
        "evict the pods with their disruption budgets respected, wait until the daemonsets "
        "settle, upgrade, then uncordon it and watch the node's conditions for ten minutes"
    )
    async with run.client(tenant, user="alice", agent="scout", api_key=alice_scout) as sdk:
        hers = await sdk.command(
            "remember",
            content=text,
            type=MemoryType.LESSON_LEARNED,
            metadata={"task_context": TC, "outcome": "success"},
        )
    assert hers.memory is not None
    body = {"agent_name": "scout", "content": text, "memory_type": "lesson_learned"}
    commit = {**body, "task_context": TC}
    first = await gateway.http.post("/api/agent-memory/commit", json=commit, headers=auth(scout))
    assert first.status_code == 200 and first.json()["duplicate_detected"] is False, first.text
    mid = first.json()["memory_id"]
    assert mid != hers.memory.id
    failed = {**TC, "task_description": "upgrade the kubelet", "outcome": "failed"}

    async def stored_context() -> dict[str, object] | None:
        r = await gateway.http.post(
            "/api/agent-memory/list", json={"agent_name": "scout"}, headers=auth(scout)
        )
        (m,) = r.json()["memories"]
        assert m["memory_id"] == mid and m["content"] == text
        tc: dict[str, object] | None = m["task_context"]
        return tc

    for _ in range(2):  # the second one finds the context stored already
        r = await gateway.http.post(
            "/api/agent-memory/commit", json={**body, "task_context": failed}, headers=auth(scout)
        )
        assert r.json() == {"memory_id": mid, "duplicate_detected": True}, r.text
        assert await stored_context() == failed
    updated = [e for e in await run.pg.events_for(tenant, mid) if e["kind"] == "updated"]
    assert len(updated) == 1, updated
    r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
    assert r.json() == {"memory_id": mid, "duplicate_detected": True}, r.text
    assert await stored_context() == failed

    async with run.index_away():
        r = await gateway.http.post("/api/agent-memory/commit", json=commit, headers=auth(scout))
    assert r.json() == {"memory_id": mid, "duplicate_detected": True}, r.text
    assert await stored_context() == TC

    async with run.client(tenant, user="alice", agent="scout", api_key=alice_scout) as sdk:
        assert (await sdk.get(hers.memory.id)).metadata["task_context"] == TC


async def test_a_commit_s_duplicate_check_counts_no_access(gateway, tenant) -> None:
    """The near-duplicate search of a commit is no read by the agent: committing a learning
    again leaves its access_count at 0 (it counted one per commit); a query still counts."""
    from memstream.storage.postgres import OwnerFilter

    run = gateway.running
    scout = await gateway.key(tenant, agent="scout")
    body = {
        "agent_name": "scout",
        "content": "Canary deploys catch config drift before the full rollout",
        "memory_type": "skill_heuristic",
    }
    first = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
    mid = first.json()["memory_id"]
    for _ in range(2):
        r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
        assert r.json() == {"memory_id": mid, "duplicate_detected": True}, r.text
    await run.worker.recall.flush_touches()
    owner = OwnerFilter(tenant=tenant, agent="scout")
    m = await run.pg.get(owner, mid)
    assert m is not None and m.access_count == 0
    q = {"agent_name": "scout", "query": "canary deploys config drift"}
    r = await gateway.http.post("/api/agent-memory/query", json=q, headers=auth(scout))
    assert [x["memory_id"] for x in r.json()["memories"]] == [mid], r.text
    await run.worker.recall.flush_touches()
    m = await run.pg.get(owner, mid)
    assert m is not None and m.access_count == 1


async def test_queries_and_peer_reads_are_in_the_activity_log(gateway, tenant) -> None:
    """A query is recorded in the audit trail as agent_memory_query, a peer read as
    peer_memory_query (neither was recorded): who read, which memories, never the query."""
    run = gateway.running
    scout = await gateway.key(tenant, agent="scout")
    builder = await gateway.key(tenant, agent="builder")
    body = {
        "agent_name": "scout",
        "content": "Blue-green switches need the health check to pass on the idle colour",
        "memory_type": "domain_pattern",
    }
    mid = (
        await gateway.http.post("/api/agent-memory/commit", json=body, headers=auth(scout))
    ).json()["memory_id"]
    q = {"agent_name": "scout", "query": "blue green health check secret-words-q1"}
    r = await gateway.http.post("/api/agent-memory/query", json=q, headers=auth(scout))
    assert [m["memory_id"] for m in r.json()["memories"]] == [mid], r.text
    pq = {"target_agent": "scout", "query": "blue green idle colour secret-words-q2"}
    r = await gateway.http.post("/api/agent-memory/peer-query", json=pq, headers=auth(builder))
    assert [m["memory_id"] for m in r.json()["memories"]] == [mid], r.text
    wanted = {"agent_memory_query", "peer_memory_query"}
    for _ in range(100):  # a query's row is written after its answer went out
        events = {e["kind"]: e for e in await run.pg.events_for(tenant)}
        if wanted <= set(events):
            break
        await asyncio.sleep(0.05)
    own, peer = events["agent_memory_query"], events["peer_memory_query"]
    assert own["memory_id"] is None and peer["memory_id"] is None
    assert own["detail"] == {"user": None, "agent": "scout", "memory_ids": [mid]}
    assert peer["detail"] == {
        "user": None,
        "agent": "builder",
        "target_agent": "scout",
        "memory_ids": [mid],
    }
    assert "secret-words" not in json.dumps([own, peer], default=str)


async def test_commit_finds_a_rephrased_learning_of_the_agent(gateway, tenant) -> None:
    """A learning committed again in other words (cosine 0.94 as stored, under the worker's
    own 0.95 fold) is the agent's duplicate: the same memory, ``duplicate_detected``. Before,
    the commit's search compared the undated text with the stored vectors of its dated text,
    where even the same text scores 0.78, and stored it anew. A different learning on the
    same tools is stored as new."""
    key = await gateway.key(tenant, agent="scout")
    h = auth(key)

    async def commit(content: str) -> dict[str, object]:
        body = {"agent_name": "scout", "content": content, "memory_type": "lesson_learned"}
        r = await gateway.http.post("/api/agent-memory/commit", json=body, headers=h)
        assert r.status_code == 200, r.text
        out: dict[str, object] = r.json()
        return out

    first = await commit(
        "The billing service times out when the batch is larger than 500 rows; split it."
    )
    again = await commit("Billing service times out for batches over 500 rows, so split them.")
    assert again == {"memory_id": first["memory_id"], "duplicate_detected": True}
    other = await commit("The billing service retries a failed charge three times.")
    assert other["duplicate_detected"] is False and other["memory_id"] != first["memory_id"]

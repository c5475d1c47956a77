"""Exact owner semantics on every verb (docs/memory-model.md), against a second owner that
shares the user or the agent, and a second tenant: own memories match user and agent both;
peer reads see agent-owned memories only; project and global memories are readable by the
tenant's (project's) callers and writable by their owner only."""

from __future__ import annotations

import pytest

from memstream.producers.client import CommandError

pytestmark = pytest.mark.integration

# (alice, bot) is the owner; the intruders share its user, its agent, both in another tenant
INTRUDERS = [
    ("acme", "alice", None),
    ("acme", None, "bot"),
    ("acme", "alice", "other"),
    ("acme", "bob", "bot"),
    ("globex", "alice", "bot"),
]


async def code(coro) -> str:
    try:
        await coro
    except CommandError as exc:
        return exc.code.value
    return "ok"


@pytest.mark.parametrize(("tenant", "user", "agent"), INTRUDERS)
async def test_other_owners_cannot_read_or_write(running, tenant, user, agent) -> None:
    """get, list, pin, unpin, forget, fact_history, fact_update and recall by an owner that
    differs in user, agent or tenant never reach (alice, bot)'s memory or fact."""
    async with running.client("acme", user="alice", agent="bot") as owner:
        m = await owner.remember("the boathouse key hangs behind the blue door")
        await owner.fact_put("boat", "a red kayak")
    async with running.client(tenant, user=user, agent=agent) as other:
        for verb in ("get", "pin", "unpin", "forget"):
            assert await code(other.command(verb, id=m.id)) == "not_found", verb
        assert (await other.list_memories(limit=100)).memories == []
        assert await other.fact_history("boat") == []
        assert await code(other.fact_update("boat", "a blue canoe")) == "not_found"
        hits = (await other.recall("boathouse key blue door kayak", cache=False)).hits
        assert hits == []
    async with running.client("acme", user="alice", agent="bot") as owner:
        got = await owner.get(m.id)
        assert got.deleted_at is None and not got.pinned
        assert [f.content for f in await owner.fact_history("boat")] == ["boat: a red kayak"]


async def test_forget_owner_erases_exactly_one_owner(running) -> None:
    """forget_owner for (alice, bot) erases that owner's memories and raw turns only: alice's
    turns with another agent, and agent 'alice', keep theirs."""
    owners = {("alice", "bot"): "sailing", ("alice", "other"): "chess", (None, "alice"): "jazz"}
    for (user, agent), topic in owners.items():
        async with running.client("acme", user=user, agent=agent) as c:
            await c.publish_turn([("user", f"I prefer {topic} on weekends.")], session="s1")
            await c.remember(f"{topic} is a hobby")
    await running.wait_for(running.drained, 30, "the turns to be processed")
    async with running.client("acme", user="alice", agent="bot") as owner:
        counts = await owner.forget_owner()
    assert counts["turns"] == 1 and counts["memories"] >= 2
    for (user, agent), topic in owners.items():
        async with running.client("acme", user=user, agent=agent) as c:
            texts = " ".join(m.content for m in (await c.list_memories(limit=100)).memories)
            assert (topic in texts) == ((user, agent) != ("alice", "bot")), (user, agent)
    s, js = running.worker.deps.subjects, running.worker.deps.js
    info = await js.stream_info(s.stream("turns"), subjects_filter=s.turns_filter("acme", "alice"))
    assert sum((info.state.subjects or {}).values()) == 2  # (alice, other) and agent alice


async def test_peer_reads_see_agent_owned_memories_only(running) -> None:
    """peer_query and peer_query_any return an agent's own memories (no user), never a
    user's memory with that agent; peer_query_any from a user-only caller is not the tenant."""
    async with (
        running.client("acme", agent="planner") as planner,
        running.client("acme", user="alice", agent="planner") as alice,
        running.client("globex", agent="planner") as foreign,
        running.client("acme", user="carol") as carol,
    ):
        shared = await planner.remember("deploys happen on tuesdays only", type="rule")
        private = await alice.remember("alice deploys on fridays secretly", type="rule")
        await foreign.remember("globex deploys every day", type="rule")
        direct = [h.id for h in (await carol.peer_query("planner", "deploys")).hits]
        assert direct == [shared.id]
        anyone = [h.id for h in (await carol.peer_query_any("deploys")).hits]
        assert anyone == [shared.id] and private.id not in anyone


async def test_project_and_global_memories_are_shared_for_reading(running) -> None:
    """A project memory is readable (get, list, recall) by another user of the project, a
    global one by every caller of the tenant; neither by another project or tenant; only the
    owner may pin or forget them."""
    async with running.client("acme", user="alice") as alice:
        proj = await alice.remember(
            "the apollo release train leaves on mondays", scope="project", project="apollo"
        )
        glob = await alice.remember("the office wifi is called acme-guest", scope="global")
        mine = await alice.remember("alice keeps her notes in a green notebook")
    async with running.client("acme", user="bob") as bob:
        assert (await bob.command("get", id=proj.id, project="apollo")).memory is not None
        assert await code(bob.command("get", id=proj.id)) == "not_found"  # no project named
        assert (await bob.get(glob.id)).id == glob.id
        assert await code(bob.get(mine.id)) == "not_found"
        listed = {m.id for m in (await bob.list_memories(project="apollo", limit=100)).memories}
        assert listed == {proj.id, glob.id}
        hits = {
            h.id
            for h in (
                await bob.recall(
                    "apollo release train wifi notebook", project="apollo", cache=False
                )
            ).hits
        }
        assert hits == {proj.id, glob.id}
        for verb in ("pin", "forget"):
            assert await code(bob.command(verb, id=glob.id, project="apollo")) == "not_found"
    async with running.client("acme", user="dan") as dan:
        hits = {
            h.id
            for h in (
                await dan.recall("apollo release train wifi", project="gemini", cache=False)
            ).hits
        }
        assert hits == {glob.id}
    async with running.client("globex", user="bob") as stranger:
        assert (await stranger.recall("apollo wifi", project="apollo", cache=False)).hits == []
        assert await code(stranger.get(glob.id)) == "not_found"


async def test_cached_recall_sees_a_new_shared_memory(running) -> None:
    """A cached recall of bob is invalidated when alice stores a global memory."""
    async with (
        running.client("acme", user="bob") as bob,
        running.client("acme", user="alice") as alice,
    ):
        assert (await bob.recall("the parking garage level")).hits == []
        glob = await alice.remember("visitors park on garage level minus two", scope="global")
        hits = [h.id for h in (await bob.recall("the parking garage level")).hits]
        assert hits == [glob.id]


async def test_one_decision_in_two_projects_reaches_both(running) -> None:
    """The same decision said by one owner in two projects is a memory in each: neither
    merges into the other, so each project's readers see their own."""
    said = "We decided to freeze the schema before the audit."
    async with running.client("acme", user="pia") as pia:
        for project in ("alpha", "beta"):
            await pia.publish_turn([("user", said)], session=f"s-{project}", project=project)
    await running.wait_for(running.drained, 30, "the turns to be processed")
    async with running.client("acme", user="rex") as rex:
        for project in ("alpha", "beta"):
            seen = await rex.list_memories(project=project, scopes=["project"], limit=100)
            assert [(m.type, m.project) for m in seen.memories] == [("decision", project)]

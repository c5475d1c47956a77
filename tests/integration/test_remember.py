"""The remember command goes the stages' way: redaction, near-duplicate folding, the fold
recorded; against real NATS, Postgres and Qdrant Edge."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest

from memstream.storage.postgres import OwnerFilter

pytestmark = pytest.mark.integration

NEAR = (
    "I keep the spare house key under the blue flower pot by the door",
    "I keep the spare house key under the blue flower pot near the door",
)
GHP = "ghp_0123456789abcdefghijABCDEFGHIJ012345"


async def _events(running, tenant: str) -> list[dict[str, Any]]:
    """Every event published on mem.events.<tenant> so far."""
    s = running.worker.deps.subjects
    nc = await nats.connect(running.nats_url)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(s.events(tenant), stream=s.stream("events"))
        out: list[dict[str, Any]] = []
        while True:
            try:
                msgs = await sub.fetch(100, timeout=1)
            except TimeoutError:
                return out
            out += [json.loads(m.data) for m in msgs]
    finally:
        await nc.close()


async def test_remember_folds_a_near_duplicate_instead_of_storing_it_twice(running) -> None:
    """A second remember of nearly the same text by the same owner is folded into the first
    memory (one row, both sources, a merged event, the reply names the first memory); saying
    it a third time finds the recorded fold and still adds nothing."""
    async with running.client("acme", user="ola") as mem:
        first = (await mem.command("remember", content=NEAR[0])).memory
        assert first is not None
        second = await mem.command("remember", content=NEAR[1])
        assert second.memory is not None and second.memory.id == first.id
        assert second.detail == {"duplicate": True, "near_duplicate": True}
        assert second.memory.content == NEAR[0] and second.memory.indexed
        again = await mem.command("remember", content=NEAR[1])
        assert again.memory is not None and again.memory.id == first.id
        rows = (await mem.list_memories()).memories
        assert [r.id for r in rows] == [first.id] and len(rows[0].source_event_ids) == 2
    kinds = [r["kind"] for r in await running.pg.events_for("acme", first.id)]
    assert kinds == ["stored", "merged"]
    published = [(e["kind"], e["memory_id"]) for e in await _events(running, "acme")]
    assert published == [("stored", first.id), ("merged", first.id)]


async def test_a_fold_is_found_again_while_the_index_is_away(running) -> None:
    """With the vector index away (no near-duplicate check can run), remembering a folded text
    again still answers with the memory it was folded into and stores nothing; a new text is
    kept in Postgres unindexed, and indexed once the index is back."""
    flt = OwnerFilter(tenant="acme", user="ola")
    async with running.client("acme", user="ola") as mem:
        first = await mem.remember(NEAR[0])
        folded = (await mem.command("remember", content=NEAR[1])).memory
        assert folded is not None and folded.id == first.id
        async with running.index_away():
            again = await mem.command("remember", content=NEAR[1])
            fresh = await mem.remember("the boiler is serviced every October")
        assert again.memory is not None and again.memory.id == first.id
        assert again.detail == {"duplicate": True, "near_duplicate": True}
        assert not fresh.indexed
        assert {m.id for m in (await mem.list_memories()).memories} == {first.id, fresh.id}

    async def fresh_indexed() -> bool:
        row = await running.pg.get(flt, fresh.id)
        return row is not None and row.indexed

    await running.wait_for(fresh_indexed, 30, "the maintenance loop indexing it")


async def test_remember_folds_only_within_one_owner_and_scope(running) -> None:
    """The same near duplicate by another owner, in another scope of the same owner, or sent
    with fold_near_duplicates=False, is a memory of its own: a fold never crosses an owner or
    changes how long a memory lives, and a caller that keys its items can keep them apart."""
    async with running.client("acme", user="ola") as ola, running.client("acme", user="per") as per:
        kept = await ola.remember(NEAR[0])
        theirs = await per.remember(NEAR[1])
        session = await ola.remember(NEAR[1], scope="session")
        assert len({kept.id, theirs.id, session.id}) == 3
        assert session.content == NEAR[1] and session.expires_at is not None
        assert len((await ola.list_memories()).memories) == 2
    async with running.client("acme", user="quy") as quy:
        first = await quy.remember(NEAR[0])
        apart = await quy.remember(NEAR[1], fold_near_duplicates=False)
        assert apart.content == NEAR[1] and apart.id != first.id
        assert len((await quy.list_memories()).memories) == 2


async def test_the_same_text_in_another_scope_is_a_memory_of_its_own(running) -> None:
    """An exact duplicate merges only into a memory that lives as long and that the same
    readers see. The same text remembered for a session and then for the user is two
    memories (the user's does not go at the session's expiry); a project memory is shared
    with its own project's readers whichever project said it first."""
    text = "the staging database is rebuilt every Sunday night"
    async with (
        running.client("acme", user="ivo") as ivo,
        running.client("acme", user="pia") as pia,
        running.client("acme", user="rex") as reader,
    ):
        short = await ivo.remember(text, scope="session")
        long = await ivo.remember(text)
        assert short.id != long.id and long.expires_at is None
        assert {m.id for m in (await ivo.list_memories()).memories} == {short.id, long.id}
        again = await ivo.command("remember", content=text)
        assert again.memory is not None and again.memory.id == long.id
        assert again.detail == {"duplicate": True, "near_duplicate": False}
        alpha = await pia.remember(text, scope="project", project="alpha")
        beta = await pia.remember(text, scope="project", project="beta")
        assert alpha.id != beta.id and beta.project == "beta"
        seen = await reader.list_memories(project="beta", scopes=["project"])
        assert {m.id for m in seen.memories} == {beta.id}


async def test_a_remembered_secret_is_redacted_everywhere(running) -> None:
    """A token and a password in a remembered text and its metadata are replaced by typed
    placeholders before anything is stored: not in the reply, the row, the recall hit or the
    published event."""
    text = f"deploy with token {GHP}; my password is hunter2!"
    async with running.client("acme", user="sec") as mem:
        m = await mem.remember(text, metadata={"note": f"the token is {GHP}"})
        assert GHP not in m.content and "hunter2!" not in m.content
        assert "[API_KEY:" in m.content and "[PASSWORD:" in m.content
        assert "[API_KEY:" in m.metadata["note"] and GHP not in json.dumps(m.metadata)
        hits = (await mem.recall("deploy token password", top_k=3)).hits
        assert hits and hits[0].id == m.id and GHP not in hits[0].text
    row = await running.pg.get(OwnerFilter(tenant="acme", user="sec"), m.id)
    assert row is not None and GHP not in row.content and GHP not in json.dumps(row.metadata)
    events = await _events(running, "acme")
    assert events and all(
        GHP not in json.dumps(e) and "hunter2" not in json.dumps(e) for e in events
    )

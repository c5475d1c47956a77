"""What MemoryMiddleware publishes and stores around a fake model provider, against the real
stack (NATS, Postgres, Qdrant Edge, the worker): only the prompt and the final answer of a
completed run, and a verified tool outcome as a fix. The model is the only fake: a plain
function."""

from __future__ import annotations

import json
from dataclasses import replace

import nats
import pytest
from agentturns import SYSTEM, Audit

from memstream.producers import (
    ChatMessage,
    MemoryMiddleware,
    ModelOutput,
    ToolOutcome,
    TurnContext,
)
from memstream.schemas.events import TurnEvent
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


async def last_turn(running, tenant: str, owner: str, session: str) -> bytes:
    """The body of the newest raw turn on the session's subject, as the stream holds it."""
    subjects = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        raw = await nc.jetstream().get_last_msg(
            subjects.stream("turns"), subjects.turns(tenant, owner, session)
        )
    finally:
        await nc.close()
    assert raw.data is not None
    return bytes(raw.data)


async def test_only_the_prompt_and_final_answer_are_published(running) -> None:
    """A tool loop's turn publishes exactly [user prompt, final answer]: no tool call, tool
    result, system text, reasoning or recalled text reaches the stream or the store."""
    audit = Audit()
    async with running.client("acme", user="dee") as mem:
        await mem.remember("RECALLED-7 the deploy key lives in the vault", type="fact")
        mw = MemoryMiddleware(mem, audit=audit, min_score=0.1)
        ctx = TurnContext(
            [ChatMessage("system", SYSTEM), ChatMessage("user", "where does the deploy key live?")],
            "t1",
        )
        ctx = await mw.before_prompt(ctx)
        assert any("RECALLED-7" in m.content for m in ctx.messages if m.role == "memory")
        step = ModelOutput("", tool_calls=({"id": "c1", "name": "grep", "args": "TOOL-CALL-5"},))
        await mw.after_prompt(ctx, step)  # not final: nothing published
        ctx = TurnContext(
            [
                *ctx.messages,
                ChatMessage("assistant", "", tool_calls=step.tool_calls),
                ChatMessage("tool", "TOOL-RESULT-42 vault/keys/deploy", name="grep"),
            ],
            ctx.session,
            turn_id=ctx.turn_id,
            started_at=ctx.started_at,
        )
        ctx = await mw.before_prompt(ctx)  # tool-only: no recall, the old block dropped
        assert ctx.recall_reason == "tool_only"
        out = ModelOutput("The deploy key is in the vault.", reasoning="REASONING-SECRET-99")
        await mw.after_prompt(ctx, out)
        await mw.after_prompt(ctx, out)  # a retried after_prompt: the same event id
        added = await audit.wait("add_succeeded", 2)
        assert sorted(bool(e.metadata["duplicate"]) for e in added) == [False, True]
        assert added[0].metadata == {
            "duplicate": added[0].metadata["duplicate"],
            "message_count": 2,
            "kind": "turn",
        }
        assert await mem.flush("t1", within_s=30)
        listed = await mem.list_memories(limit=100)
    # the raw turn on the stream: exactly two messages
    raw = await last_turn(running, "acme", "dee", "t1")
    turn = TurnEvent.model_validate_json(raw)
    assert [(m.role.value, m.content) for m in turn.messages] == [
        ("user", "where does the deploy key live?"),
        ("assistant", "The deploy key is in the vault."),
    ]
    everything = json.dumps([m.model_dump(mode="json") for m in listed.memories])
    for secret in ("TOOL-RESULT-42", "TOOL-CALL-5", "SYSTEM-SECRET", "REASONING-SECRET"):
        assert secret not in everything and secret not in raw.decode()
    assert everything.count("RECALLED-7") == 1  # the remembered memory itself, nothing more
    episodes = [m.content for m in listed.memories if m.type.value == "episode"]
    assert any("where does the deploy key live?" in e and "in the vault." in e for e in episodes)


async def test_runs_that_did_not_complete_are_not_published(running) -> None:
    """An output on the error path, or a context with no user input, publishes nothing."""
    audit = Audit()
    async with running.client("acme", user="eve") as mem:
        mw = MemoryMiddleware(mem, audit=audit)
        ctx = await mw.before_prompt(TurnContext([ChatMessage("user", "hi there friend")], "x"))
        await mw.after_prompt(ctx, ModelOutput("partial", completed=False))
        await mw.after_prompt(TurnContext([ChatMessage("system", SYSTEM)], "x"), "an answer")
        await mw.after_prompt(ctx, "the real answer")  # the control: this one is published
        await audit.wait("add_succeeded")
        await mem.flush("x")
        listed = await mem.list_memories()
    assert [m.content for m in listed.memories if "partial" in m.content] == []
    assert len(audit.named("add_succeeded")) == 1 and audit.named("add_failed") == []


async def test_a_final_answer_that_also_asks_for_tools_is_published_without_them(
    running,
) -> None:
    """The host's answer at its tool limit (text, and the tool calls the model still asked
    for) marked ``final=True`` is published as the turn's answer, its tool calls left out; the
    same output not marked final is a tool-loop step and publishes nothing."""
    audit = Audit()
    calls = ({"id": "c9", "name": "search", "args": "TOOL-CALL-77"},)
    async with running.client("acme", user="gil") as mem:
        mw = MemoryMiddleware(mem, audit=audit, flush_s=None)
        ctx = TurnContext([ChatMessage("user", "which port does billing listen on?")], "g1")
        await mw.after_prompt(ctx, ModelOutput("Let me look that up.", tool_calls=calls))
        answer = ModelOutput("I hit my tool limit: billing listens on 8443.", tool_calls=calls)
        await mw.after_prompt(ctx, replace(answer, final=True))
        await audit.wait("add_succeeded")
        await mw.drain()
    raw = await last_turn(running, "acme", "gil", "g1")
    assert b"TOOL-CALL-77" not in raw
    turn = TurnEvent.model_validate_json(raw)
    assert [m.content for m in turn.messages] == [
        "which port does billing listen on?",
        "I hit my tool limit: billing listens on 8443.",
    ]
    assert len(audit.named("add_succeeded")) == 1


async def test_verified_tool_outcome_becomes_a_fix(running) -> None:
    """on_tool_result stores a verified outcome as a fix (or lesson_learned); an unverified
    one is not stored, and the raw tool output never is."""
    audit = Audit()
    async with running.client("acme", user="fay") as mem:
        mw = MemoryMiddleware(mem, audit=audit)
        ctx = TurnContext([ChatMessage("user", "the build fails on tzdata")], "f1")
        await mw.on_tool_result(
            ctx, ToolOutcome("pytest", "Pinning tzdata to 2024a fixed the build", verified=True)
        )
        await mw.on_tool_result(
            ctx, ToolOutcome("pytest", "Clearing the cache fixed it", verified=False)
        )
        await mw.on_tool_result(
            ctx,
            ToolOutcome(
                "ci", "Next time run the tz tests first", verified=True, kind="lesson_learned"
            ),
        )
        await mw.drain()
        (fix,) = (await mem.list_memories(types=["fix"])).memories
        (lesson,) = (await mem.list_memories(types=["lesson_learned"])).memories
        everything = (await mem.list_memories(limit=100)).memories
    assert fix.content == "Pinning tzdata to 2024a fixed the build"
    assert fix.metadata == {"source": "tool_result", "tool": "pytest"}
    assert lesson.content == "Next time run the tz tests first"
    assert not any("Clearing the cache" in m.content for m in everything)
    kinds = sorted(str(e.metadata["kind"]) for e in audit.named("add_succeeded"))
    assert kinds == ["fix", "lesson_learned"]


async def test_a_completed_turn_is_added_then_flushed_once(running) -> None:
    """After a completed run the middleware flushes the turn's session once, after the add
    succeeded (seed 000: add, then flush), in the background: the turn is recallable when
    the flush is audited, without the agent waiting or flushing itself."""
    audit = Audit()
    async with running.client("acme", user="gil") as mem:
        mw = MemoryMiddleware(mem, audit=audit)
        ctx = TurnContext([ChatMessage("user", "our staging database is called heron")], "g1")
        await mw.after_prompt(ctx, "Noted: the staging database is heron.")
        (flushed,) = await audit.wait("flush_succeeded", seconds=30)
        listed = await mem.list_memories(session="g1")
        await mw.drain()
    assert flushed.metadata == {"status": "flushed"} and flushed.session == "g1"
    assert [e.name for e in audit.events] == ["add_succeeded", "flush_succeeded"]
    assert any("heron" in m.content for m in listed.memories)


async def test_a_chat_id_names_the_session_chat_id(running) -> None:
    """A context given the host's chat id writes the turn to session chat:<id>, the session
    seed 000 adds to and the gateway searches as current_chat; a session given explicitly
    is kept as it is."""
    audit = Audit()
    async with running.client("acme", user="hob") as mem:
        mw = MemoryMiddleware(mem, audit=audit, flush_s=None)
        ctx = TurnContext(
            [ChatMessage("user", "the release train leaves on thursdays")], chat_id="42"
        )
        ctx = await mw.before_prompt(ctx)
        assert (ctx.session, ctx.chat_id) == ("chat:42", "42")
        await mw.after_prompt(ctx, "Noted: releases on Thursdays.")
        explicit = TurnContext([ChatMessage("user", "an old caller")], "legacy-1", chat_id="42")
        assert explicit.session == "legacy-1"
        assert TurnContext([ChatMessage("user", "none given")]).session == "default"
        await audit.wait("add_succeeded")
        await mw.drain()
    assert audit.named("flush_succeeded") == []  # flush_s=None: no flush
    raw = await last_turn(running, "acme", "hob", "chat:42")
    assert TurnEvent.model_validate_json(raw).session == "chat:42"


async def test_two_owners_with_the_same_turn_both_store_it(running) -> None:
    """Two users of one tenant, the same session name, host turn id and texts ("hi" ->
    "Hello!"): each turn is stored, neither acked as a duplicate of the other (the turn's id
    named no owner, and JetStream drops a repeated id across the tenant)."""
    outcomes = []
    for user in ("ann", "bo"):
        audit = Audit()
        async with running.client("acme", user=user) as mem:
            mw = MemoryMiddleware(mem, audit=audit, flush_s=None)
            ctx = TurnContext([ChatMessage("user", "hi")], "default", turn_id="1")
            await mw.after_prompt(ctx, "Hello! How can I help?")
            outcomes.append((await audit.wait("add_succeeded"))[0].metadata["duplicate"])
            await mw.drain()
            assert await mem.flush("default", within_s=30)
            listed = await mem.list_memories(limit=10)
        assert any("Hello! How can I help?" in m.content for m in listed.memories), user
    assert outcomes == [False, False]

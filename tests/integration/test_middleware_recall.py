"""MemoryMiddleware's recall into the prompt around a fake model provider, against the real
stack (NATS, Postgres, Qdrant Edge, the worker): where the recalled memory goes, which hits make
it (minimum score, top_k, token budget), and which turns ask the service at all. The model is
the only fake: a plain function."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import nats
import pytest
from agentturns import SYSTEM, Audit, run_turn

from memstream.producers import (
    ChatMessage,
    MemoryClient,
    MemoryMiddleware,
    ToolOutcome,
    TurnContext,
)
from memstream.producers.middleware import MEMORY_RULE
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration


class RecallCounter:
    """Counts requests on the recall subject: a plain (non-queue) subscriber on the whole
    namespace sees each one, in order with a probe the client sends after its turn."""

    def __init__(self, nats_url: str, namespace: str) -> None:
        self.url, self.subjects, self.count = nats_url, Subjects(namespace), 0
        self.probes: asyncio.Queue[str] = asyncio.Queue()

    async def __aenter__(self) -> RecallCounter:
        self.nc = await nats.connect(self.url)

        async def seen(msg: Any) -> None:
            if msg.subject == self.subjects.recall:
                self.count += 1
            elif msg.subject.startswith(f"{self.subjects.prefix}.probe."):
                await self.probes.put(msg.subject)

        await self.nc.subscribe(f"{self.subjects.prefix}.>", cb=seen)
        await self.nc.flush()
        return self

    async def settled(self, mem: MemoryClient) -> int:
        """The count once every request ``mem`` sent before this call has been seen."""
        probe = f"{self.subjects.prefix}.probe.{time.monotonic_ns()}"
        await mem._nc.publish(probe, b"")
        while (await asyncio.wait_for(self.probes.get(), 5)) != probe:
            pass
        return self.count

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()


async def test_recall_injects_one_reference_message(running) -> None:
    """Recalled memory arrives as one `memory` message just before the user input, outside
    the system prompt, and the system prompt carries the untrusted-data rule once."""
    audit = Audit()
    async with running.client("acme", user="ann") as mem:
        await mem.remember("My bike is locked in the garage behind the house", type="fact")
        mw = MemoryMiddleware(mem, audit=audit, min_score=0.05)
        history = [ChatMessage("user", "hello"), ChatMessage("assistant", "Hi Ann")]
        ctx, out = await run_turn(mw, "s1", history, "where is my bike?")
    roles = [m.role for m in ctx.messages]
    assert roles == ["system", "user", "assistant", "memory", "user"]
    ref = ctx.messages[3].content
    assert "My bike is locked in the garage" in ref and ref.startswith("<recalled_memory>")
    system = ctx.messages[0].content
    assert system.count(MEMORY_RULE) == 1 and "garage" not in system
    assert [r.text for r in ctx.recalled] == ["My bike is locked in the garage behind the house"]
    assert ctx.recall_reason == "session_start"
    assert out.content.endswith("with 1 memory block(s)")
    (ok,) = audit.named("recall_succeeded")
    assert ok.metadata["injected_count"] == 1 and ok.metadata["result_count"] == 1
    assert ok.metadata["added_tokens"] == -(-len(ref) // 4)  # the block, ~4 characters a token
    assert ok.metadata["context"] == "all" and ok.metadata["reason"] == "session_start"
    assert "bike" not in repr(audit.events)  # no query or memory text in audit metadata
    provider = ctx.as_provider_dicts()
    assert [d["role"] for d in provider] == ["system", "user", "assistant", "user", "user"]


async def test_min_score_top_k_and_token_budget(running) -> None:
    """Only hits at or above the calibrated minimum, at most top_k, within the budget."""
    async with running.client("acme", user="bo") as mem:
        for text in (
            "The staging database password rotates every Monday",
            "The staging database lives in the Frankfurt region",
            "The staging database backups run nightly at two",
        ):
            await mem.remember(text, type="fact")
        query = "tell me about the staging database"
        strict = await MemoryMiddleware(mem, min_score=0.99).before_prompt(
            TurnContext([ChatMessage("user", query)], "a")
        )
        assert strict.recalled == () and all(m.role != "memory" for m in strict.messages)
        top1 = await MemoryMiddleware(mem, min_score=0.0, top_k=1).before_prompt(
            TurnContext([ChatMessage("user", query)], "b")
        )
        assert len(top1.recalled) == 1
        every = await MemoryMiddleware(mem, min_score=0.0, top_k=5).before_prompt(
            TurnContext([ChatMessage("user", query)], "c")
        )
        assert len(every.recalled) == 3
        assert all(r.score is not None and r.score >= 0 for r in every.recalled)
        tight = await MemoryMiddleware(mem, min_score=0.0, top_k=5, token_budget=60).before_prompt(
            TurnContext([ChatMessage("user", query)], "d")
        )
        assert len(tight.recalled) == 1
        (ref,) = [m for m in tight.messages if m.role == "memory"]
        assert len(ref.content) <= 60 * 4  # ~4 characters a token


async def test_gates_decide_when_the_service_is_asked(running) -> None:
    """Session start, topic change and prior-work references call recall; acknowledgements,
    tool-only turns and a fresh same-topic cache hit do not (counted on the bus)."""
    audit = Audit()
    async with (
        running.client("acme", user="cy") as mem,
        RecallCounter(running.nats_url, running.settings.namespace) as calls,
    ):
        await mem.remember("The invoice service deploys with blue green rollouts", type="fact")
        await mem.remember("Cy prefers pasta carbonara for dinner", type="preference")
        mw = MemoryMiddleware(mem, audit=audit, min_score=0.1)
        steps = [
            ("how does the invoice service deploy?", "session_start", True),
            ("ok thanks", "acknowledgement", False),
            ("and the invoice service rollouts, are they blue green?", "cache_fresh", False),
            ("what should I cook for dinner tonight?", "topic_change", True),
            ("let's continue the previous task", "prior_work", True),
        ]
        history: list[ChatMessage] = []
        for text, reason, asked in steps:
            before = await calls.settled(mem)
            ctx, out = await run_turn(mw, "g1", history, text)
            assert ctx.recall_reason == reason, text
            assert (await calls.settled(mem) > before) is asked, text
            history += [ChatMessage("user", text), ChatMessage("assistant", out.content)]
        fresh = [e for e in audit.named("recall_skipped") if e.metadata["reason"] == "cache_fresh"]
        injected = fresh[0].metadata["injected_count"] if fresh else 0
        assert isinstance(injected, int) and injected >= 1  # the cached memory, again
        # a tool-only step of the tool loop: the last message is a tool result
        before = await calls.settled(mem)
        tool_ctx = TurnContext(
            [
                ChatMessage("system", SYSTEM),
                ChatMessage("user", "run the tests"),
                ChatMessage("assistant", "", tool_calls=({"id": "1", "name": "pytest"},)),
                ChatMessage("tool", "14 passed", name="pytest"),
            ],
            "g1",
        )
        tool_ctx = await mw.before_prompt(tool_ctx)
        assert tool_ctx.recall_reason == "tool_only" and await calls.settled(mem) == before
        assert all(m.role != "memory" for m in tool_ctx.messages)


async def test_a_forgotten_memory_is_not_shown_again_from_the_cache(running) -> None:
    """Recalled, then forgotten through the client: the next turn of the same topic, which
    the gates would answer from the middleware's cache, recalls again (cache_stale) and
    does not show the forgotten memory (it came back from the cache for up to 3 minutes)."""
    async with running.client("acme", user="ann") as mem:
        door = await mem.remember("Ann's front door code is 4711", type="fact")
        mw = MemoryMiddleware(mem, min_score=0.0, flush_s=None)
        history: list[ChatMessage] = []
        ctx, out = await run_turn(mw, "d1", history, "what is the front door code?")
        assert ctx.recall_reason == "session_start"
        assert [r.id for r in ctx.recalled] == [door.id]
        history += [
            ChatMessage("user", "what is the front door code?"),
            ChatMessage("assistant", out.content),
        ]
        await mem.forget(door.id)
        ctx, _ = await run_turn(mw, "d1", history, "the front door code, what is it?")
        assert ctx.recall_reason == "cache_stale"
        assert all(r.id != door.id for r in ctx.recalled)
        assert not any("4711" in m.content for m in ctx.messages if m.role == "memory")
        await mw.drain()


async def test_a_prompt_longer_than_recall_takes_recalls_for_its_end(running) -> None:
    """A 12,000-character prompt (a pasted log, then the question): recall takes at most
    10,000, so the middleware asks with the prompt's end and the fix is shown (before, the
    request was refused as bad_request and the turn went on without memory)."""
    audit = Audit()
    async with running.client("acme", user="lu") as mem:
        fix = await mem.remember("Pinning tzdata to 2024a fixed the failing build", type="fix")
        mw = MemoryMiddleware(mem, audit=audit, min_score=0.0, flush_s=None)
        log = "INFO compiling module step ok\n" * 420  # ~12,600 characters
        prompt = f"{log}the build fails on tzdata again, what fixed it?"
        ctx = await mw.before_prompt(TurnContext([ChatMessage("user", prompt)], "l1"))
        assert audit.named("recall_failed") == []
        assert fix.id in [r.id for r in ctx.recalled]


async def test_memory_off_stops_recall_publishing_and_tool_records_for_the_session(
    running,
) -> None:
    """Seed 001's /memory off, session scoped: the middleware asks recall nothing, publishes
    no turn and records no tool outcome for that session (the remember command stored one
    before), while another session goes on; memory_on brings it back."""
    audit = Audit()
    async with (
        running.client("acme", user="vi") as mem,
        RecallCounter(running.nats_url, running.settings.namespace) as calls,
    ):
        await mem.remember("Vi's staging database is called tern", type="fact")
        mw = MemoryMiddleware(mem, audit=audit, min_score=0.0, flush_s=None)
        await mw.memory_off("quiet")
        before = await calls.settled(mem)
        ctx, _ = await run_turn(mw, "quiet", [], "what is the staging database called?")
        assert ctx.recall_reason == "memory_off" and ctx.recalled == ()
        await mw.on_tool_result(ctx, ToolOutcome("psql", "Reindexing tern fixed it", True))
        await mw.drain()
        assert await calls.settled(mem) == before
        assert audit.named("add_succeeded") == [] and audit.named("add_failed") == []
        listed = await mem.list_memories(session="quiet", limit=10)
        assert listed.memories == []
        other, _ = await run_turn(mw, "loud", [], "what is the staging database called?")
        assert other.recall_reason == "session_start" and other.recalled
        await mw.memory_on("quiet")
        again, _ = await run_turn(mw, "quiet", [], "what is the staging database called?")
        assert again.recall_reason == "session_start" and again.recalled
        await mw.drain()
    subjects = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        info = await nc.jetstream().stream_info(
            subjects.stream("turns"), subjects_filter=subjects.turns("acme", "vi", "quiet")
        )
    finally:
        await nc.close()
    quiet = subjects.turns("acme", "vi", "quiet")
    assert info.state.subjects == {quiet: 1}  # the turn after memory_on only


async def test_a_tool_step_keeps_the_memories_its_turn_showed(running) -> None:
    """A tool loop: the turn's first step recalls and shows a memory; the next step (the
    context so far, a tool call and its result) asks recall nothing and still shows it to
    the model (it was dropped half way through the turn it was recalled for)."""
    async with (
        running.client("acme", user="kit") as mem,
        RecallCounter(running.nats_url, running.settings.namespace) as calls,
    ):
        fix = await mem.remember("Pinning tzdata to 2024a fixed the failing build", type="fix")
        mw = MemoryMiddleware(mem, min_score=0.0, flush_s=None)
        first = await mw.before_prompt(
            TurnContext([ChatMessage("user", "the build fails on tzdata, what now?")], "t1")
        )
        assert [r.id for r in first.recalled] == [fix.id]
        before = await calls.settled(mem)
        step = await mw.before_prompt(
            TurnContext(
                [
                    *first.messages,
                    ChatMessage("assistant", "", tool_calls=({"id": "c1", "name": "pytest"},)),
                    ChatMessage("tool", "3 failed", name="pytest", tool_call_id="c1"),
                ],
                "t1",
                turn_id=first.turn_id,
                recalled=first.recalled,
            )
        )
        assert step.recall_reason == "tool_only" and await calls.settled(mem) == before
        shown = [m.content for m in step.messages if m.role == "memory"]
        assert len(shown) == 1 and "tzdata to 2024a" in shown[0]
        assert step.recalled == first.recalled


async def test_a_degraded_reply_is_injected_as_keyword_matches(running) -> None:
    """With the vector index away, recall answers from Postgres' keyword search (seed 001's
    fallback): its hits have no calibrated score, and the middleware injects them anyway,
    marked as keyword matches, unless told not to (``keep_degraded=False``)."""
    audit = Audit()
    async with running.client("acme", user="di") as mem:
        await mem.remember("Di parks the red scooter in the basement garage", type="fact")
        await running.worker.recall_off()
        try:
            async with running.worker.standby_recall():  # answered as in an index outage
                ctx = await MemoryMiddleware(mem, audit=audit).before_prompt(
                    TurnContext([ChatMessage("user", "where is the red scooter parked?")], "a")
                )
                strict = await MemoryMiddleware(mem, keep_degraded=False).before_prompt(
                    TurnContext([ChatMessage("user", "is the red scooter in the garage?")], "b")
                )
        finally:
            await running.worker.recall_on()
    (ok,) = audit.named("recall_succeeded")
    assert ok.metadata["degraded"] == ["vector_index"]
    assert [(r.text, r.score) for r in ctx.recalled] == [
        ("Di parks the red scooter in the basement garage", None)
    ]
    (ref,) = [m for m in ctx.messages if m.role == "memory"]
    assert "(fact, keyword match) Di parks the red scooter" in ref.content
    assert strict.recalled == () and all(m.role != "memory" for m in strict.messages)

"""MemoryMiddleware around a fake model provider, against the real stack (NATS, Postgres,
Qdrant Edge, the worker). The model is the only fake: a plain function."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats
import pytest

from memstream.consumers.embedded import free_port
from memstream.producers import (
    AuditEvent,
    ChatMessage,
    MemoryClient,
    MemoryMiddleware,
    ModelOutput,
    ToolOutcome,
    TurnContext,
)
from memstream.producers.middleware import MEMORY_RULE
from memstream.schemas.events import TurnEvent
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration

SYSTEM = "You are Beaver. SYSTEM-SECRET-7731 is the operator's note."


async def model(ctx: TurnContext) -> ModelOutput:
    """The fake provider: its answer depends on everything it was given."""
    memory = [m for m in ctx.messages if m.role == "memory"]
    roles = ",".join(m.role for m in ctx.messages if m.role != "memory")
    return ModelOutput(
        f"Answer to '{ctx.user_input}' from {roles} with {len(memory)} memory block(s)",
        reasoning="REASONING-SECRET-99 thinking about it",
    )


class Audit:
    """Collects audit events; ``wait`` blocks until one named so arrives (with a timeout)."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []
        self._arrived = asyncio.Event()

    def __call__(self, event: AuditEvent) -> None:
        self.events.append(event)
        self._arrived.set()

    def named(self, name: str) -> list[AuditEvent]:
        return [e for e in self.events if e.name == name]

    async def wait(self, name: str, count: int = 1, seconds: float = 20.0) -> list[AuditEvent]:
        deadline = time.monotonic() + seconds
        while len(self.named(name)) < count:
            self._arrived.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {name} audit event within {seconds} s: {self.events}")
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                continue
        return self.named(name)


async def run_turn(
    mw: MemoryMiddleware | None, session: str, history: list[ChatMessage], text: str
) -> tuple[TurnContext, ModelOutput]:
    """One agent turn: before_prompt, the model, after_prompt."""
    ctx = TurnContext([ChatMessage("system", SYSTEM), *history, ChatMessage("user", text)], session)
    if mw is not None:
        ctx = await mw.before_prompt(ctx)
    out = await model(ctx)
    if mw is not None:
        await mw.after_prompt(ctx, out)
    return ctx, out


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
        assert all(r.score >= 0 for r in every.recalled)
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
    subjects = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        raw = await nc.jetstream().get_last_msg(
            subjects.stream("turns"), subjects.turns("acme", "dee", "t1")
        )
    finally:
        await nc.close()
    assert raw.data is not None
    turn = TurnEvent.model_validate_json(raw.data)
    assert [(m.role.value, m.content) for m in turn.messages] == [
        ("user", "where does the deploy key live?"),
        ("assistant", "The deploy key is in the vault."),
    ]
    everything = json.dumps([m.model_dump(mode="json") for m in listed.memories])
    for secret in ("TOOL-RESULT-42", "TOOL-CALL-5", "SYSTEM-SECRET", "REASONING-SECRET"):
        assert secret not in everything and secret not in raw.data.decode()
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


async def test_unreachable_service_changes_nothing(running) -> None:
    """With NATS unreachable the run's result is the one of a run without memories, within
    the recall deadline, and the failures are audited by category only."""
    async with running.client("acme", user="gus") as healthy:
        _, baseline = await run_turn(MemoryMiddleware(healthy), "o1", [], "plan my week")
    audit = Audit()
    down = MemoryClient(
        "acme", user="gus", nats_url=f"nats://127.0.0.1:{free_port()}", connect_timeout=0.2
    )
    mw = MemoryMiddleware(down, audit=audit, deadline_s=0.5)
    started = time.monotonic()
    ctx, out = await run_turn(mw, "o1", [], "plan my week")
    assert time.monotonic() - started < 1.5
    assert out == baseline
    assert ctx.recalled == () and ctx.messages[0].content.endswith(MEMORY_RULE)
    (failed,) = audit.named("recall_failed")
    assert failed.metadata["category"] in {"unavailable", "deadline"}
    (add_failed,) = await audit.wait("add_failed")
    assert add_failed.metadata == {"operation": "add", "category": "unavailable", "kind": "turn"}
    assert "127.0.0.1" not in repr(audit.events) and "plan my week" not in repr(audit.events)
    await down.close()


async def test_stalled_service_costs_at_most_the_deadline(running) -> None:
    """A recall responder that never answers costs the turn at most the deadline, and the
    result is the one of a run without memories."""
    # the client alone would wait 5 s for a reply: the middleware's deadline is what cuts it
    async with running.client("acme", user="hal", recall_timeout=5.0) as mem:
        _, baseline = await run_turn(MemoryMiddleware(mem), "w1", [], "summarise the report")
        stall = await nats.connect(running.nats_url)  # takes every request, answers none
        await stall.subscribe(Subjects(running.settings.namespace).recall)
        await running.worker.stop()  # only the silent subscriber is left on the subject
        audit = Audit()
        mw = MemoryMiddleware(mem, audit=audit, deadline_s=0.3)
        started = time.monotonic()
        _, out = await run_turn(mw, "w2", [], "summarise the report")
        elapsed = time.monotonic() - started
        await stall.close()
    assert out == baseline and elapsed < 0.3 + 1.0
    assert [e.metadata["category"] for e in audit.named("recall_failed")] == ["deadline"]


async def test_stopped_workers_change_nothing(running) -> None:
    """With the workers stopped (NATS up, nobody answering recall) the turn completes with
    the same result, the failure audited as `unavailable`, and the turn is still published."""
    async with running.client("acme", user="ian") as mem:
        _, baseline = await run_turn(MemoryMiddleware(mem), "v1", [], "summarise the report")
        await running.worker.stop()
        audit = Audit()
        _, out = await run_turn(
            MemoryMiddleware(mem, audit=audit), "v2", [], "summarise the report"
        )
        assert out == baseline
        assert [e.metadata["category"] for e in audit.named("recall_failed")] == ["unavailable"]
        await audit.wait("add_succeeded")  # JetStream keeps it for the workers' return


async def test_audit_holds_no_key_and_a_failing_sink_is_ignored(running) -> None:
    """A rejected key shows up as the category `unauthorized`, never the key; an audit
    callback that raises changes nothing in the run."""
    key = "msk_secret_value_1234567890"
    audit = Audit()
    async with running.client("acme", user="ida", api_key=key) as mem:
        mw = MemoryMiddleware(mem, audit=audit)
        await run_turn(mw, "k1", [], "what did we decide about caching?")
    (failed,) = audit.named("recall_failed")
    assert failed.metadata == {"operation": "recall", "category": "unauthorized"}
    assert key not in repr(audit.events) and key[4:12] not in repr(audit.events)

    def broken(event: AuditEvent) -> None:
        raise RuntimeError("audit sink down")

    async with running.client("acme", user="ida") as mem:
        _, plain = await run_turn(MemoryMiddleware(mem), "k2", [], "hello caching")
        _, out = await run_turn(MemoryMiddleware(mem, audit=broken), "k3", [], "hello caching")
    assert out == plain

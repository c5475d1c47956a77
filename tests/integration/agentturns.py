"""Helpers for the MemoryMiddleware tests: the fake model provider (a plain function), an audit
sink a test can wait on, and one agent turn through the middleware."""

from __future__ import annotations

import asyncio
import time

from memstream.producers import (
    AuditEvent,
    ChatMessage,
    MemoryMiddleware,
    ModelOutput,
    TurnContext,
)

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

"""A chat loop with MemoryMiddleware: recall before each model call, persist after it.

    make run                                               # in one terminal
    .venv/bin/python examples/02_middleware_chat_loop.py   # a scripted conversation
    .venv/bin/python examples/02_middleware_chat_loop.py -i  # type your own turns

`model` stands in for your provider. With an OpenAI-compatible client it would be:

    reply = await openai.chat.completions.create(model=..., messages=ctx.as_provider_dicts())
    return ModelOutput(reply.choices[0].message.content or "")
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

from memstream.producers import (
    AuditEvent,
    ChatMessage,
    MemoryClient,
    MemoryMiddleware,
    ModelOutput,
    TurnContext,
)

SESSION = "example-02"
SCRIPT = [
    "I always deploy the billing service with blue green rollouts",
    "ok thanks",
    "How should I deploy the billing service?",
]


async def model(ctx: TurnContext) -> ModelOutput:
    """A stand-in provider: answers from the recalled memory when there is one."""
    memory = next((m.content for m in ctx.messages if m.role == "memory"), None)
    if memory is None:
        return ModelOutput(f"Noted: {ctx.user_input}")
    first = next(line for line in memory.splitlines() if line.startswith("[1]"))
    return ModelOutput(f"From what I remember: {first.split(') ', 1)[1]}")


def typed() -> Iterator[str]:
    """Lines typed at the prompt, until an empty line or end of input."""
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            return
        if not line:
            return
        yield line


def audit(event: AuditEvent) -> None:
    print(f"    audit: {event.name} {event.metadata}")


async def main(interactive: bool) -> None:
    system = ChatMessage("system", "You are a helpful assistant.")
    history: list[ChatMessage] = []
    async with MemoryClient("default", user="bob") as mem:
        mw = MemoryMiddleware(mem, audit=audit, min_score=0.1)
        for text in typed() if interactive else SCRIPT:
            print(f"user: {text}")
            ctx = TurnContext([system, *history, ChatMessage("user", text)], session=SESSION)
            ctx = await mw.before_prompt(ctx)
            print(f"    recall: {ctx.recall_reason}, {len(ctx.recalled)} memory(ies) injected")
            out = await model(ctx)
            await mw.after_prompt(ctx, out)
            print(f"assistant: {out.content}")
            history += [ChatMessage("user", text), ChatMessage("assistant", out.content)]
            if not interactive:
                # a real chat has seconds between turns; a script waits until the turn is
                # processed, so that the next turn can recall it
                await mem.flush(SESSION, within_s=30)
        await mw.drain()  # the last turn's publish and flush, before the client closes


if __name__ == "__main__":
    asyncio.run(main("-i" in sys.argv[1:]))

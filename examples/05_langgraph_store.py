"""A LangGraph graph whose long-term memory is memstream (MemstreamStore).

    pip install 'memstream[langgraph]'                  # make install includes it
    make run                                            # in one terminal
    .venv/bin/python examples/05_langgraph_store.py

One node stores what the user asks it to remember under ("users", <user>, "memories"); the
next answers with a semantic search over that user's namespace.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore

from memstream.producers import MemoryClient
from memstream.producers.langgraph_store import MemstreamStore


class State(TypedDict, total=False):
    user: str
    message: str
    reply: str


async def remember(state: State, *, store: BaseStore) -> State:
    text = state["message"]
    if text.lower().startswith("remember:"):
        fact = text.split(":", 1)[1].strip()
        key = hashlib.sha256(fact.encode()).hexdigest()[:16]
        await store.aput(("users", state["user"], "memories"), key, {"text": fact})
    return {}


async def answer(state: State, *, store: BaseStore) -> State:
    if state["message"].lower().startswith("remember:"):
        return {"reply": "Noted."}
    hits = await store.asearch(("users", state["user"]), query=state["message"], limit=2)
    if not hits:
        return {"reply": "I don't know yet."}
    return {"reply": f"You told me: {hits[0].value['text']} (score {hits[0].score:.2f})"}


def build(store: BaseStore):  # type: ignore[no-untyped-def]
    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_node("answer", answer)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "answer")
    graph.add_edge("answer", END)
    return graph.compile(store=store)


async def main() -> None:
    async with MemoryClient("default", user="carol") as mem:
        store = MemstreamStore(mem)
        graph = build(store)
        for message in ("remember: my cat sleeps on the blue sofa", "where does my cat sleep?"):
            out = await graph.ainvoke({"user": "carol", "message": message})
            print(f"carol: {message}\ngraph: {out['reply']}")
        print("namespaces:", await store.alist_namespaces(prefix=("users", "carol")))


if __name__ == "__main__":
    asyncio.run(main())

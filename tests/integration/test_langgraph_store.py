"""MemstreamStore through langgraph's own BaseStore interface and a compiled StateGraph,
against the real stack (NATS, Postgres, Qdrant Edge, the worker)."""

from __future__ import annotations

import asyncio
from typing import TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, InvalidNamespaceError

from memstream.producers import SyncMemoryClient
from memstream.producers.langgraph_store import MemstreamStore
from memstream.schemas.memory import MemoryRecord

pytestmark = pytest.mark.integration

LENA = ("users", "lena", "memories")


async def test_put_get_update_delete(running) -> None:
    """An item round-trips; an update replaces it (one memory per key); a put that changes
    nothing keeps it; delete removes it, and the same value can be put again."""
    async with running.client("acme", user="lena") as mem:
        store: BaseStore = MemstreamStore(mem)
        assert await store.aget(LENA, "tea") is None
        await store.aput(LENA, "tea", {"text": "Lena drinks green tea", "rating": 5})
        item = await store.aget(LENA, "tea")
        assert item is not None
        assert (item.namespace, item.key) == (LENA, "tea")
        assert item.value == {"text": "Lena drinks green tea", "rating": 5}
        assert item.created_at <= item.updated_at

        await store.aput(LENA, "tea", {"text": "Lena switched to black tea", "rating": 3})
        updated = await store.aget(LENA, "tea")
        assert updated is not None and updated.value["text"] == "Lena switched to black tea"
        assert updated.created_at == item.created_at and updated.updated_at > item.updated_at
        listed = (await mem.list_memories(types=["fact"])).memories
        assert [m.content for m in listed] == ["Lena switched to black tea"]

        await store.aput(LENA, "tea", {"text": "Lena switched to black tea", "rating": 3})
        same = await store.aget(LENA, "tea")
        assert same == updated  # nothing changed, not even the timestamps

        await store.aput(LENA, "tea", {"text": "Lena switched to black tea", "rating": 4})
        rated = await store.aget(LENA, "tea")
        assert rated is not None and rated.value["rating"] == 4  # same text, new value

        await store.adelete(LENA, "tea")
        assert await store.aget(LENA, "tea") is None
        assert (await mem.list_memories(types=["fact"])).memories == []
        await store.aput(LENA, "tea", {"text": "Lena drinks green tea", "rating": 5})
        back = await store.aget(LENA, "tea")
        assert back is not None and back.value["rating"] == 5
        # values are stored redacted, like every memory
        await store.aput(LENA, "mail", {"text": "Lena's address is lena@example.com"})
        mail = await store.aget(LENA, "mail")
        assert mail is not None and "lena@example.com" not in mail.value["text"]
        assert "[EMAIL:" in mail.value["text"]


async def test_same_text_under_two_keys(running) -> None:
    """Two keys with the same text are two items (memstream's exact dedupe does not merge
    them)."""
    async with running.client("acme", user="lena") as mem:
        store = MemstreamStore(mem)
        await store.aput(LENA, "a", {"text": "Standup is at nine"})
        await store.aput(LENA, "b", {"text": "Standup is at nine"})
        a, b = await store.aget(LENA, "a"), await store.aget(LENA, "b")
        assert a is not None and b is not None and a.key == "a" and b.key == "b"
        await store.adelete(LENA, "a")
        assert await store.aget(LENA, "a") is None and await store.aget(LENA, "b") is not None


async def test_search_with_query_filter_and_pages(running) -> None:
    """Search ranks by the query within the namespace prefix, filters on value fields,
    pages with limit/offset, and never crosses into another owner's namespace."""
    async with running.client("acme", user="lena") as mem:
        store = MemstreamStore(mem)
        await store.aput(LENA, "tea", {"text": "Lena drinks green tea every morning", "n": 5})
        await store.aput(LENA, "bike", {"text": "Lena rides a red bike to work", "n": 2})
        await store.aput(("users", "lena", "notes"), "gym", {"text": "Gym on Tuesdays", "n": 4})
        await store.aput(("users", "max", "memories"), "tea", {"text": "Max drinks tea too"})
        hits = await store.asearch(("users", "lena"), query="what does lena drink?")
        assert hits[0].key == "tea" and hits[0].namespace == LENA
        assert hits[0].score is not None and 0 < hits[0].score <= 1
        assert {h.value["text"] for h in hits} <= {
            "Lena drinks green tea every morning",
            "Lena rides a red bike to work",
            "Gym on Tuesdays",
        }
        everything = await store.asearch(("users", "lena"), limit=10)
        assert {h.key for h in everything} == {"tea", "bike", "gym"}
        assert all(h.score is None for h in everything)
        only_memories = await store.asearch(LENA, limit=10)
        assert {h.key for h in only_memories} == {"tea", "bike"}
        rated = await store.asearch(("users", "lena"), filter={"n": {"$gte": 4}})
        assert {h.key for h in rated} == {"tea", "gym"}
        exact = await store.asearch(("users", "lena"), query="tea", filter={"n": 2})
        assert [h.key for h in exact] == ["bike"]
        page1 = await store.asearch(("users", "lena"), limit=2)
        page2 = await store.asearch(("users", "lena"), limit=2, offset=2)
        assert len(page1) == 2 and len(page2) == 1
        assert {h.key for h in page1 + page2} == {"tea", "bike", "gym"}
        max_hits = await store.asearch(("users", "max"), query="tea")
        assert [h.value["text"] for h in max_hits] == ["Max drinks tea too"]


async def test_namespaces_map_to_owners_and_scopes(running) -> None:
    """("users", U) is user U's memory, ("agents", A) agent A's, ("global", ...) is shared
    with the tenant; list_namespaces honours prefix, suffix and max_depth."""
    async with running.client("acme", user="lena") as mem:
        store = MemstreamStore(mem)
        await store.aput(("users", "max", "memories"), "k1", {"text": "Max likes chess"})
        await store.aput(("agents", "planner", "skills"), "k2", {"text": "Plan in small steps"})
        await store.aput(("global", "faq"), "k3", {"text": "Office closes at six"})
        await store.aput(("users", "lena", "memories", "work"), "k4", {"text": "Lena codes Rust"})
        async with running.client("acme", user="max") as as_max:
            own: list[MemoryRecord] = []
            shared_rows: list[MemoryRecord] = []
            for m in (await as_max.list_memories()).memories:
                (own if m.scope.value == "user" else shared_rows).append(m)
            assert [(m.content, m.user) for m in own] == [("Max likes chess", "max")]
            assert [(m.content, m.scope.value) for m in shared_rows] == [
                ("Office closes at six", "global")
            ]
            # the global item is shared: another owner's store finds it
            shared = await MemstreamStore(as_max).asearch(("global",), query="office closes")
            assert [h.key for h in shared] == ["k3"]
        async with running.client("acme", agent="planner") as as_agent:
            (skill,) = (await as_agent.list_memories(scopes=["user"])).memories
            assert (skill.content, skill.agent, skill.user) == (
                "Plan in small steps",
                "planner",
                None,
            )
        (faq,) = [m for m in (await mem.list_memories()).memories if m.scope.value == "global"]
        assert faq.user == "lena"
        assert await store.alist_namespaces(prefix=("users", "lena")) == [
            ("users", "lena", "memories", "work")
        ]
        assert await store.alist_namespaces(prefix=("users", "lena"), max_depth=3) == [
            ("users", "lena", "memories")
        ]
        assert await store.alist_namespaces(suffix=("faq",)) == [("global", "faq")]
        assert await store.alist_namespaces(prefix=("users", "max")) == [
            ("users", "max", "memories")
        ]
        with pytest.raises(InvalidNamespaceError):
            await store.aput(("users", "a.b"), "k", {"text": "x"})


async def test_sync_methods_with_a_sync_client(running) -> None:
    """With a SyncMemoryClient the blocking methods work (as a sync LangGraph agent calls
    them)."""

    def use() -> tuple[object, ...]:
        client = SyncMemoryClient(
            "acme", user="sam", nats_url=running.nats_url, namespace=running.settings.namespace
        )
        try:
            store = MemstreamStore(client)
            store.put(("users", "sam", "memories"), "lang", {"text": "Sam writes Go"})
            got = store.get(("users", "sam", "memories"), "lang")
            found = store.search(("users", "sam"), query="which language does Sam write?")
            spaces = store.list_namespaces(prefix=("users", "sam"))
            store.delete(("users", "sam", "memories"), "lang")
            gone = store.get(("users", "sam", "memories"), "lang")
            return got.value if got else None, [h.key for h in found], spaces, gone
        finally:
            client.close()

    value, keys, spaces, gone = await asyncio.to_thread(use)
    assert value == {"text": "Sam writes Go"} and keys == ["lang"]
    assert spaces == [("users", "sam", "memories")] and gone is None


class State(TypedDict, total=False):
    user: str
    message: str
    reply: str


async def test_a_compiled_graph_uses_the_store(running) -> None:
    """A StateGraph compiled with the store: one node remembers what the user said (async),
    the next (sync, run in a thread by langgraph) answers from a search."""

    async def remember(state: State, *, store: BaseStore) -> dict[str, str]:
        ns = ("users", state["user"], "memories")
        await store.aput(ns, f"m{len(state['message'])}", {"text": state["message"]})
        return {}

    def answer(state: State, *, store: BaseStore) -> dict[str, str]:
        hits = store.search(("users", state["user"]), query=state["message"], limit=3)
        return {"reply": " | ".join(h.value["text"] for h in hits)}

    async with running.client("acme", user="zed") as mem:
        builder = StateGraph(State)
        builder.add_node("remember", remember)
        builder.add_node("answer", answer)
        builder.add_edge(START, "remember")
        builder.add_edge("remember", "answer")
        builder.add_edge("answer", END)
        graph = builder.compile(store=MemstreamStore(mem))
        first = await graph.ainvoke(State(user="zed", message="Zed's cat sleeps on the blue sofa"))
        second = await graph.ainvoke(State(user="zed", message="where does the cat sleep?"))
    assert first["reply"] == "Zed's cat sleeps on the blue sofa"
    assert second["reply"].split(" | ")[0] in {
        "Zed's cat sleeps on the blue sofa",
        "where does the cat sleep?",
    }
    assert "Zed's cat sleeps on the blue sofa" in second["reply"]

"""A LangGraph ``BaseStore`` over memstream (``pip install memstream[langgraph]``).

    store = MemstreamStore(MemoryClient("acme", user="alice"))
    await store.aput(("users", "alice", "memories"), "tea", {"text": "Alice drinks green tea"})
    item = await store.aget(("users", "alice", "memories"), "tea")
    hits = await store.asearch(("users", "alice"), query="what does alice drink?")

Every item is one memstream memory; how namespaces map to owners and scopes, and how an item
rides in a memory, is in ``langgraph_items``. The tenant is always the client's, and a client
with an API key bound to one owner can use only that owner's namespaces (others are refused by
the workers).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from memstream.producers.client import CommandError, MemoryClient
from memstream.producers.langgraph_items import (
    MARK,
    Where,
    is_current,
    key_tag,
    meta_of,
    namespace_matches,
    prefix_tag,
    stamp,
    text_at,
    to_item,
    to_search_item,
    until_wildcard,
    value_matches,
    where,
)
from memstream.producers.sync import SyncMemoryClient
from memstream.schemas.errors import ErrorCode
from memstream.schemas.memory import MemoryRecord, MemoryType
from memstream.schemas.recall import Hit

__all__ = ["MemstreamStore", "Where", "where"]

_TEXT_FIELDS = ("content", "text", "memory", "data")
_PAGE = 100


class MemstreamStore(BaseStore):
    """LangGraph's long-term memory store, kept by memstream.

    ``client``: a ``MemoryClient`` (async code; the sync methods work from other threads
    than its event loop, as LangGraph runs sync nodes) or a ``SyncMemoryClient`` (any code).
    ``index_fields``: the value fields whose text is searched (default: ``content``, ``text``,
    ``memory`` or ``data`` if the value has one as a string, else the whole value as JSON).
    ``memory_type``: the memstream type items are stored as.
    """

    __slots__ = ("_cache", "_client", "_index", "_loop", "_type")

    def __init__(
        self,
        client: MemoryClient | SyncMemoryClient,
        *,
        index_fields: Sequence[str] | None = None,
        memory_type: str = "fact",
    ) -> None:
        self._loop: asyncio.AbstractEventLoop | None
        if isinstance(client, SyncMemoryClient):
            self._client, self._loop = client._client, client._loop
        else:
            self._client = client
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                self._loop = None  # set at the first async call
        self._index = tuple(index_fields) if index_fields else None
        self._type = MemoryType(memory_type).value  # a wrong type fails here, at start
        self._cache: dict[tuple[str | None, str | None], MemoryClient] = {}

    # --- the two abstract methods -------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations on the client's event loop, from another thread."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the store's client has no event loop yet: use the async methods")
        if _on_loop_thread(loop):
            raise RuntimeError(
                "synchronous store calls from the client's event loop would block it: use "
                "the async methods (aget, aput, asearch ...) or a SyncMemoryClient"
            )
        return asyncio.run_coroutine_threadsafe(self._abatch(list(ops)), loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order (a later put of the same key wins)."""
        ops = list(ops)
        running = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = running
        if running is self._loop:
            return await self._abatch(ops)
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self._abatch(ops), self._loop)
        )

    async def _abatch(self, ops: list[Op]) -> list[Result]:
        results: list[Result] = []
        for op in ops:
            validate_op_namespace(op)
            if isinstance(op, GetOp):
                results.append(await self._get(op))
            elif isinstance(op, PutOp):
                await self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._list_namespaces(op))
            else:
                raise TypeError(f"unknown operation {type(op).__name__}")
        return results

    # --- operations -------------------------------------------------------------------------

    def _owner(self, w: Where) -> MemoryClient:
        c = self._client
        if w.user is None and w.agent is None:
            return c
        if (w.user, w.agent) == (c.user, c.agent):
            return c
        scoped = self._cache.get((w.user, w.agent))
        if scoped is None:
            scoped = c.scoped(c.tenant, user=w.user, agent=w.agent, api_key=c._api_key)
            self._cache[(w.user, w.agent)] = scoped
        return scoped

    async def _find(self, ns: tuple[str, ...], key: str) -> list[MemoryRecord | Hit]:
        """The memories holding (ns, key): by tag through recall; by listing when recall
        answered degraded (the keyword-only or Postgres fallback may not match the key)."""
        w = where(ns)
        client, tag = self._owner(w), key_tag(ns, key)
        reply = await client.recall(
            key[:1000] or "item",
            tags=[tag],
            top_k=10,
            cache=False,
            project=w.project,
            method="vector",
        )
        if not reply.degraded:
            return [h for h in reply.hits if tag in h.tags]
        return [m for m in await self._records(client, w) if tag in m.tags]

    async def _records(self, client: MemoryClient, w: Where) -> list[MemoryRecord]:
        """Every item-typed memory the owner can read (pages of 100)."""
        out: list[MemoryRecord] = []
        offset: int | None = 0
        while offset is not None:
            page = await client.command(
                "list", types=[self._type], limit=_PAGE, offset=offset, project=w.project
            )
            out.extend(m for m in page.memories if MARK in m.tags)
            offset = page.next_offset
        return out

    async def _get(self, op: GetOp) -> Item | None:
        found = await self._find(op.namespace, op.key)
        if not found:
            return None
        newest = max(found, key=lambda m: stamp(m, "updated"))
        return to_item(newest, op.namespace, op.key)

    async def _put(self, op: PutOp) -> None:
        ns, w = op.namespace, where(op.namespace)
        client = self._owner(w)
        old = await self._find(ns, op.key)
        if op.value is None:
            for m in old:
                await _forget(client, m.id)
            return
        value = dict(op.value)
        now = datetime.now(UTC).timestamp()
        created = min((stamp(m, "created") for m in old), default=now)
        meta = {
            MARK: {
                "namespace": list(ns),
                "key": op.key,
                "value": value,
                "created": created,  # the client's clock, epoch seconds (numbers are never
                "updated": now,  # redacted; the store's clock is not the agent's)
            }
        }
        text = self._text(value, op.index)
        tags = [MARK, *(prefix_tag(ns[:i]) for i in range(1, len(ns) + 1)), key_tag(ns, op.key)]
        fields = {
            "type": self._type,
            "scope": w.scope,
            "project": w.project,
            "session": MARK,
            "metadata": meta,
            "tags": tags,
            # an item is found by its key: folded into another item's memory it would be lost
            "fold_near_duplicates": False,
        }
        reply = await client.command("remember", content=text, **fields)
        record = reply.memory  # None: the same text was stored and deleted before
        if record is None or (reply.detail.get("duplicate") and not is_current(record, meta)):
            # the same text is stored already (another key, an earlier version, a deleted
            # item) and memstream keeps one memory per text: this version gets its own text
            suffix = uuid.uuid4().hex[:8]
            reply = await client.command("remember", content=f"{text} ({suffix})", **fields)
            record = reply.memory
        if record is None:
            raise CommandError(ErrorCode.INTERNAL, "the reply holds no memory")
        for m in old:
            if m.id != record.id:
                await _forget(client, m.id)

    def _text(self, value: Mapping[str, Any], index: Any) -> str:
        fields = list(index) if isinstance(index, list) else self._index
        if index is False:
            return " ".join(str(k) for k in value) or "item"
        if fields:
            parts = [text_at(value, f) for f in fields]
            text = " ".join(p for p in parts if p)
            if text.strip():
                return text
        for f in _TEXT_FIELDS:
            v = value.get(f)
            if isinstance(v, str) and v.strip():
                return v
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = op.namespace_prefix
        w = where(prefix)
        client = self._owner(w)
        tag = prefix_tag(prefix) if prefix else MARK
        items: list[SearchItem] = []
        if op.query:
            want = 100 if op.filter else min(100, op.limit + op.offset)
            reply = await client.recall(
                op.query, tags=[tag], top_k=want, cache=False, project=w.project
            )
            for h in reply.hits:
                if tag in h.tags and MARK in h.tags:
                    score = h.calibrated if h.calibrated is not None else h.score
                    items.append(to_search_item(h, score))
        else:
            records = [m for m in await self._records(client, w) if tag in m.tags]
            records.sort(key=lambda m: stamp(m, "updated"), reverse=True)
            items = [to_search_item(m, None) for m in records]
        if op.filter:
            items = [i for i in items if value_matches(i.value, op.filter)]
        return items[op.offset : op.offset + op.limit]

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = tuple(op.match_conditions or ())
        prefix = next((c.path for c in conditions if c.match_type == "prefix"), ())
        concrete = tuple(p for p in until_wildcard(prefix))
        w = where(concrete) if concrete else Where(None, None, "user", None)
        found: set[tuple[str, ...]] = set()
        for m in await self._records(self._owner(w), w):
            ns = tuple(str(x) for x in meta_of(m).get("namespace", ()))
            if ns and all(namespace_matches(c, ns) for c in conditions):
                found.add(ns[: op.max_depth] if op.max_depth is not None else ns)
        return sorted(found)[op.offset : op.offset + op.limit]


# --- helpers -----------------------------------------------------------------------------------


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return getattr(loop, "_thread_id", None) == threading.get_ident()


async def _forget(client: MemoryClient, memory_id: str) -> None:
    try:
        await client.forget(memory_id)
    except CommandError as exc:
        if exc.code is not ErrorCode.NOT_FOUND:  # gone already: what was asked
            raise

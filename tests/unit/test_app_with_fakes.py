"""Application tests with no server: command handling, credentials and the reconciler over
the in-memory MemoryStore (held to PgStore's contract by tests/contract) and a Qdrant Edge
shard in a temp dir. Only the command verbs that publish nothing run here (no bus)."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from memstream.consumers import indexing
from memstream.consumers.app import Worker
from memstream.consumers.auth import Authenticator
from memstream.consumers.commands import CommandService
from memstream.consumers.recall import RecallService
from memstream.consumers.remember import remember as apply_remember
from memstream.consumers.services import Services
from memstream.consumers.stages import Deps
from memstream.pipeline.redact import Redactor
from memstream.schemas.commands import RememberRequest
from memstream.schemas.memory import Candidate, MemoryType, Owner, Scope
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import Subjects
from memstream.storage.embedding import make_embedder
from memstream.storage.memory import MemoryStore
from memstream.storage.pg.sql import OwnerFilter
from memstream.storage.ports import VectorFilter
from memstream.storage.qdrant_edge import EdgeVectorIndex

NOW = datetime(2026, 1, 5, 12, tzinfo=UTC)


@pytest.fixture(scope="module")
def embedder():
    return make_embedder(None, None)


@pytest.fixture
async def services(tmp_path: Path, embedder):
    vectors = EdgeVectorIndex(tmp_path / "shard")
    await vectors.ensure(embedder.dim)
    store = MemoryStore(clock=lambda: NOW)
    yield Services(Settings(state_dir=tmp_path), store, vectors, embedder, Redactor(key=b"k"))
    await vectors.close()


def commands(services: Services, required: bool = False) -> CommandService:
    # no bus: the verbs exercised here publish nothing, so no JetStream context is needed
    deps = Deps(services, Subjects("t"), cast(Any, None))
    auth = Authenticator(services.store, required)
    return CommandService(deps, RecallService(services), auth)


async def put(store: MemoryStore, content: str, user: str | None = "ann", **kw: Any) -> str:
    mid = str(uuid.uuid4())
    c = Candidate(
        candidate_id=mid,
        owner=Owner(tenant="acme", user=user),
        session="s1",
        content=content,
        source_event_id=f"e-{mid}",
        occurred_at=NOW,
        **kw,
    )
    await store.upsert(mid, content, c)
    return mid


def reply(raw: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(raw)
    return out


async def test_list_shows_own_and_shared_memories_only(services: Services) -> None:
    """``list`` answers the caller's memories and the tenant's global ones, never another
    owner's."""
    store = cast(MemoryStore, services.store)
    own = await put(store, "tea with lemon")
    glob = await put(store, "office closes at six", user="bob", scope=Scope.GLOBAL)
    await put(store, "bob's secret plan", user="bob")
    out = reply(await commands(services).handle("list", b'{"tenant": "acme", "user": "ann"}'))
    assert {m["id"] for m in out["memories"]} == {own, glob}


async def test_get_of_another_owners_memory_is_not_found(services: Services) -> None:
    """An id of another owner's memory answers not_found, exactly like a missing id."""
    store = cast(MemoryStore, services.store)
    theirs = await put(store, "bob's note", user="bob")
    body = json.dumps({"tenant": "acme", "user": "ann", "id": theirs}).encode()
    out = reply(await commands(services).handle("get", body))
    assert out["error"]["code"] == "not_found"


async def test_malformed_request_is_a_bad_request(services: Services) -> None:
    """A request that does not decode gets bad_request and never reaches the store."""
    out = reply(await commands(services).handle("list", b'{"tenant": "acme", "limit": 0}'))
    assert out["error"]["code"] == "bad_request"
    assert await services.store.count() == 0


async def test_keys_gate_commands_without_repeating_the_key(services: Services) -> None:
    """With keys required: no key, another tenant's key, a key bound to another owner and a
    revoked key are refused, and no refusal quotes the key; the right key passes."""
    store = services.store
    key = await store.create_api_key("acme", user="ann")
    other = await store.create_api_key("globex")
    svc = commands(services, required=True)

    async def listing(api_key: str | None, user: str = "ann") -> dict[str, Any]:
        body: dict[str, Any] = {"tenant": "acme", "user": user}
        if api_key is not None:
            body["api_key"] = api_key
        return reply(await svc.handle("list", json.dumps(body).encode()))

    assert (await listing(None))["error"]["code"] == "unauthorized"
    for refused in (await listing(other), await listing(key, user="bob")):
        assert refused["error"]["code"] == "unauthorized"
        assert key not in json.dumps(refused) and other not in json.dumps(refused)
    assert (await listing(key))["ok"] is True
    await store.revoke_api_key(key)
    fresh = commands(services, required=True)  # a new process: nothing cached
    body = json.dumps({"tenant": "acme", "user": "ann", "api_key": key}).encode()
    assert reply(await fresh.handle("list", body))["error"]["code"] == "unauthorized"


async def test_a_key_bound_on_one_side_acts_only_with_that_side(services: Services) -> None:
    """A key bound to a user only may name an agent beside its user (the user with that
    agent), never the agent alone or the agent with another user; a key bound to an agent
    only, the same the other way round (docs/gateway.md)."""
    store = services.store
    ann = await store.create_api_key("acme", user="ann")
    scout = await store.create_api_key("acme", agent="scout")
    svc = commands(services, required=True)

    async def code(api_key: str, user: str | None, agent: str | None) -> str:
        body: dict[str, Any] = {"tenant": "acme", "api_key": api_key}
        body |= {k: v for k, v in (("user", user), ("agent", agent)) if v is not None}
        out = reply(await svc.handle("list", json.dumps(body).encode()))
        return "ok" if out["ok"] else str(out["error"]["code"])

    assert await code(ann, "ann", "scout") == "ok"
    assert await code(ann, None, "scout") == "unauthorized"
    assert await code(ann, "bob", "scout") == "unauthorized"
    assert await code(scout, "bob", "scout") == "ok"
    assert await code(scout, "bob", None) == "unauthorized"
    assert await code(scout, "bob", "other") == "unauthorized"


async def test_whoami_sees_a_revocation_at_once_where_requests_wait_for_the_cache(
    services: Services,
) -> None:
    """A key revoked after a request cached it: the next request still passes (the cache,
    up to a minute), but ``whoami``, which the gateway asks and caches for 10 s itself,
    refuses it at once (before, the gateway served the key for the workers' minute more)."""
    store = services.store
    key = await store.create_api_key("acme", user="ann")
    svc = commands(services, required=True)
    listing = json.dumps({"tenant": "acme", "user": "ann", "api_key": key}).encode()
    assert reply(await svc.handle("list", listing))["ok"] is True
    await store.revoke_api_key(key)
    assert reply(await svc.handle("list", listing))["ok"] is True
    out = reply(await svc.whoami(json.dumps({"api_key": key}).encode()))
    assert out["error"]["code"] == "unauthorized" and key not in json.dumps(out)


async def test_fact_history_command_reads_the_versions(services: Services) -> None:
    """``fact_history`` answers every version of the caller's fact, oldest first."""
    store = cast(MemoryStore, services.store)
    ids = []
    for i, city in enumerate(["Paris", "Rome"]):
        mid = str(uuid.uuid4())
        c = Candidate(
            candidate_id=mid,
            owner=Owner(tenant="acme", user="ann"),
            session="s1",
            type=MemoryType.FACT,
            content=f"lives in {city}",
            source_event_id=f"f{i}",
            occurred_at=NOW,
        )
        await store.put_fact(mid, city, c, "city", NOW.replace(day=1 + i))
        ids.append(mid)
    body = b'{"tenant": "acme", "user": "ann", "key": "city"}'
    out = reply(await commands(services).handle("fact_history", body))
    assert [m["id"] for m in out["memories"]] == ids


async def test_reconciler_indexes_kept_memories_and_deletes_queued_points(
    services: Services,
) -> None:
    """The maintenance round indexes what the store kept unindexed (marking it) and deletes
    the points of memories forgotten meanwhile, through the one services object."""
    store = cast(MemoryStore, services.store)
    keep = await put(store, "green tea in the morning")
    gone = await put(store, "black coffee at night")
    worker = Worker(services, "nats://unused")  # the reconciler reaches no bus
    assert await worker.reconcile_once() == 2
    assert await store.unindexed() == []
    assert await services.vectors.count("acme") == 2
    assert await store.tombstone(OwnerFilter(tenant="acme", user="ann"), gone)
    assert await worker.reconcile_once() == 0
    assert await store.pending_vector_deletes() == {}
    assert set(await services.vectors.fetch("acme", [keep, gone])) == {keep}
    vector = services.embedder.embed_query("tea")
    hits = await services.vectors.search(vector, VectorFilter(tenant="acme", user="ann"), 5)
    assert [h[0] for h in hits] == [keep]


NEAR = (
    "I keep the spare house key under the blue flower pot by the door",
    "I keep the spare house key under the blue flower pot near the door",
)


async def test_remember_folds_a_near_duplicate_and_records_the_fold(services: Services) -> None:
    """remember's write path (no bus: the event is the caller's) over the fakes: a near
    duplicate of the same owner and scope is folded into the first memory and the fold is
    recorded; with folding off, or in another scope, it is a memory of its own."""
    deps = Deps(services, Subjects("t"), cast(Any, None))
    store = cast(MemoryStore, services.store)

    async def remember(user: str, text: str, **kw: Any) -> Any:
        return await apply_remember(
            deps, RememberRequest(tenant="acme", user=user, content=text, **kw)
        )

    first = await remember("bo", NEAR[0])
    assert first.inserted and not first.folded
    again = await remember("bo", NEAR[1])
    assert again.folded and again.memory_id == first.memory_id and not again.inserted
    assert await store.folded_into("acme", again.candidate.candidate_id) == first.memory_id
    assert (await remember("bo", NEAR[1], scope=Scope.SESSION)).inserted
    await remember("ann", NEAR[0])
    apart = await remember("ann", NEAR[1], fold_near_duplicates=False)
    assert apart.inserted and not apart.folded
    for user in ("bo", "ann"):
        assert len(await store.list_memories(OwnerFilter(tenant="acme", user=user))) == 2


class Ingesting(MemoryStore):
    """A store being written while the reconciler reads it: every ``unindexed`` call stores
    one more memory, as the store stage does under a steady ingest, and time moves a second
    a call (the stage marks its memories itself, after the round's read)."""

    def __init__(self) -> None:
        self.now = NOW
        super().__init__(clock=lambda: self.now)
        self.written = 0

    async def unindexed(self, limit: int = 256, written_by: datetime | None = None):
        found = await super().unindexed(limit, written_by)
        self.now += timedelta(seconds=1)
        self.written += 1
        await put(self, f"turn {self.written} stored meanwhile")
        return found


async def test_a_reconcile_round_leaves_what_was_written_after_it_began(
    tmp_path: Path, embedder
) -> None:
    """The round indexes the memories kept unindexed before it began, and ends: the ones
    the stages write meanwhile are theirs to index. A round that chased them never ended
    while turns kept coming (here: never, one row a read)."""
    vectors = EdgeVectorIndex(tmp_path / "shard")
    await vectors.ensure(embedder.dim)
    store = Ingesting()
    services = Services(Settings(state_dir=tmp_path), store, vectors, embedder, Redactor(key=b"k"))
    try:
        await put(store, "green tea in the morning")
        await put(store, "black coffee at night")
        worker = Worker(services, "nats://unused")
        assert await asyncio.wait_for(worker.reconcile_once(limit=1), 10) == 2
        assert await vectors.count("acme") == 2
        left = await MemoryStore.unindexed(store)
        assert len(left) == store.written and store.written >= 2
    finally:
        await vectors.close()


class Racing(MemoryStore):
    """A store where a merge into ``target`` lands after the reconciler read the row and
    before it marks it (a turn's exact duplicate, stored by the stage meanwhile)."""

    def __init__(self) -> None:
        self.now = NOW
        super().__init__(clock=lambda: self.now)
        self.target: str | None = None

    async def mark_indexed(self, ids, read=None) -> None:
        if self.target is not None:
            self.now += timedelta(seconds=1)
            assert await self.merge("acme", self.target, "e-meanwhile")
            self.target = None
        await super().mark_indexed(ids, read)


async def test_a_memory_written_during_a_reconcile_is_indexed_again(
    tmp_path: Path, embedder
) -> None:
    """The round's point of a memory merged after the round read it is older than the row:
    the memory stays not indexed, and the next round indexes the row as it is now (its
    point lists the new source)."""
    vectors = EdgeVectorIndex(tmp_path / "shard")
    await vectors.ensure(embedder.dim)
    store = Racing()
    services = Services(Settings(state_dir=tmp_path), store, vectors, embedder, Redactor(key=b"k"))
    try:
        store.target = await put(store, "green tea in the morning")
        mid = store.target
        worker = Worker(services, "nats://unused")
        assert await worker.reconcile_once() == 1
        assert [m.id for m in await store.unindexed()] == [mid]
        assert await worker.reconcile_once() == 1
        assert await store.unindexed() == []
        record = (await vectors.fetch("acme", [mid]))[mid]
        assert "e-meanwhile" in record["source_event_ids"]
    finally:
        await vectors.close()


async def test_a_reconcile_round_leaves_the_memories_a_store_tail_is_indexing(
    services: Services,
) -> None:
    """A memory a store tail of this worker is indexing (``Deps.indexing``) is left to it,
    and does not hide the memories after it from a round that reads one at a time; once the
    tail is gone without marking it (the index was away), the next round indexes it."""
    store = cast(MemoryStore, services.store)
    busy = await put(store, "green tea in the morning")
    other = await put(store, "black coffee at night")
    worker = Worker(services, "nats://unused")
    worker.deps = Deps(services, Subjects("t"), cast(Any, None))
    worker.deps.indexing[busy] += 1
    assert await worker.reconcile_once(limit=1) == 1
    assert [m.id for m in await store.unindexed()] == [busy]
    assert await worker.reconcile_once() == 0
    del worker.deps.indexing[busy]
    assert await worker.reconcile_once() == 1
    assert await store.unindexed() == []
    assert set(await services.vectors.fetch("acme", [busy, other])) == {busy, other}


async def test_a_point_built_from_an_older_row_never_replaces_the_newer_one(
    services: Services,
) -> None:
    """A writer that read a memory's row before a command changed it (a store tail in
    flight, a reconcile round) may write its point and its mark after the command's: the
    index keeps the point of the newer row, found by its text, the older one is not
    written, and the memory stays marked indexed (no reconcile round needed)."""
    now = [NOW]
    store = MemoryStore(clock=lambda: now[0])
    services = Services(
        services.settings, store, services.vectors, services.embedder, services.redactor
    )
    deps = Deps(services, Subjects("t"), cast(Any, None))
    mid = await put(store, "the standup moved to nine thirty")
    flt = OwnerFilter(tenant="acme", user="ann")
    (before,) = (await store.get_many(flt, [mid])).values()
    now[0] = NOW + timedelta(minutes=5)
    assert await store.update_content(flt, mid, "the standup moved to ten", "h2", None, {})
    await deps.reindex("acme", [mid])
    await indexing.index(store, services.vectors, services.embedder, [before])
    (record,) = (await services.vectors.fetch("acme", [mid])).values()
    assert record["text"] == "the standup moved to ten"
    assert await store.unindexed() == []

"""The recall query cache: a NATS KV bucket shared by every recall worker.

Entries live ``recall_cache_ttl_s`` (short). A key is a digest of the request and of the
owner's *generations*: random tokens kept in the same bucket under ``gen.<digest>``, one per
(tenant, user) and per (tenant, agent), and one per tenant for the shared scopes. Every change
to a memory bumps the generations of its owners (``bump``; of the tenant too when the memory is
``project`` or ``global``, which other owners read), so later lookups compute new keys and
miss: invalidation is one KV put,
whatever the number of cached queries. Workers follow generations with a KV watch; for the
few milliseconds a bump takes to reach a worker, a lookup may still hit the old entry, and
never longer than the TTL.

Workers also follow which entries exist (a second watch, on ``q.>``, headers only: keys, no
values), so a miss costs no network call: only a key the bucket holds is fetched (one KV get,
a round trip that would otherwise be paid on every recall). A put that another worker made
a moment ago may not be known yet: that lookup misses and recall runs as usual.

Replaying a bump or losing a gen key to the TTL is safe: a missing generation reads as
``-``, and every entry keyed with ``-`` is older than the bump that replaced it (see
docs/recall.md).

The bucket is memory-backed: a NATS restart takes it away, entries, generations and all. Every
worker recreates it (``_ensure``): when a bump or put finds it gone, and every few seconds
(``_supervise``), which also re-opens the watches when they ended or follow a bucket that was
replaced. A bucket lost with the server holds no entry, so nothing stale can be served from
it. A bump that still fails (NATS away) raises ``TransientError`` from the NATS error: the
store stage treats it as an outage and tries again in 0.5-2 s. The invalidation is never
skipped, because a skipped bump would let recall serve a forgotten or replaced memory from
the cache for up to the TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import Iterable
from typing import Any

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from memstream.consumers.logs import log
from memstream.schemas.errors import TransientError
from memstream.schemas.recall import RecallReply, RecallRequest


def _digest(*parts: str | None) -> str:
    return hashlib.sha256("\x1f".join(p or "" for p in parts).encode()).hexdigest()[:40]


def gen_key(tenant: str, kind: str, name: str) -> str:
    return f"gen.{_digest(tenant, kind, name)}"


class RecallCache:
    PRUNE_EVERY = 4096  # known keys: drop the expired ones every this many new keys
    SUPERVISE_EVERY_S = 2.0  # how often a worker checks that its bucket and watches live

    def __init__(self, js: JetStreamContext, bucket: str, ttl_s: float, replicas: int = 1) -> None:
        """``replicas``: as the streams' (``stream_replicas``), so that in a cluster the bucket
        outlives the node that holds it: invalidation (``bump``) is part of storing a memory,
        and a bucket on a lost node would hold up the store stage until the node returned."""
        self.js, self.bucket, self.ttl_s, self.replicas = js, bucket, ttl_s, replicas
        self.kv: Any = None
        self.gens: dict[str, str] = {}
        self.known: dict[str, float] = {}  # entry key -> when it expires (monotonic)
        self._watches: list[asyncio.Task[None]] = []
        self._supervisor: asyncio.Task[None] | None = None
        self._created: Any = None  # the bucket stream's creation time, as last opened
        self._opening = asyncio.Lock()
        self._added = 0
        self.hits = 0
        self.misses = 0

    @property
    def stream(self) -> str:
        return f"KV_{self.bucket}"

    async def start(self) -> None:
        await self._open()
        self._supervisor = asyncio.create_task(self._supervise(), name="cache.supervisor")

    async def _open(self) -> None:
        """Bind to the bucket (creating it if missing) and (re)start both watches."""
        cfg = KeyValueConfig(
            bucket=self.bucket,
            ttl=self.ttl_s,
            history=1,
            storage=StorageType.MEMORY,
            replicas=self.replicas,
            description="memstream recall cache",
        )
        try:
            self.kv = await self.js.key_value(self.bucket)
        except BucketNotFoundError:
            self.kv = await self.js.create_key_value(cfg)
        info = await self.js.stream_info(self.stream)
        await self._conform(info.config)
        created = info.created
        if self._created is not None and created != self._created:
            # a new bucket: no entry of the old one survived, nor did its generations
            self.gens.clear()
        self.known.clear()  # the entries watch lists the ones that exist again
        self._created = created
        await self._stop_watches()
        gens = await self.kv.watch("gen.>")
        entries = await self.kv.watch("q.>", meta_only=True)
        self._watches = [
            asyncio.create_task(self._follow_gens(gens), name="cache.generations"),
            asyncio.create_task(self._follow_entries(entries), name="cache.entries"),
        ]
        for task in self._watches:
            task.add_done_callback(self._watch_ended)

    async def _conform(self, config: StreamConfig) -> None:
        """Give a bucket made under other settings this worker's replicas and TTL, as
        ``topology.apply`` does for the streams: a bucket left at R1 when the streams were
        raised to R3 is lost with its one node, and every bump then holds up the store stage
        until the bucket is made again. A change the server refuses (more replicas than
        nodes) is logged, and the bucket is used as it is."""
        if config.num_replicas == self.replicas and config.max_age == self.ttl_s:
            return
        was = (config.num_replicas, config.max_age)
        config.num_replicas, config.max_age = self.replicas, self.ttl_s
        try:
            await self.js.update_stream(config)
        except NatsError as exc:
            log.warning(
                "cache.bucket_not_updated",
                bucket=self.bucket,
                replicas=was[0],
                wanted=self.replicas,
                error=type(exc).__name__,
            )
            return
        log.info(
            "cache.bucket_updated",
            bucket=self.bucket,
            replicas=f"{was[0]}->{self.replicas}",
            ttl_s=f"{was[1]}->{self.ttl_s}",
        )

    async def _ensure(self) -> None:
        """Re-open when the bucket is gone (NATS restarted), was replaced, or a watch ended."""
        async with self._opening:  # many stages may notice at once: one re-open
            try:
                created = (await self.js.stream_info(self.stream)).created
            except NotFoundError:
                created = None
            if created is None or created != self._created or any(w.done() for w in self._watches):
                log.warning("cache.reopen", bucket_missing=created is None)
                await self._open()

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(self.SUPERVISE_EVERY_S)
            try:
                await self._ensure()
            except Exception as exc:  # noqa: BLE001 - NATS away: the next round tries again
                log.debug("cache.supervise_failed", error=type(exc).__name__)

    def _watch_ended(self, task: asyncio.Task[None]) -> None:
        """A watch that stops before ``stop()`` leaves the cache stale (generations) or cold
        (entries: every lookup misses): say so, with the reason."""
        if task.cancelled():
            return
        exc = task.exception()
        log.warning(
            "cache.watch_ended",
            watch=task.get_name(),
            error=type(exc).__name__ if exc else "ended",
        )

    async def _follow_gens(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            if entry.value:
                self.gens[entry.key] = entry.value.decode()
            else:
                self.gens.pop(entry.key, None)

    async def _follow_entries(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            if entry.operation is None:  # a put (deletes and TTL markers carry an operation)
                self._know(entry.key)
            else:
                self.known.pop(entry.key, None)

    def _know(self, key: str) -> None:
        """Remember that the bucket holds ``key`` (for at most the TTL from now)."""
        now = time.monotonic()
        self.known[key] = now + self.ttl_s
        self._added += 1
        if self._added % self.PRUNE_EVERY == 0:
            self.known = {k: t for k, t in self.known.items() if t > now}

    async def stop(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        await self._stop_watches()

    async def _stop_watches(self) -> None:
        for task in self._watches:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._watches = []

    def key(self, req: RecallRequest) -> str:
        gu = self.gens.get(gen_key(req.tenant, "u", req.user), "-") if req.user else ""
        ga = self.gens.get(gen_key(req.tenant, "a", req.agent), "-") if req.agent else ""
        gt = self.gens.get(gen_key(req.tenant, "t", "*"), "-")  # shared memories changed
        body = req.model_dump_json(exclude={"cache", "api_key"})
        return f"q.{_digest(req.tenant, req.user, req.agent, gu, ga, gt, body)}"

    async def get(self, key: str) -> bytes | None:
        """The cached reply under ``key`` (from ``key(req)``), or None."""
        if self.known.get(key, 0.0) <= time.monotonic():
            self.misses += 1  # not in the bucket as far as this worker knows: no KV call
            return None
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            self.known.pop(key, None)
            self.misses += 1
            return None
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: never fail recall
            log.warning("cache.get_failed", error=type(exc).__name__)
            return None
        self.hits += 1
        return bytes(entry.value) if entry.value else None

    async def put(self, key: str, reply: RecallReply) -> None:
        """Cache ``reply`` under the key its lookup used: generations read before the search,
        so a bump during the search leaves this entry under the old generation, unused."""
        try:
            cached = reply.model_copy(update={"cached": True}).model_dump_json().encode()
            await self.kv.put(key, cached)
            self._know(key)  # this worker knows its own entry at once
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: never fail recall
            log.warning("cache.put_failed", error=type(exc).__name__)

    async def bump(
        self, tenant: str, user: str | None, agent: str | None, shared: bool = False
    ) -> None:
        """Invalidate every cached query of these owners (new generation tokens); ``shared``
        (a ``project`` or ``global`` memory changed, which every caller of the tenant may
        read): every cached query of the tenant. Recreates a bucket that went away; raises
        ``TransientError`` when NATS cannot take the bump."""
        await self.bump_many([(tenant, user, agent, shared)])

    async def bump_many(self, owners: Iterable[tuple[str, str | None, str | None, bool]]) -> None:
        """``bump`` for many owners at once: each generation key is put once, the puts
        pipelined (a batch's owners cost one round trip, not one each)."""
        keys = list(
            dict.fromkeys(
                gen_key(tenant, kind, name)
                for tenant, user, agent, shared in owners
                for kind, name in (("u", user), ("a", agent), ("t", "*" if shared else None))
                if name
            )
        )
        token = uuid.uuid4().hex.encode()
        done = await asyncio.gather(*(self.kv.put(k, token) for k in keys), return_exceptions=True)
        failed = [k for k, r in zip(keys, done, strict=True) if isinstance(r, BaseException)]
        if failed:  # the bucket may be gone: recreate it, once
            try:
                await self._ensure()
                await asyncio.gather(*(self.kv.put(k, token) for k in failed))
            except Exception as exc:
                raise TransientError("the recall cache cannot be invalidated") from exc
        for key in keys:
            self.gens[key] = token.decode()  # this worker sees its own bump at once

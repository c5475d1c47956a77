"""The recall query cache: a NATS KV bucket shared by every recall worker.

Entries live ``recall_cache_ttl_s`` (short). A key is a digest of the request and of the
owner's *generations*: random tokens kept in the same bucket under ``gen.<digest>``, one per
(tenant, user) and per (tenant, agent). Every change to a memory bumps the generations of its
owners (``bump``), so later lookups compute new keys and miss: invalidation is one KV put,
whatever the number of cached queries. Workers follow generations with a KV watch, so a
lookup costs one KV get; for the few milliseconds a bump takes to reach a worker, a lookup
may still hit the old entry, and never longer than the TTL.

Replaying a bump or losing a gen key to the TTL is safe: a missing generation reads as
``-``, and every entry keyed with ``-`` is older than the bump that replaced it (see
docs/recall.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError

from memstream.consumers.logs import log
from memstream.schemas.recall import RecallReply, RecallRequest


def _digest(*parts: str | None) -> str:
    return hashlib.sha256("\x1f".join(p or "" for p in parts).encode()).hexdigest()[:40]


def gen_key(tenant: str, kind: str, name: str) -> str:
    return f"gen.{_digest(tenant, kind, name)}"


class RecallCache:
    def __init__(self, js: JetStreamContext, bucket: str, ttl_s: float) -> None:
        self.js, self.bucket, self.ttl_s = js, bucket, ttl_s
        self.kv: Any = None
        self.gens: dict[str, str] = {}
        self._watch: asyncio.Task[None] | None = None
        self.hits = 0
        self.misses = 0

    async def start(self) -> None:
        cfg = KeyValueConfig(
            bucket=self.bucket,
            ttl=self.ttl_s,
            history=1,
            storage=StorageType.MEMORY,
            description="memstream recall cache",
        )
        try:
            self.kv = await self.js.key_value(self.bucket)
        except BucketNotFoundError:
            self.kv = await self.js.create_key_value(cfg)
        watcher = await self.kv.watch("gen.>")
        self._watch = asyncio.create_task(self._follow(watcher))

    async def _follow(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is None:
                continue
            if entry.value:
                self.gens[entry.key] = entry.value.decode()
            else:
                self.gens.pop(entry.key, None)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    def key(self, req: RecallRequest) -> str:
        gu = self.gens.get(gen_key(req.tenant, "u", req.user), "-") if req.user else ""
        ga = self.gens.get(gen_key(req.tenant, "a", req.agent), "-") if req.agent else ""
        body = req.model_dump_json(exclude={"cache", "api_key"})
        return f"q.{_digest(req.tenant, req.user, req.agent, gu, ga, body)}"

    async def get(self, req: RecallRequest) -> bytes | None:
        try:
            entry = await self.kv.get(self.key(req))
        except KeyNotFoundError:
            self.misses += 1
            return None
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: never fail recall
            log.warning("cache.get_failed", error=type(exc).__name__)
            return None
        self.hits += 1
        return bytes(entry.value) if entry.value else None

    async def put(self, req: RecallRequest, reply: RecallReply) -> None:
        try:
            cached = reply.model_copy(update={"cached": True}).model_dump_json().encode()
            await self.kv.put(self.key(req), cached)
        except Exception as exc:  # noqa: BLE001 - the cache is an optimisation: never fail recall
            log.warning("cache.put_failed", error=type(exc).__name__)

    async def bump(self, tenant: str, user: str | None, agent: str | None) -> None:
        """Invalidate every cached query of these owners (new generation tokens)."""
        token = uuid.uuid4().hex.encode()
        for kind, name in (("u", user), ("a", agent)):
            if name:
                key = gen_key(tenant, kind, name)
                await self.kv.put(key, token)
                self.gens[key] = token.decode()  # this worker sees its own bump at once

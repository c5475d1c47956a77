"""The shared recall cache (NATS KV) between workers, on a real nats-server with JetStream."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import nats
import pytest

from memstream.consumers.cache import RecallCache
from memstream.schemas.recall import Method, RecallReply, RecallRequest

pytestmark = pytest.mark.integration


async def until(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.01)


@pytest.fixture
async def caches(nats_url: str) -> AsyncIterator[tuple[RecallCache, RecallCache]]:
    """Two workers' caches over one bucket."""
    nc = await nats.connect(nats_url)
    bucket = f"cache{uuid.uuid4().hex[:8]}"
    a, b = RecallCache(nc.jetstream(), bucket, 30), RecallCache(nc.jetstream(), bucket, 30)
    await a.start()
    await b.start()
    yield a, b
    await a.stop()
    await b.stop()
    await nc.jetstream().delete_key_value(bucket)
    await nc.close()


def request(query: str) -> RecallRequest:
    return RecallRequest(tenant="acme", user="zoe", query=query)


REPLY = RecallReply(hits=[], method=Method.HYBRID)


async def test_an_entry_one_worker_puts_is_a_hit_for_another(caches) -> None:
    """Worker B learns of worker A's entry through the key watch and serves it as cached."""
    a, b = caches
    key = a.key(request("tea?"))
    assert await b.get(key) is None  # nothing cached yet
    await a.put(key, REPLY)
    await until(lambda: key in b.known)
    cached = await b.get(key)
    assert cached is not None and RecallReply.model_validate_json(cached).cached


async def test_a_miss_makes_no_kv_call(caches) -> None:
    """An unknown key is a miss decided locally: it answers even with the bucket gone."""
    a, _ = caches
    kv, a.kv = a.kv, None  # a KV call would fail: counted as neither hit nor miss
    try:
        assert await a.get(a.key(request("never asked"))) is None
    finally:
        a.kv = kv
    assert a.misses == 1


async def test_a_bump_during_the_search_leaves_its_reply_unused(caches) -> None:
    """The reply is stored under the key computed before the search: a memory change that
    lands meanwhile (a bump) makes the next lookup use a new key, so the stale reply is never
    served."""
    a, b = caches
    req = request("coffee?")
    key = a.key(req)  # lookup, before the search
    await b.bump("acme", "zoe", None)  # the owner's memories change during the search
    await until(lambda: a.key(req) != key)
    await a.put(key, REPLY)  # the search's reply, computed before the change
    assert await a.get(a.key(req)) is None


async def test_expired_entries_are_forgotten(caches) -> None:
    """A known key past its TTL is a local miss; pruning drops expired keys."""
    a, _ = caches
    key = a.key(request("old"))
    await a.put(key, REPLY)
    a.known[key] = time.monotonic() - 1  # as if the TTL had passed
    assert await a.get(key) is None
    a.PRUNE_EVERY = 1
    a._know("q.other")
    assert key not in a.known and "q.other" in a.known


async def test_a_watch_that_stops_early_is_logged_with_its_reason(caches) -> None:
    """A watch task that fails leaves a warning naming the watch and the error; a watch
    cancelled by stop() leaves none."""
    from structlog.testing import capture_logs

    a, _ = caches

    async def broken() -> None:
        raise ConnectionResetError("gone")

    failed = asyncio.create_task(broken(), name="cache.entries")
    await asyncio.gather(failed, return_exceptions=True)
    cancelled = asyncio.create_task(asyncio.sleep(10), name="cache.generations")
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    with capture_logs() as logs:
        a._watch_ended(failed)
        a._watch_ended(cancelled)
    assert logs == [
        {
            "event": "cache.watch_ended",
            "watch": "cache.entries",
            "error": "ConnectionResetError",
            "log_level": "warning",
        }
    ]


async def test_a_bucket_made_under_other_settings_takes_this_workers_ttl(nats_url: str) -> None:
    """A bucket an earlier version or setting made (another TTL) is updated when a worker
    opens it; a change the server refuses (three replicas on one server) leaves the bucket
    as it is and the cache working. The replicas case, on a cluster: test_nats_cluster.py."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    bucket = f"cache{uuid.uuid4().hex[:8]}"
    await js.create_key_value(bucket=bucket, ttl=30, history=1)
    longer, refused = RecallCache(js, bucket, 60), RecallCache(js, bucket, 90, replicas=3)
    try:
        await longer.start()
        info = await js.stream_info(longer.stream)
        assert info.config.max_age == 60 and info.config.num_replicas == 1
        await refused.start()  # one server cannot hold three replicas: logged, not raised
        info = await js.stream_info(refused.stream)
        assert info.config.max_age == 60 and info.config.num_replicas == 1
        key = refused.key(request("still cached?"))
        await refused.put(key, REPLY)
        assert await refused.get(key) is not None
    finally:
        await longer.stop()
        await refused.stop()
        await js.delete_key_value(bucket)
        await nc.close()

"""The agent SDK when the memory service cannot be reached: fail fast, fail open, say why."""

from __future__ import annotations

import asyncio
import time

import pytest

from memstream.consumers.embedded import free_port
from memstream.producers.client import (
    MemoryClient,
    MemoryClientError,
    RecallError,
)
from memstream.producers.sync import SyncMemoryClient


def unreachable() -> str:
    return f"nats://127.0.0.1:{free_port()}"


async def test_recall_fails_fast_with_a_sanitized_code() -> None:
    """No server: recall raises RecallError('unavailable') within the connect timeout, and the
    message names neither the address nor the query."""
    url = unreachable()
    client = MemoryClient("t", user="u", nats_url=url, connect_timeout=0.5)
    started = time.perf_counter()
    with pytest.raises(RecallError) as err:
        await client.recall("my secret question")
    assert time.perf_counter() - started < 3
    assert err.value.code.value == "unavailable"
    assert url.split("//")[1] not in str(err.value) and "secret" not in str(err.value)
    await client.close()


async def test_publish_without_waiting_never_blocks_or_raises() -> None:
    """publish_turn(wait=False) returns at once even with no server; the failure is counted."""
    client = MemoryClient("t", user="u", nats_url=unreachable(), connect_timeout=0.2)
    started = time.perf_counter()
    assert await client.publish_turn([("user", "hello")], wait=False) is None
    assert time.perf_counter() - started < 0.05
    started = time.perf_counter()
    await client.close()  # waits for the attempt under way, not for retry_for_s (60 s)
    assert time.perf_counter() - started < 10
    assert client.publish_failures == 1


async def test_close_ends_the_retries_of_a_publish_already_trying() -> None:
    """A background publish that has been trying for a while (NATS away) stops at close(),
    after the try under way: an agent's shutdown never waits out ``retry_for_s``."""
    client = MemoryClient("t", user="u", nats_url=unreachable(), connect_timeout=0.2)
    await client.publish_turn([("user", "hello")], wait=False)
    await asyncio.sleep(1.0)  # a few tries and pauses in
    assert client.publish_failures == 0  # still trying
    started = time.perf_counter()
    await client.close()
    assert time.perf_counter() - started < 10 and client.publish_failures == 1


async def test_publish_without_waiting_reports_its_outcome() -> None:
    """on_done is called once, after the retries, with the error; a callback that raises
    breaks nothing."""
    client = MemoryClient("t", user="u", nats_url=unreachable(), connect_timeout=0.2)
    outcomes: list[tuple[object, object]] = []

    def done(result: object, error: object) -> None:
        outcomes.append((result, error))
        raise RuntimeError("the caller's bug")

    await client.publish_turn([("user", "hello")], wait=False, on_done=done)
    await client.close()
    assert len(outcomes) == 1 and outcomes[0][0] is None
    assert isinstance(outcomes[0][1], MemoryClientError)
    assert client.publish_failures == 1


def test_bad_recall_arguments_are_a_bad_request() -> None:
    """Invalid arguments fail before any network call, with code bad_request."""
    with (
        SyncMemoryClient("t", user="u", nats_url=unreachable()) as mem,
        pytest.raises(RecallError) as err,
    ):
        mem.recall("q", top_k=500)
    assert err.value.code.value == "bad_request"

"""``SyncMemoryClient``: the SDK for blocking code (a sync LangGraph node, a script)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from memstream.producers.client import MemoryClient, PublishResult
from memstream.schemas.recall import RecallReply

T = TypeVar("T")


class SyncMemoryClient:
    """Blocking wrapper: runs a MemoryClient on a private event loop thread."""

    def __init__(self, tenant: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="memstream-sdk"
        )
        self._thread.start()
        self._client = MemoryClient(tenant, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return fut.result()

    def publish_turn(self, messages: Sequence[Any], **kwargs: Any) -> PublishResult | None:
        return self._run(self._client.publish_turn(messages, **kwargs))

    def recall(self, query: str, **kwargs: Any) -> RecallReply:
        return self._run(self._client.recall(query, **kwargs))

    def __getattr__(self, name: str) -> Any:
        """Every other async method of MemoryClient (remember, forget, ...), blocking."""
        method = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(method(*args, **kwargs))

        return call

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def __enter__(self) -> SyncMemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

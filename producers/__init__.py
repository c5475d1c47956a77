"""The agent SDK: publish turns, recall memories.

async with MemoryClient("acme", user="alice") as mem:
    await mem.publish_turn([("user", "I prefer tea over coffee")], session="s1")
    reply = await mem.recall("what does alice drink?")
"""

from memstream.producers.client import (
    MemoryClient,
    MemoryClientError,
    PublishError,
    PublishResult,
    RecallError,
    SyncMemoryClient,
)

__all__ = [
    "MemoryClient",
    "MemoryClientError",
    "PublishError",
    "PublishResult",
    "RecallError",
    "SyncMemoryClient",
]

"""The agent SDK: publish turns, recall memories.

async with MemoryClient("acme", user="alice") as mem:
    await mem.publish_turn([("user", "I prefer tea over coffee")], session="s1")
    reply = await mem.recall("what does alice drink?")

Agent middleware (recall before, persist after a model call): ``MemoryMiddleware``
(docs/integrations.md).
"""

from memstream.producers.client import (
    MemoryClient,
    MemoryClientError,
    PublishError,
    PublishResult,
    RecallError,
)
from memstream.producers.gates import GatePolicy
from memstream.producers.middleware import (
    AuditEvent,
    ChatMessage,
    MemoryMiddleware,
    ModelOutput,
    RecalledMemory,
    ToolOutcome,
    TurnContext,
)
from memstream.producers.sync import SyncMemoryClient

__all__ = [
    "AuditEvent",
    "ChatMessage",
    "GatePolicy",
    "MemoryClient",
    "MemoryClientError",
    "MemoryMiddleware",
    "ModelOutput",
    "PublishError",
    "PublishResult",
    "RecallError",
    "RecalledMemory",
    "SyncMemoryClient",
    "ToolOutcome",
    "TurnContext",
]

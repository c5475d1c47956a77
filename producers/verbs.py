"""The management commands as typed methods of the SDK client: each one a ``mem.cmd.<verb>``
request through ``MemoryClient.command``, its reply unpacked (``CommandError`` when the
reply lacks what the verb returns)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memstream.producers.errors import CommandError
from memstream.schemas.commands import CommandReply
from memstream.schemas.errors import ErrorCode
from memstream.schemas.memory import MemoryRecord
from memstream.schemas.recall import RecallReply


class Verbs:
    """Mixed into ``MemoryClient``, which supplies ``command``."""

    async def command(self, verb: str, **fields: Any) -> CommandReply:
        raise NotImplementedError

    async def remember(self, content: str, **fields: Any) -> MemoryRecord:
        """Store a memory explicitly (redacted and indexed like any other)."""
        return _one(await self.command("remember", content=content, **fields))

    async def get(self, memory_id: str) -> MemoryRecord:
        return _one(await self.command("get", id=memory_id))

    async def list_memories(self, **filters: Any) -> CommandReply:
        """Newest first; filters: session, types, scopes, limit (<= 100), offset."""
        return await self.command("list", **filters)

    async def pin(self, memory_id: str) -> MemoryRecord:
        return _one(await self.command("pin", id=memory_id))

    async def unpin(self, memory_id: str) -> MemoryRecord:
        return _one(await self.command("unpin", id=memory_id))

    async def forget(self, memory_id: str) -> None:
        await self.command("forget", id=memory_id)

    async def forget_owner(self, session: str | None = None) -> dict[str, int]:
        """Erase the owner's memories (or one session's), vectors and raw turns."""
        return (await self.command("forget_owner", session=session)).counts

    async def fact_put(self, key: str, value: str, **fields: Any) -> CommandReply:
        return await self.command("fact_put", key=key, value=value, **fields)

    async def fact_update(self, key: str, value: str, **fields: Any) -> CommandReply:
        return await self.command("fact_update", key=key, value=value, **fields)

    async def fact_history(self, key: str, at: datetime | None = None) -> list[MemoryRecord]:
        return (await self.command("fact_history", key=key, at=at)).memories

    async def pending_review(self, since: dict[str, datetime]) -> dict[str, int]:
        return (await self.command("pending_review", since=since)).counts

    async def memory_off(self, session: str) -> None:
        await self.command("memory_off", session=session)

    async def memory_on(self, session: str) -> None:
        await self.command("memory_on", session=session)

    async def peer_query(self, target_agent: str, query: str, top_k: int = 10) -> RecallReply:
        """Read one named agent's memories (no access counted)."""
        reply = await self.command(
            "peer_query", target_agent=target_agent, query=query, top_k=top_k
        )
        return _recall_of(reply)

    async def peer_query_any(self, query: str, top_k: int = 10) -> RecallReply:
        """Read every agent's memories but the caller's (no access counted)."""
        return _recall_of(await self.command("peer_query_any", query=query, top_k=top_k))


def _one(reply: CommandReply) -> MemoryRecord:
    if reply.memory is None:
        raise CommandError(ErrorCode.INTERNAL, "the reply holds no memory")
    return reply.memory


def _recall_of(reply: CommandReply) -> RecallReply:
    if reply.recall is None:
        raise CommandError(ErrorCode.INTERNAL, "the reply holds no recall result")
    return reply.recall

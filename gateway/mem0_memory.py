"""The Mem0-compatible API's routes on one memory, named by its id: ``GET``, ``PUT`` (``text``,
``metadata``) and ``DELETE /v1/memories/{id}/``, and ``GET /v1/memories/{id}/history/``.

Separate from ``mem0.py`` (the key scheme, the routes over an owner's memories and the
catch-alls for what is not served) because these calls name no entity: each acts as the key's
own owner, so a tenant-wide key is a 422 here, and another owner's memory is not found.
``create_app`` includes this router before ``mem0.router``, whose catch-alls would otherwise
answer these paths.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import StringConstraints

from memstream.gateway.errors import ApiError, not_found
from memstream.gateway.identity import Identity, Root
from memstream.gateway.mem0 import ERRORS, AuthId
from memstream.gateway.mem0_shapes import Mem0Memory, UpdateBody, of_record
from memstream.gateway.models import has_nul
from memstream.producers.client import CommandError, MemoryClient
from memstream.schemas.errors import ErrorCode
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import MemoryRecord

router = APIRouter(tags=["Mem0-compatible API"])


async def _owned(mem: MemoryClient, memory_id: str) -> MemoryRecord:
    """One memory the key's owner may read; 404 otherwise (another owner's is not found)."""
    try:
        return await mem.get(memory_id)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise


def _ident_client(ident: Identity, root: MemoryClient) -> MemoryClient:
    """The key's own owner (a Mem0 call on one memory names no entity)."""
    if ident.user is None and ident.agent is None:
        raise ApiError(
            422,
            "validation_error",
            "a tenant-wide key names no owner: use a key bound to a user or agent here",
        )
    return ident.client(root)


MemoryId = Annotated[str, StringConstraints(min_length=1, max_length=200)]


@router.get("/v1/memories/{memory_id}/", response_model=Mem0Memory, responses=ERRORS)
async def get_one(memory_id: MemoryId, ident: AuthId, root: Root) -> Mem0Memory:
    """One memory of the key's owner."""
    return of_record(await _owned(_ident_client(ident, root), memory_id))


@router.put("/v1/memories/{memory_id}/", response_model=Mem0Memory, responses=ERRORS)
async def update(memory_id: MemoryId, body: UpdateBody, ident: AuthId, root: Root) -> Mem0Memory:
    """New text and/or metadata; the memory keeps its id and is redacted and re-indexed."""
    if body.timestamp is not None:
        raise ApiError(422, "validation_error", "timestamp: changing it is not supported")
    if body.expiration_date is not None:
        raise ApiError(422, "validation_error", "expiration_date: not supported on update")
    if body.text is None and body.metadata is None:
        raise ApiError(422, "validation_error", "send text and/or metadata")
    if has_nul(body.model_dump()):
        raise ApiError(422, "validation_error", "text must not contain NUL characters")
    mem = _ident_client(ident, root)
    old = await _owned(mem, memory_id)
    if old.fact_key is not None:
        raise ApiError(409, "conflict", "a versioned fact changes with fact_update")
    fields: dict[str, Any] = {"id": memory_id, "content": body.text or old.content}
    if body.metadata is not None:
        fields["metadata"] = body.metadata
    try:
        reply = await mem.command("update", **fields)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise
    if reply.memory is None:
        raise ApiError(500, "internal", "the memory was not returned")
    return of_record(reply.memory)


@router.delete("/v1/memories/{memory_id}/", responses=ERRORS)
async def delete_one(
    memory_id: MemoryId,
    ident: AuthId,
    root: Root,
    delete_linked: Annotated[bool, Query()] = False,
) -> dict[str, str]:
    """Forget one memory: gone from search, get and get-all at once."""
    mem = _ident_client(ident, root)
    try:
        await mem.forget(memory_id)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise
    return {"message": "Memory deleted successfully!"}


KIND_EVENT = {"stored": "ADD", "updated": "UPDATE", "forgotten": "DELETE"}


@router.get("/v1/memories/{memory_id}/history/", responses=ERRORS)
async def history(memory_id: MemoryId, ident: AuthId, root: Root) -> list[dict[str, Any]]:
    """What happened to one memory, oldest first (ADD, UPDATE, DELETE). memstream's audit
    holds no text, so only the latest entry carries the memory's current text."""
    mem = _ident_client(ident, root)
    try:
        reply = await mem.command("history", id=memory_id)
    except CommandError as exc:
        if exc.code is ErrorCode.NOT_FOUND:
            raise not_found("no such memory") from None
        raise
    m = reply.memory
    if m is None:
        raise ApiError(500, "internal", "the memory was not returned")
    events = [e for e in reply.detail.get("events", []) if e.get("kind") in KIND_EVENT]
    out = []
    for i, e in enumerate(events):
        last = i == len(events) - 1
        out.append(
            {
                "id": derived_id("mem0-history", m.id, str(i), str(e.get("at"))),
                "memory_id": m.id,
                "input": [],
                "old_memory": None,
                "new_memory": m.content if last else None,
                "user_id": m.user,
                "agent_id": m.agent,
                "event": KIND_EVENT[e["kind"]],
                "metadata": dict(m.metadata),
                "created_at": e.get("at"),
                "updated_at": e.get("at"),
            }
        )
    return out

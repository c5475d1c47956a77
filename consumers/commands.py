"""Management commands on ``mem.cmd.<verb>`` (core request-reply, queue group).

Each verb: decode the request (bad input -> ``bad_request`` reply), act within
the caller's tenant and owner scope (another owner's memory is ``not_found``),
record the operation in ``memory_events`` and publish it on ``mem.events.<tenant>``.
The owner filters and those shared effects are in ``command_base.py``, the verbs on
versioned facts in ``command_facts.py``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from memstream.consumers.auth import Authenticator
from memstream.consumers.command_base import owner_filter, read_filter
from memstream.consumers.command_facts import FactCommands
from memstream.consumers.dlq import belongs_to, dead_letters, stored
from memstream.consumers.logs import log
from memstream.consumers.offload import offload
from memstream.consumers.recall import RecallService, error_reply, record_read
from memstream.consumers.remember import remember as apply_remember
from memstream.consumers.stages import Deps, _redact_candidate
from memstream.pipeline import dedupe
from memstream.schemas.commands import (
    VERBS,
    ForgetOwnerRequest,
    IdRequest,
    ListRequest,
    PeerQueryRequest,
    PendingReviewRequest,
    RememberRequest,
    SessionRequest,
    UpdateRequest,
    WhoamiRequest,
)
from memstream.schemas.commands import CommandReply as Reply
from memstream.schemas.errors import (
    DataRejected,
    ErrorCode,
    MemstreamError,
    NotFound,
    PermanentError,
    describe,
)
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import Candidate, Owner
from memstream.schemas.recall import RecallRequest
from memstream.storage.postgres import OwnerFilter


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


class CommandService(FactCommands):
    def __init__(self, deps: Deps, recall: RecallService, auth: Authenticator) -> None:
        self.deps, self.recall, self.auth = deps, recall, auth
        self.handlers: dict[str, Callable[[Any], Awaitable[Reply]]] = {
            "remember": self.remember,
            "get": self.get,
            "list": self.list,
            "update": self.update,
            "history": self.history,
            "pin": self.pin,
            "unpin": self.unpin,
            "forget": self.forget,
            "forget_owner": self.forget_owner,
            "fact_put": self.fact_put,
            "fact_update": self.fact_update,
            "fact_history": self.fact_history,
            "pending_review": self.pending_review,
            "memory_off": self.memory_off,
            "memory_on": self.memory_on,
            "peer_query": self.peer_query,
            "peer_query_any": self.peer_query_any,
        }
        assert set(self.handlers) == set(VERBS)

    async def handle(self, verb: str, body: bytes) -> bytes:
        started = time.perf_counter()
        try:
            req = VERBS[verb].model_validate_json(body)
        except ValidationError as exc:
            return error_reply(ErrorCode.BAD_REQUEST, f"invalid {verb} request: {describe(exc)}")
        try:
            refusal = await self.auth.refuse(req.tenant, req.api_key, req.user, req.agent)
        except MemstreamError:
            refusal = "credentials cannot be checked right now"
        if refusal is not None:
            return error_reply(ErrorCode.UNAUTHORIZED, refusal)
        if isinstance(req, IdRequest) and not _is_uuid(req.id):
            return error_reply(ErrorCode.NOT_FOUND, "no such memory")  # memory ids are UUIDs
        if _has_nul(req.model_dump(exclude={"api_key"})):
            # Postgres text cannot hold NUL: refuse it here rather than fail in the store
            return error_reply(ErrorCode.BAD_REQUEST, "text must not contain NUL characters")
        try:
            reply = await self.handlers[verb](req)
        except NotFound as exc:
            return error_reply(ErrorCode.NOT_FOUND, str(exc))
        except PermanentError as exc:  # the request's own values were refused by a store
            return error_reply(ErrorCode.BAD_REQUEST, f"{verb} was refused: {exc}")
        except MemstreamError:
            return error_reply(
                ErrorCode.UNAVAILABLE, f"{verb} is unavailable: a store did not answer"
            )
        except Exception:  # noqa: BLE001 - the command responder's one catch-all: a code, never a traceback
            log.exception("command.error", verb=verb, tenant=req.tenant)
            return error_reply(ErrorCode.INTERNAL, f"{verb} failed inside the server")
        log.info(
            "command.done",
            verb=verb,
            tenant=req.tenant,
            ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return reply.model_dump_json().encode()

    async def whoami(self, body: bytes) -> bytes:
        """``mem.cmd.whoami``: the identity an API key is bound to (the gateway's key check).
        The reply names tenant, user and agent, never the key."""
        try:
            req = WhoamiRequest.model_validate_json(body)
        except ValidationError as exc:
            return error_reply(ErrorCode.BAD_REQUEST, f"invalid whoami request: {describe(exc)}")
        try:
            ident = await self.auth.identity(req.api_key, fresh=True)
        except MemstreamError:
            return error_reply(ErrorCode.UNAVAILABLE, "credentials cannot be checked right now")
        if ident is None:
            return error_reply(ErrorCode.UNAUTHORIZED, "the api_key is not valid")
        detail = {"tenant": ident.tenant, "user": ident.user, "agent": ident.agent}
        return Reply(detail=detail).model_dump_json().encode()

    # --- verbs ------------------------------------------------------------------------------

    async def remember(self, r: RememberRequest) -> Reply:
        """An explicit write, redacted, deduplicated (exact and near duplicates) and indexed as
        the stages do it (consumers/remember.py)."""
        done = await apply_remember(self.deps, r)
        c = done.candidate
        await self._emit(
            "stored" if done.inserted else "merged", r, done.memory_id, c.source_event_id, c.type
        )
        return Reply(
            memory=await self.deps.pg.get(owner_filter(r), done.memory_id),
            detail={"duplicate": not done.inserted, "near_duplicate": done.folded},
        )

    async def get(self, r: IdRequest) -> Reply:
        m = await self.deps.pg.get(read_filter(r), r.id)
        if m is None:
            raise NotFound("no such memory")
        return Reply(memory=m)

    async def list(self, r: ListRequest) -> Reply:
        flt = OwnerFilter(
            tenant=r.tenant,
            user=r.user,
            agent=r.agent,
            project=r.project,
            shared=not r.own,
            session=r.session,
            types=tuple(r.types),
            scopes=tuple(r.scopes),
        )
        rows = await self.deps.pg.list_memories(flt, limit=r.limit + 1, offset=r.offset)
        more = len(rows) > r.limit
        return Reply(memories=rows[: r.limit], next_offset=r.offset + r.limit if more else None)

    async def update(self, r: UpdateRequest) -> Reply:
        """New text for one of the caller's own memories: redacted like any write, same id,
        re-indexed now (or by the reconciler when the index does not answer)."""
        flt = owner_filter(r)
        old = await self.deps.pg.get(flt, r.id)
        if old is None:
            raise NotFound("no such memory")
        if old.fact_key is not None:  # a versioned fact changes by fact_update, not in place
            raise DataRejected("a fact changes with fact_update, not in place")
        c = Candidate(
            candidate_id=derived_id(r.tenant, r.id, r.content, "update"),
            owner=Owner(tenant=r.tenant, user=r.user, agent=r.agent),
            session=old.session,
            type=old.type,
            scope=old.scope,
            content=r.content,
            source_event_id=f"update:{r.id}",
            occurred_at=self.deps.clock(),
            metadata=r.metadata if r.metadata is not None else {},
        )
        c = await offload(len(r.content), _redact_candidate, self.deps, c)
        m = await self.deps.pg.update_content(
            flt,
            r.id,
            c.content,
            dedupe.key(c).content_hash,
            c.metadata if r.metadata is not None else None,
            c.redactions,
        )
        if m is None:
            raise NotFound("no such memory")
        await self._index(r.tenant, m.id)
        await self._emit("updated", r, m.id, f"{m.content_hash}:{m.updated_at.isoformat()}", m.type)
        return Reply(memory=await self.deps.pg.get(flt, m.id))

    async def history(self, r: IdRequest) -> Reply:
        """The audit trail of one memory the caller may read, oldest first: what happened and
        when (``detail.events``: kind, at); the audit holds no content."""
        m = await self.deps.pg.get(read_filter(r), r.id)
        if m is None:
            raise NotFound("no such memory")
        events = [
            {"kind": e["kind"], "at": e["at"].isoformat()}
            for e in await self.deps.pg.events_for(r.tenant, r.id)
        ]
        return Reply(memory=m, detail={"events": events})

    async def _pin(self, r: IdRequest, pinned: bool) -> Reply:
        m = await self.deps.pg.set_pinned(owner_filter(r), r.id, pinned)
        if m is None:
            raise NotFound("no such memory")
        # a pinned memory never expires: the vector index follows (the point's flag and
        # expiry), now or once it is back
        await self._index(r.tenant, m.id)
        await self._emit(
            "pinned" if pinned else "unpinned",
            r,
            r.id,
            self.deps.clock().isoformat(),
            m.type,
        )
        return Reply(memory=await self.deps.pg.get(owner_filter(r), m.id) or m)  # indexed or not

    async def pin(self, r: IdRequest) -> Reply:
        return await self._pin(r, True)

    async def unpin(self, r: IdRequest) -> Reply:
        return await self._pin(r, False)

    async def forget(self, r: IdRequest) -> Reply:
        """Tombstone one memory: gone from recall and from the vector index at once."""
        if not await self.deps.pg.tombstone(owner_filter(r), r.id):
            raise NotFound("no such memory")
        await self._delete_points(r.tenant, [r.id])
        await self._emit("forgotten", r, r.id, "tombstone")
        return Reply(counts={"memories": 1})

    async def forget_owner(self, r: ForgetOwnerRequest) -> Reply:
        """Erasure: the owner's (or one session's) memories, vectors and raw turns."""
        ids = await self.deps.pg.erase(owner_filter(r, r.session))
        await self._delete_points(r.tenant, ids)
        turns = await self._purge_turns(r)
        dead = await self._purge_dead_letters(r)
        await self._emit(
            "erased",
            r,
            None,
            f"{r.user}:{r.agent}:{r.session}:{time.time()}",
            memories=len(ids),
            turns=turns,
            dead_letters=dead,
            session=r.session,
        )
        return Reply(
            counts={"memories": len(ids), "vectors": len(ids), "turns": turns, "dead_letters": dead}
        )

    async def _purge_dead_letters(self, r: ForgetOwnerRequest) -> int:
        """Dead-lettered copies of the owner's turns and candidates (raw text may be among
        them). Their subjects carry no owner, so the bodies are read: a scan of MEM_DLQ."""
        s = self.deps.subjects
        removed = 0
        for m in await dead_letters(self.deps.js, s, None, 1_000_000):
            if belongs_to(m.data, r.tenant, r.user, r.agent, r.session):
                await self.deps.js.delete_msg(s.stream("dlq"), m.metadata.sequence.stream)
                removed += 1
        return removed

    async def _purge_turns(self, r: ForgetOwnerRequest) -> int:
        """The owner's raw turns (or one session's). The subject's owner token is the user,
        else the agent, so (alice, bot), (alice, other) and agent 'alice' share it: the
        bodies are read and only this exact owner's turns are deleted."""
        s = self.deps.subjects
        token = r.user or r.agent or "_"
        if r.session is None:
            subject = s.turns_filter(r.tenant, token)
        else:
            subject = s.turns(r.tenant, token, r.session)
        stream = s.stream("turns")
        removed = 0
        for m in await stored(self.deps.js, stream, subject, 1_000_000):
            if belongs_to(m.data, r.tenant, r.user, r.agent, r.session):
                await self.deps.js.delete_msg(stream, m.metadata.sequence.stream)
                removed += 1
        return removed

    async def pending_review(self, r: PendingReviewRequest) -> Reply:
        counts = await self.deps.pg.pending_review(r.tenant, r.since, r.user, r.agent)
        return Reply(counts=counts)

    async def _memory(self, r: SessionRequest, off: bool) -> Reply:
        owner = Owner(tenant=r.tenant, user=r.user, agent=r.agent)
        await self.deps.pg.set_memory_off(r.tenant, owner.key, r.session, off)
        await self.deps.pg.record_event(
            r.tenant,
            None,
            "memory_off" if off else "memory_on",
            f"{owner.key}:{r.session}:{time.time()}",
            {"session": r.session},
        )
        await self._emit(
            "memory_off" if off else "memory_on",
            r,
            None,
            f"{owner.key}:{r.session}:{time.time()}",
            session=r.session,
        )
        return Reply(detail={"session": r.session, "memory": "off" if off else "on"})

    async def memory_off(self, r: SessionRequest) -> Reply:
        return await self._memory(r, True)

    async def memory_on(self, r: SessionRequest) -> Reply:
        return await self._memory(r, False)

    async def peer_query(self, r: PeerQueryRequest) -> Reply:
        """Read one named agent's memories; never counts as an access, and is recorded in
        the audit trail (``peer_memory_query``: caller, target, ids read)."""
        if not r.target_agent:
            raise NotFound("peer_query needs target_agent")
        req = RecallRequest(
            tenant=r.tenant, agent=r.target_agent, query=r.query, top_k=r.top_k, types=r.types
        )
        flt = OwnerFilter(tenant=r.tenant, agent=r.target_agent, peer=True)
        found = await self.recall.recall(req, touch=False, owner=flt)
        await record_read(
            self.deps.pg, "peer_memory_query", r, found.hits, target_agent=r.target_agent
        )
        return Reply(recall=found)

    async def peer_query_any(self, r: PeerQueryRequest) -> Reply:
        """Read every agent's memories except the caller's; never counts as an access."""
        req = RecallRequest(
            tenant=r.tenant, agent=r.agent or "*", query=r.query, top_k=r.top_k, types=r.types
        )
        flt = OwnerFilter(tenant=r.tenant, peer=True, exclude_agent=r.agent)
        return Reply(recall=await self.recall.recall(req, touch=False, owner=flt))

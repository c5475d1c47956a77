"""Management commands: ``mem.cmd.<verb>`` request-reply, one request model per verb.

Every request names the caller (tenant plus user and/or agent, and optionally a
project). The server scopes every read and write to the caller (docs/memory-model.md):
writes touch only the caller's own memories (same user and same agent); reads also see
the tenant's ``global`` memories and the caller's project's ``project`` memories. Any
other memory is ``not_found``, never visible. Replies are ``CommandReply``
(``ok: true``) or ``ErrorReply`` (``ok: false``, with a code).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memstream.schemas.events import Ident, Metadata, OptIdent, Tag, Text
from memstream.schemas.memory import MemoryRecord, MemoryType, Scope
from memstream.schemas.recall import Caller as Caller  # re-exported: the base of the requests below
from memstream.schemas.recall import RecallReply


class RememberRequest(Caller):
    content: Annotated[Text, Field(min_length=1, max_length=50_000)]
    type: MemoryType = MemoryType.FACT
    scope: Scope = Scope.USER
    session: Ident = "default"
    pinned: bool = False
    importance: Annotated[float, Field(ge=0, le=1)] = 0.5
    expires_at: datetime | None = None
    metadata: Metadata = Field(default_factory=dict)
    tags: Annotated[list[Tag], Field(max_length=32)] = Field(default_factory=list)
    # False: a near duplicate of a memory is kept as a memory of its own (a keyed store's
    # item, Mem0's infer=False), only an exact duplicate merges
    fold_near_duplicates: bool = True


class IdRequest(Caller):
    """get, history, pin, unpin, forget."""

    id: Ident


class UpdateRequest(Caller):
    """update: new text (and optionally metadata) for one of the caller's memories; the
    memory keeps its id, is redacted and re-indexed."""

    id: Ident
    content: Annotated[Text, Field(min_length=1, max_length=50_000)]
    metadata: Metadata | None = None


class ListRequest(Caller):
    session: OptIdent = None
    types: list[MemoryType] = Field(default_factory=list)
    scopes: list[Scope] = Field(default_factory=list)
    limit: Annotated[int, Field(ge=1, le=100)] = 20
    offset: Annotated[int, Field(ge=0)] = 0
    own: bool = False  # the caller's own memories only, not the shared ones of other owners


class ForgetOwnerRequest(Caller):
    """Erasure of the caller's memories (all, or one session), vectors and raw turns."""

    session: OptIdent = None


class FactPutRequest(Caller):
    key: Ident
    value: Annotated[Text, Field(min_length=1, max_length=10_000)]
    valid_from: datetime | None = None
    session: Ident = "default"
    # A fact's scope and expiry: a memory promoted to a fact keeps its own (a run's or a
    # session's fact must not answer a recall that excludes those scopes, nor outlive them)
    scope: Scope = Scope.USER
    expires_at: datetime | None = None
    importance: Annotated[float, Field(ge=0, le=1)] = 0.7
    # the stored text: ``<key>: <value>`` (the key says what the value is: ``diet:
    # vegetarian``), or the value alone, for a statement that says it itself (the HTTP
    # gateway's facts: a key such as ``user:1:preference`` would only add noise)
    labelled: bool = True
    # the version this put must close (an update of that version): refused, not_found, when
    # another version is current, so two updates of one version cannot both succeed
    supersedes: Annotated[str, Field(max_length=64)] | None = None


class FactHistoryRequest(Caller):
    key: Ident
    at: datetime | None = None  # the version valid at this time; None: the whole chain


class PendingReviewRequest(Caller):
    """Memories created per agent since the given time (one per agent, or ``*``)."""

    since: dict[str, datetime]


class SessionRequest(Caller):
    """memory_off / memory_on for one session."""

    session: Ident


class PeerQueryRequest(Caller):
    """Read another agent's memories (``target_agent``) or all agents' but the caller's."""

    query: Annotated[Text, Field(min_length=1, max_length=10_000)]
    target_agent: OptIdent = None
    top_k: Annotated[int, Field(ge=1, le=100)] = 10
    types: list[MemoryType] = Field(default_factory=list)


class WhoamiRequest(BaseModel):
    """``mem.cmd.whoami``: which tenant and owner an API key is bound to (no owner needed:
    resolving it is the point). Not in ``VERBS``: it has no caller to scope."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    api_key: Annotated[str, Field(min_length=1, max_length=200, repr=False)]


class CommandReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    ok: Literal[True] = True
    memory: MemoryRecord | None = None
    memories: list[MemoryRecord] = Field(default_factory=list)
    next_offset: int | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    recall: RecallReply | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


VERBS: dict[str, type[Caller]] = {
    "remember": RememberRequest,
    "get": IdRequest,
    "list": ListRequest,
    "update": UpdateRequest,
    "history": IdRequest,
    "pin": IdRequest,
    "unpin": IdRequest,
    "forget": IdRequest,
    "forget_owner": ForgetOwnerRequest,
    "fact_put": FactPutRequest,
    "fact_update": FactPutRequest,
    "fact_history": FactHistoryRequest,
    "pending_review": PendingReviewRequest,
    "memory_off": SessionRequest,
    "memory_on": SessionRequest,
    "peer_query": PeerQueryRequest,
    "peer_query_any": PeerQueryRequest,
}

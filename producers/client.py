"""The agent SDK.

``MemoryClient`` (async); ``SyncMemoryClient`` (producers/sync.py) wraps it for blocking
code, the management commands' typed methods are in producers/verbs.py and the publishing of
turns in producers/publishing.py (``PublishResult`` and ``PublishCallback`` re-exported here).

- ``publish_turn`` publishes a ``TurnEvent`` to JetStream with ``Nats-Msg-Id``
  = event id and checks the PubAck: a retried publish is stored once. With
  ``wait=False`` it returns at once and never raises (an agent's turn must not
  block or fail on memory); failures are counted in ``publish_failures``.
- ``recall`` is a request-reply on ``mem.recall`` with a timeout. Every failure
  raises ``RecallError`` with a machine-readable ``code`` and a sanitized
  message: no server address, credentials or query text in it.

The exceptions (producers/errors.py, re-exported here) all derive from
``MemoryClientError``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import BaseModel, ValidationError

from memstream.producers.connection import NatsAuth, let_go, request, servers
from memstream.producers.errors import (
    CommandError,
    MemoryClientError,
    PublishError,
    RecallError,
    ServiceError,
    field_errors,
)
from memstream.producers.publishing import PublishCallback, Publishing, PublishResult
from memstream.producers.verbs import Verbs
from memstream.schemas.commands import VERBS, CommandReply
from memstream.schemas.errors import ErrorCode, ErrorReply
from memstream.schemas.recall import Method, RecallReply, RecallRequest
from memstream.schemas.stack import read_stack
from memstream.schemas.subjects import Subjects

__all__ = [
    "CommandError",
    "MemoryClient",
    "MemoryClientError",
    "NatsAuth",
    "PublishCallback",
    "PublishError",
    "PublishResult",
    "RecallError",
    "ServiceError",
    "discover_nats_url",
]

T = TypeVar("T")


def discover_nats_url(state_dir: str | os.PathLike[str] | None = None) -> str:
    """``MEMSTREAM_NATS_URL``, else the URL a running ``memstream dev`` wrote under
    its state directory, else the NATS default."""
    if url := os.environ.get("MEMSTREAM_NATS_URL"):
        return url
    folder = Path(state_dir or os.environ.get("MEMSTREAM_STATE_DIR", ".memstream"))
    return read_stack(folder).get("nats_url", "nats://127.0.0.1:4222")


class MemoryClient(Publishing, Verbs):
    """Async client bound to one tenant (and optionally a default user/agent)."""

    def __init__(
        self,
        tenant: str,
        *,
        user: str | None = None,
        agent: str | None = None,
        nats_url: str | None = None,
        namespace: str | None = None,
        recall_timeout: float = 2.0,
        publish_timeout: float = 5.0,
        command_timeout: float = 10.0,
        connect_timeout: float = 2.0,
        api_key: str | None = None,
        nats_auth: NatsAuth | None = None,
        nats_creds: str | os.PathLike[str] | None = None,
        retry_for_s: float = 60.0,
    ) -> None:
        """``nats_auth``: NATS credentials (default: the ``MEMSTREAM_NATS_*`` variables);
        ``nats_creds``: a ``.creds`` file, shorthand for ``NatsAuth(creds=...)``. Credentials
        never go in ``nats_url``'s place in any message the client produces.
        ``retry_for_s``: how long a background publish (``wait=False``) keeps trying while
        NATS is away before it is reported failed (``close`` ends the trying sooner)."""
        self.tenant, self.user, self.agent = tenant, user, agent
        self.retry_for_s = retry_for_s
        self._url = nats_url or discover_nats_url()
        try:
            auth = nats_auth or NatsAuth.from_env()
            if nats_creds is not None:  # given here, it replaces any credential of the env
                auth = NatsAuth(creds=Path(nats_creds), inbox_prefix=auth.inbox_prefix)
        except ValueError as exc:  # two credentials at once: says which variables, no value
            raise MemoryClientError(str(exc)) from None
        self._connect_options = auth.connect_options()
        self.subjects = Subjects(namespace or os.environ.get("MEMSTREAM_NAMESPACE", "mem"))
        self.recall_timeout, self.publish_timeout = recall_timeout, publish_timeout
        self.command_timeout = command_timeout
        self.connect_timeout = connect_timeout
        self.connection_errors = 0
        self._connecting = asyncio.Lock()
        self._api_key = api_key or os.environ.get("MEMSTREAM_API_KEY")
        self._nc: Any = None
        self._js: Any = None
        self._root: MemoryClient | None = None  # set on scoped copies: whose connection
        self._pending: set[asyncio.Task[Any]] = set()
        self._closed = False
        # each close() moves it on: a background publish begun before it stops trying (a
        # connect() the retry itself makes must not undo that, as it undoes ``_closed``)
        self._closes = 0
        self._changes = 0  # commands sent that change memories (``changes``)
        self.publish_failures = 0

    async def connect(self) -> MemoryClient:
        """Connect once (concurrent callers share the attempt). A server that cannot be
        reached fails within ``connect_timeout`` with ``MemoryClientError``: it never hangs the
        agent. Once connected, the client reconnects on its own."""
        if self._root is not None:
            await self._shared()
            return self
        async with self._connecting:
            if self._nc is None:
                self._closed = False
                try:
                    nc = await asyncio.wait_for(
                        nats.connect(
                            servers(self._url),
                            name="memstream-sdk",
                            connect_timeout=self.connect_timeout,
                            max_reconnect_attempts=-1,
                            error_cb=self._on_error,
                            **self._connect_options,
                        ),
                        self.connect_timeout,
                    )
                except (OSError, NatsError, TimeoutError) as exc:
                    raise MemoryClientError("cannot connect to the memory service") from exc
                self._nc, self._js = nc, nc.jetstream()
        return self

    def scoped(
        self,
        tenant: str,
        *,
        user: str | None = None,
        agent: str | None = None,
        api_key: str | None = None,
    ) -> MemoryClient:
        """A client for another caller that shares this one's connection (a gateway serves
        many tenants and owners over one NATS connection). Close only the original."""
        other = copy.copy(self)
        other.tenant, other.user, other.agent = tenant, user, agent
        other._api_key = api_key
        other._pending = set()
        other._closed = False
        other._root = self._root or self
        return other

    async def _shared(self) -> None:
        """Connect the original client and take over its connection."""
        root = self._root
        if root is not None:
            await root.connect()
            self._nc, self._js = root._nc, root._js

    async def jetstream(self) -> Any:
        """The connection's JetStream context (for progress and pending-turn reads)."""
        await self.connect()
        return self._js

    async def whoami(self, api_key: str) -> dict[str, str | None]:
        """The identity an API key is bound to: ``{"tenant", "user", "agent"}``; raises
        ``CommandError`` (code ``unauthorized`` for a key that is not valid)."""
        payload = json.dumps({"schema_version": 1, "api_key": api_key}).encode()
        data = await self._request(
            self.subjects.cmd("whoami"), payload, self.command_timeout, CommandError
        )
        try:
            body = json.loads(data)
            if body.get("ok") is False:
                err = ErrorReply.model_validate(body).error
                raise CommandError(err.code, err.message)
            detail = CommandReply.model_validate(body).detail
            return {
                k: (str(detail[k]) if detail.get(k) else None) for k in ("tenant", "user", "agent")
            }
        except (ValueError, AttributeError, ValidationError, KeyError):
            raise CommandError(ErrorCode.INTERNAL, "the reply could not be read") from None

    async def flush(self, session: str = "default", within_s: float = 30.0) -> bool:
        """Wait until every turn this client's owner published to ``session`` so far is
        processed and recallable (the pipeline is asynchronous: recall right after a publish
        may not see it yet). True when done, False when ``within_s`` seconds passed first."""
        from memstream.producers.progress import wait_processed

        return (await wait_processed(self, session, within_s=within_s)).done

    async def _on_error(self, exc: Exception) -> None:
        """Connection errors are counted, not printed: the agent's output stays its own."""
        self.connection_errors += 1

    @property
    def changes(self) -> int:
        """How many commands that change memories (forget, update, remember, ...) this client
        and its scoped copies have sent: a cache of recalled memories kept beside it, such as
        the middleware's, is stale once this moves."""
        return (self._root or self)._changes

    @property
    def closed(self) -> bool:
        """``close()`` was called (and no ``connect()`` since): a background wait such as the
        middleware's flush stops instead of opening a connection nobody will close."""
        return self._closed or (self._root is not None and self._root._closed)

    def closes(self) -> tuple[int, int]:
        """How many times this client, and the one whose connection it shares, were closed:
        a background publish stops trying once this differs from when it began."""
        return self._closes, (self._root or self)._closes

    async def close(self) -> None:
        self._closes += 1
        if self._root is not None:  # a scoped copy: the connection is the original's
            self._closed = True
            if self._pending:
                await asyncio.gather(*self._pending, return_exceptions=True)
            return
        self._closed = True
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        if self._nc is not None:
            await let_go(self._nc)  # NATS away: closed, not drained, and no error
            self._nc = None

    async def __aenter__(self) -> MemoryClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def recall(
        self,
        query: str,
        *,
        top_k: int = 10,
        session: str | None = None,
        user: str | None = None,
        agent: str | None = None,
        method: Method | str = Method.HYBRID,
        **options: Any,
    ) -> RecallReply:
        """Ask for the memories that best match ``query``; raises ``RecallError``.

        ``options`` are the other fields of ``RecallRequest``: context ("all", "session",
        "resources"), types, scopes, tags, occurred_from, occurred_to, score_threshold,
        token_budget, cache. ``top_k=-1`` returns every hit above the threshold (at most 100).
        """
        try:
            req = RecallRequest(
                tenant=self.tenant,
                api_key=self._api_key,
                user=user or self.user,
                agent=agent or self.agent,
                session=session,
                query=query,
                top_k=top_k,
                method=Method(method),
                **options,
            )
        except (ValidationError, ValueError, TypeError) as exc:
            raise RecallError(ErrorCode.BAD_REQUEST, field_errors(exc)) from None
        data = await self._request(
            self.subjects.recall, _wire(req), self.recall_timeout, RecallError
        )
        return _decode_reply(data)

    async def _request(
        self, subject: str, payload: bytes, wait_s: float, error: type[ServiceError]
    ) -> bytes:
        try:
            await self.connect()
            msg = await request(self._nc, subject, payload, wait_s)
        except NoRespondersError:
            raise error(ErrorCode.UNAVAILABLE, "no memory worker is running") from None
        except (TimeoutError, NatsTimeout):
            raise error(ErrorCode.TIMEOUT, f"no answer within {wait_s:.1f} s") from None
        except (MemoryClientError, NatsError, OSError):
            raise error(ErrorCode.UNAVAILABLE, "the memory service is unreachable") from None
        return bytes(msg.data)

    # --- management commands (mem.cmd.<verb>) ----------------------------------------------

    async def command(self, verb: str, **fields: Any) -> CommandReply:
        """Send ``mem.cmd.<verb>`` as the client's owner; raises ``CommandError``."""
        model = VERBS.get(verb)
        if model is None:
            raise CommandError(ErrorCode.BAD_REQUEST, f"unknown command {verb!r}")
        fields.setdefault("user", self.user)
        fields.setdefault("agent", self.agent)
        if verb not in READ_VERBS:
            (self._root or self)._changes += 1
        try:
            req = model(tenant=self.tenant, api_key=self._api_key, **fields)
        except (ValidationError, ValueError, TypeError) as exc:
            raise CommandError(ErrorCode.BAD_REQUEST, field_errors(exc)) from None
        data = await self._request(
            self.subjects.cmd(verb),
            _wire(req),
            self.command_timeout,
            CommandError,
        )
        try:
            body = json.loads(data)
            if body.get("ok") is False:
                err = ErrorReply.model_validate(body).error
                raise CommandError(err.code, err.message)
            return CommandReply.model_validate(body)
        except (ValueError, AttributeError, ValidationError):
            raise CommandError(ErrorCode.INTERNAL, "the reply could not be read") from None


READ_VERBS = frozenset(
    {"get", "list", "history", "fact_history", "pending_review", "peer_query", "peer_query_any"}
)


def _wire(req: BaseModel) -> bytes:
    """A request as sent: the fields the caller set, defaults left out, so that a worker one
    release older, which refuses a field it does not know, still takes a request from a newer
    SDK that leaves that field at its default (a rolling upgrade in either order)."""
    return req.model_dump_json(exclude_defaults=True).encode()


def _decode_reply(data: bytes) -> RecallReply:
    try:
        return RecallReply.model_validate_json(data)  # the fast path: one pass over the bytes
    except ValidationError:
        pass
    try:
        err = ErrorReply.model_validate_json(data).error
    except ValidationError:
        raise RecallError(ErrorCode.INTERNAL, "the recall reply could not be read") from None
    raise RecallError(err.code, err.message)

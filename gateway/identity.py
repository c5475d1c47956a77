"""API keys to identities: who is calling, as the pipeline says.

The gateway keeps no credentials: it asks the workers (``mem.cmd.whoami``) which tenant and
owner a key is bound to and caches the answer briefly (``CACHE_S``; a revoked key stops
working here within that time: the workers look the key up afresh for ``whoami``, and check
it again, cached for a minute, on every request the gateway forwards). The cache is keyed by
a hash of the key.

- Seed 004's and seed 002's routes take ``Authorization: Bearer <key>`` (``bearer_identity``).
- Seed 000's take ``user_key`` in the body (``identity_of``).

A missing or wrong key is 401; no response, error or log line holds any part of a key.
A key bound to a user or agent cannot act as another one (403 ``forbidden``).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Request

from memstream.gateway.errors import ApiError, forbidden, from_service, unauthorized
from memstream.producers.client import CommandError, MemoryClient, MemoryClientError
from memstream.schemas.errors import ErrorCode

CACHE_S = 10.0
MAX_KEY_CHARS = 200


@dataclass(frozen=True)
class Identity:
    """A resolved key: the tenant, and the user/agent it is bound to (None: any)."""

    tenant: str
    user: str | None
    agent: str | None
    key: str = field(repr=False)

    def owner(
        self, user: str | None = None, agent: str | None = None
    ) -> tuple[str | None, str | None]:
        """The (user, agent) a request acts as: what it names, which must agree with the
        key's binding; what it leaves out comes from the key."""
        if user is not None and self.user is not None and user != self.user:
            raise forbidden("the key is bound to another user")
        if agent is not None and self.agent is not None and agent != self.agent:
            raise forbidden("the key is bound to another agent")
        u, a = user or self.user, agent or self.agent
        if u is None and a is None:
            raise ApiError(
                422, "validation_error", "name a user or an agent: the key is not bound to one"
            )
        return u, a

    def client(
        self, root: MemoryClient, user: str | None = None, agent: str | None = None
    ) -> MemoryClient:
        """An SDK client acting as this identity's owner (sharing the gateway's connection);
        it forwards the key, so the workers check it again."""
        u, a = self.owner(user, agent)
        return root.scoped(self.tenant, user=u, agent=a, api_key=self.key)


class KeyResolver:
    """Key -> Identity through the pipeline, cached briefly."""

    def __init__(self, root: MemoryClient, cache_s: float = CACHE_S) -> None:
        self.root, self.cache_s = root, cache_s
        self._known: dict[str, tuple[Identity | None, float]] = {}

    async def resolve(self, key: str | None) -> Identity:
        if not key or len(key) > MAX_KEY_CHARS:
            raise unauthorized()
        digest = hashlib.sha256(key.encode()).hexdigest()
        now = time.monotonic()
        known = self._known.get(digest)
        if known is None or known[1] < now:
            try:
                found = await self.root.whoami(key)
            except CommandError as exc:
                if exc.code is not ErrorCode.UNAUTHORIZED:
                    raise from_service(exc) from None
                ident = None
            except MemoryClientError as exc:
                raise from_service(exc) from None
            else:
                tenant = found.get("tenant")
                if not tenant:
                    raise ApiError(500, "internal", "the key's identity could not be read")
                ident = Identity(tenant, found.get("user"), found.get("agent"), key)
            if len(self._known) > 10_000:
                self._known.clear()
            known = (ident, now + self.cache_s)
            self._known[digest] = known
        if known[0] is None:
            raise unauthorized()
        return known[0]


def resolver(request: Request) -> KeyResolver:
    r: KeyResolver = request.app.state.resolver
    return r


def root_client(request: Request) -> MemoryClient:
    c: MemoryClient = request.app.state.client
    return c


async def bearer_identity(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="`Bearer <key>` (memstream keys create)")
    ] = None,
) -> Identity:
    """FastAPI dependency: the identity of the ``Authorization: Bearer`` key."""
    if not authorization or not authorization.lower().startswith("bearer "):
        raise unauthorized("send Authorization: Bearer <key>")
    return await resolver(request).resolve(authorization[7:].strip())


async def identity_of(request: Request, key: str | None) -> Identity:
    """The identity of a key sent in a body (seed 000's ``user_key``)."""
    return await resolver(request).resolve(key)


BearerIdentity = Annotated[Identity, Depends(bearer_identity)]
Root = Annotated[MemoryClient, Depends(root_client)]

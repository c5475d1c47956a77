"""Tenant credentials for recall and commands.

A request may carry ``api_key``; with ``MEMSTREAM_REQUIRE_API_KEY`` it must. A key given is
always checked: it must belong to the request's tenant (hash lookup in Postgres, cached
for a minute, so a revoked key stops working within a minute). A key bound to an owner
(``memstream keys create --user U --agent A``) only acts as that owner: the request must
name exactly the bound user and/or agent. Failures answer ``unauthorized`` with a sentence
that never repeats the key.

Turns are published straight into JetStream: restrict who may publish on
``mem.turns.<tenant>.>`` with NATS permissions (deploy/nats), not here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memstream.storage.pgports import Keys
from memstream.storage.postgres import hash_key

CACHE_S = 60.0


@dataclass(frozen=True)
class KeyIdentity:
    """What a key is bound to; ``user``/``agent`` None: the key may name any."""

    tenant: str
    user: str | None = None
    agent: str | None = None


class Authenticator:
    def __init__(self, keys: Keys, required: bool) -> None:
        self.pg, self.required = keys, required
        # key hash -> (identity or None for an unknown key, valid until)
        self._known: dict[str, tuple[KeyIdentity | None, float]] = {}

    async def identity(self, api_key: str, fresh: bool = False) -> KeyIdentity | None:
        """The identity of a live key, or None (unknown or revoked keys are cached briefly
        too, so guessing costs one lookup per minute per key, not one per request).
        ``fresh``: a key known valid is looked up again (the gateway's ``whoami``, which it
        caches itself: with this cache behind it, a revoked key served adds and flushes for
        70 s, not the 10 s the gateway's cache is)."""
        digest = hash_key(api_key)
        now = time.monotonic()
        known = self._known.get(digest)
        if known is None or known[1] < now or (fresh and known[0] is not None):
            found = await self.pg.identity_of_key(api_key)
            ident = KeyIdentity(*found) if found is not None else None
            known = (ident, now + CACHE_S)
            if len(self._known) > 10_000:
                self._known.clear()
            self._known[digest] = known
        return known[0]

    async def refuse(
        self, tenant: str, api_key: str | None, user: str | None = None, agent: str | None = None
    ) -> str | None:
        """None when the request may go on, else the reason to refuse it."""
        if not api_key:
            return "this server needs an api_key for the tenant" if self.required else None
        ident = await self.identity(api_key)
        if ident is None:
            return "the api_key is not valid"
        if ident.tenant != tenant:
            return "the api_key is not valid for this tenant"
        if (ident.user is not None and user != ident.user) or (
            ident.agent is not None and agent != ident.agent
        ):
            return "the api_key is bound to another owner"
        return None

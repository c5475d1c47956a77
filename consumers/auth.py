"""Tenant credentials for recall and commands.

A request may carry ``api_key``; with ``MEMSTREAM_REQUIRE_API_KEY`` it must. A key given is
always checked: it must belong to the request's tenant (hash lookup in Postgres, cached
for a minute, so a revoked key stops working within a minute). Failures answer
``unauthorized`` with a sentence that never repeats the key.

Turns are published straight into JetStream: restrict who may publish on
``mem.turns.<tenant>.>`` with NATS permissions (deploy/nats), not here.
"""

from __future__ import annotations

import time

from memstream.storage.postgres import PgStore, hash_key

CACHE_S = 60.0


class Authenticator:
    def __init__(self, pg: PgStore, required: bool) -> None:
        self.pg, self.required = pg, required
        self._known: dict[str, tuple[str, float]] = {}  # key hash -> (tenant, valid until)

    async def refuse(self, tenant: str, api_key: str | None) -> str | None:
        """None when the request may go on, else the reason to refuse it."""
        if not api_key:
            return "this server needs an api_key for the tenant" if self.required else None
        digest = hash_key(api_key)
        now = time.monotonic()
        known = self._known.get(digest)
        if known is None or known[1] < now:
            owner = await self.pg.tenant_of_key(api_key)
            if owner is None:
                return "the api_key is not valid"
            known = (owner, now + CACHE_S)
            if len(self._known) > 10_000:
                self._known.clear()
            self._known[digest] = known
        return None if known[0] == tenant else "the api_key is not valid for this tenant"

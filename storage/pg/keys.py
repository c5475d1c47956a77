"""Tenant API keys: only a key's sha256 is stored; the key itself is returned once."""

from __future__ import annotations

import secrets

from memstream.storage.pg.base import PgBase
from memstream.storage.pg.sql import hash_key


class PgKeys(PgBase):
    """Create, look up (by hash) and revoke API keys."""

    async def create_api_key(
        self, tenant: str, name: str = "", user: str | None = None, agent: str | None = None
    ) -> str:
        """A new key for ``tenant`` (bound to ``user`` and/or ``agent`` when given); only its
        hash is stored, the key is returned once."""
        key = "msk_" + secrets.token_urlsafe(32)
        await self._fetch(
            "INSERT INTO api_keys (key_hash, tenant, name, owner_user, owner_agent) "
            "VALUES ($1, $2, $3, $4, $5)",
            hash_key(key),
            tenant,
            name,
            user,
            agent,
        )
        return key

    async def identity_of_key(self, key: str) -> tuple[str, str | None, str | None] | None:
        """(tenant, user, agent) a live key is bound to (user/agent None: any), or None."""
        rows = await self._fetch(
            "SELECT tenant, owner_user, owner_agent FROM api_keys "
            "WHERE key_hash = $1 AND revoked_at IS NULL",
            hash_key(key),
        )
        if not rows:
            return None
        return str(rows[0]["tenant"]), rows[0]["owner_user"], rows[0]["owner_agent"]

    async def revoke_api_key(self, key: str) -> bool:
        rows = await self._fetch(
            "UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 "
            "AND revoked_at IS NULL RETURNING tenant",
            hash_key(key),
        )
        return bool(rows)

    async def tenant_of_key(self, key: str) -> str | None:
        """The tenant a live key belongs to, or None."""
        rows = await self._fetch(
            "SELECT tenant FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", hash_key(key)
        )
        return str(rows[0]["tenant"]) if rows else None

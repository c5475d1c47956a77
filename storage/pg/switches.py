"""Per-session memory switches: an owner may turn memory off for a session (nothing from it
is stored while off)."""

from __future__ import annotations

from collections.abc import Sequence

from memstream.storage.pg.base import PgBase


class PgSwitches(PgBase):
    """Rows of ``memory_off``: present while memory is off for (tenant, owner key, session)."""

    async def memory_off_among(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> set[tuple[str, str, str]]:
        """The (tenant, owner key, session) triples among ``keys`` whose memory is off:
        ``is_memory_off`` for a batch, in one statement."""
        if not keys:
            return set()
        rows = await self._fetch(
            "SELECT o.tenant, o.owner_key, o.session FROM memory_off o JOIN unnest($1::text[], "
            "$2::text[], $3::text[]) AS q(tenant, owner_key, session) ON o.tenant = q.tenant "
            "AND o.owner_key = q.owner_key AND o.session = q.session",
            [k[0] for k in keys],
            [k[1] for k in keys],
            [k[2] for k in keys],
        )
        return {(r["tenant"], r["owner_key"], r["session"]) for r in rows}

    async def set_memory_off(self, tenant: str, owner_key: str, session: str, off: bool) -> None:
        if off:
            await self._fetch(
                "INSERT INTO memory_off (tenant, owner_key, session) VALUES "
                "($1, $2, $3) ON CONFLICT DO NOTHING",
                tenant,
                owner_key,
                session,
            )
        else:
            await self._fetch(
                "DELETE FROM memory_off WHERE tenant = $1 AND owner_key = $2 AND session = $3",
                tenant,
                owner_key,
                session,
            )

    async def is_memory_off(self, tenant: str, owner_key: str, session: str) -> bool:
        rows = await self._fetch(
            "SELECT 1 FROM memory_off WHERE tenant = $1 AND owner_key = $2 AND session = $3",
            tenant,
            owner_key,
            session,
        )
        return bool(rows)

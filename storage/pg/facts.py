"""Facts: one current version per (owner, fact key), older versions closed (valid_to,
superseded_by) rather than deleted, so that their history stays readable."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from memstream.schemas.errors import NotFound
from memstream.schemas.memory import Candidate, MemoryRecord
from memstream.storage.pg.base import PgBase
from memstream.storage.pg.sql import _COLUMNS, OwnerFilter, _queue_vector_deletes, _record, _where


def _fact_where(flt: OwnerFilter, args: list[Any], now: datetime, live: bool = True) -> str:
    """``_where`` for the versions of a fact key (``$1``), with an exact owner also compared
    the way ``memories_fact_idx`` is keyed (``coalesce(user_id, '')``, ``coalesce(agent_id,
    '')``: an Ident is never empty): ``user_id = $n AND agent_id IS NULL`` alone lets the
    planner read every fact entry of the tenant, or every memory of the owner, to find one
    key's versions (``tests/integration/test_fact_lookup.py``)."""
    where = _where(flt, args, now, live)
    if flt.peer or flt.shared or (flt.user is None and flt.agent is None):
        return where
    args += [flt.user or "", flt.agent or ""]
    n = len(args)
    return f"{where} AND coalesce(user_id, '') = ${n - 1} AND coalesce(agent_id, '') = ${n}"


def current_fact_sql(flt: OwnerFilter, key: str, now: datetime) -> tuple[str, list[Any]]:
    """The statement of ``current_fact`` and its arguments."""
    args: list[Any] = [key]
    where = _fact_where(flt, args, now)
    return (
        f"SELECT {_COLUMNS} FROM memories WHERE fact_key = $1 AND {where} "
        "ORDER BY valid_from DESC NULLS LAST LIMIT 1",
        args,
    )


class PgFacts(PgBase):
    """Versioned facts of an owner."""

    async def current_fact(self, flt: OwnerFilter, key: str) -> MemoryRecord | None:
        sql, args = current_fact_sql(flt, key, self.clock())
        rows = await self._fetch(sql, *args)
        return _record(rows[0]) if rows else None

    async def put_fact(
        self,
        memory_id: str,
        content_hash: str,
        c: Candidate,
        key: str,
        valid_from: datetime,
        supersedes: str | None = None,
    ) -> tuple[MemoryRecord | None, str]:
        """Insert a fact version valid from ``valid_from``; the version current until then is
        closed (valid_to, superseded_by) and its point queued for deletion. Returns (the closed
        version or None, the id of the current version). Putting the value the current
        version already holds changes nothing (a retried put): (None, its id). A value held
        by an earlier, closed version opens a new version (A, B, then A again). ``supersedes``:
        the version to close; ``NotFound`` when it is not the current one (another update came
        first)."""
        owner = OwnerFilter(tenant=c.owner.tenant, user=c.owner.user, agent=c.owner.agent)
        async with self._transaction() as con:
            # One put of an owner's key at a time: ``FOR UPDATE`` below locks the current
            # version, but with none yet two puts would each open one, and a key would have
            # two current versions. The lock is the transaction's, so a crash releases it.
            await con.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                "\x1f".join(("fact", c.owner.tenant, c.owner.user or "", c.owner.agent or "", key)),
            )
            args: list[Any] = [key, memory_id]
            where = _fact_where(owner, args, self.clock(), live=False)
            old = await con.fetchrow(
                f"SELECT {_COLUMNS} FROM memories WHERE fact_key = $1 AND id <> $2 AND "
                f"superseded_by IS NULL AND valid_to IS NULL AND {where} FOR UPDATE",
                *args,
            )
            if old is not None and old["content_hash"] == content_hash:
                return None, str(old["id"])
            if supersedes is not None and (old is None or str(old["id"]) != supersedes):
                raise NotFound("that fact version is not the current one")
            await con.execute(
                """INSERT INTO memories (id, tenant, user_id, agent_id, session, scope, type,
                    content, content_hash, source_event_ids, metadata, occurred_at, fact_key,
                    valid_from, created_at, updated_at, importance, confidence, project,
                    expires_at)
                VALUES ($1,$2,$3,$4,$5,$6,'fact',$7,$8,ARRAY[$9::text],$10::jsonb,$11,$12,$13,
                        $14,$14,$15,1.0,$16,$17)
                ON CONFLICT (id) DO NOTHING""",
                memory_id,
                c.owner.tenant,
                c.owner.user,
                c.owner.agent,
                c.session,
                c.scope.value,
                c.content,
                content_hash,
                c.source_event_id,
                json.dumps(c.metadata),
                c.occurred_at,
                key,
                valid_from,
                self.clock(),
                c.importance,
                c.project,
                c.expires_at,
            )
            if old is not None:
                await con.execute(
                    "UPDATE memories SET valid_to = $2, superseded_by = $3, updated_at = $4 "
                    "WHERE id = $1",
                    old["id"],
                    valid_from,
                    memory_id,
                    self.clock(),
                )
                await _queue_vector_deletes(con, c.owner.tenant, [str(old["id"])])
                await self._event(
                    con,
                    c.owner.tenant,
                    str(old["id"]),
                    "superseded",
                    memory_id,
                    {"by": memory_id, "fact_key": key},
                )
            await self._event(
                con,
                c.owner.tenant,
                memory_id,
                "fact_put",
                c.source_event_id,
                {"fact_key": key, "supersedes": str(old["id"]) if old else None},
            )
        return (_record(old) if old is not None else None), memory_id

    async def fact_history(self, flt: OwnerFilter, key: str) -> list[MemoryRecord]:
        """Every version of a fact, oldest first."""
        args: list[Any] = [key]
        where = _fact_where(flt, args, self.clock(), live=False)
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM memories WHERE fact_key = $1 AND {where} "
            "ORDER BY valid_from NULLS FIRST, created_at",
            *args,
        )
        return [_record(r) for r in rows]

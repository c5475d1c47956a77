"""The record of truth's ports: small Protocols grouped by how callers use them.

``PgStore`` (storage/postgres.py) implements every one structurally, and so does the
in-memory ``MemoryStore`` (storage/memory.py); tests/contract/test_store_contract.py holds
both to the same behaviour. A caller names the narrowest port it needs:

| port | who uses it |
|---|---|
| ``MemoryRows`` | the dedupe and store stages (ids, upserts, merges, folds) |
| ``MemoryReads`` | recall (keyword leg, hydration, access counts), reindexing |
| ``ManagedMemories`` | the management commands (get, list, pin, edit, forget, erase) |
| ``Facts`` | fact put and history |
| ``Audit`` | the commands' audit rows and history |
| ``SessionSwitches`` | memory on/off per session (extract stage, commands) |
| ``IndexRows`` | the indexer (session neighbours, the indexed flag) |
| ``VectorDeletes`` | point deletion that converges (consumers/deletions.py) |
| ``Maintenance`` | the reconciler and the expiry sweeper |
| ``Keys`` | tenant API keys (the authenticator, ``memstream keys``) |

Every write is idempotent: a replayed call changes nothing more than the first did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from memstream.schemas.memory import Candidate, MemoryRecord
from memstream.storage.pg.sql import OwnerFilter

Clock = Callable[[], datetime]
Expired = tuple[str, str, str | None, str | None]  # (tenant, memory id, user, agent)


class MemoryRows(Protocol):
    """The stages' writes. Ids are deterministic, so every write is idempotent: an upsert
    replayed with the same source event, or a merge of a source already recorded, changes
    nothing."""

    async def exists(self, tenant: str, memory_id: str) -> bool: ...

    async def existing(self, keys: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """The live (tenant, memory id) pairs among ``keys``."""

    async def memories_by_id(self, keys: Sequence[tuple[str, str]]) -> dict[str, MemoryRecord]:
        """Live memories among (tenant, memory id) pairs, by id."""

    async def upsert(self, memory_id: str, content_hash: str, c: Candidate) -> bool:
        """Insert (True) or add the candidate's source event to the memory (False)."""

    async def upsert_many(self, rows: Sequence[tuple[str, str, Candidate]]) -> list[bool]:
        """``upsert`` of each row, in order, in one transaction."""

    async def write_batch(
        self,
        rows: Sequence[tuple[str, str, Candidate]],
        folds: Sequence[tuple[str, str, str, str]] = (),
        then: Sequence[tuple[str, str, str, str]] = (),
    ) -> tuple[list[bool], list[bool], list[bool]]:
        """``merge_many(folds)``, ``upsert_many(rows)`` and ``merge_many(then)``, in that
        order and one transaction: (inserted per row, folded per fold, folded per ``then``)."""

    async def merge(
        self, tenant: str, memory_id: str, source_event_id: str, candidate_id: str | None = None
    ) -> bool:
        """Fold a near-duplicate's source into a live memory (False: none); with
        ``candidate_id`` the fold is recorded for ``folded_into``."""

    async def merge_many(self, merges: Sequence[tuple[str, str, str, str]]) -> list[bool]:
        """``merge`` of each (tenant, memory id, source event id, candidate id), in order,
        each fold recorded."""

    async def folded_into(self, tenant: str, candidate_id: str) -> str | None:
        """Where ``merge`` folded a candidate, or None."""

    async def folded_among(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """``folded_into`` of each (tenant, candidate id): the folded ones only."""


class MemoryReads(Protocol):
    """Owner-filtered reads of live memories: a row of another tenant or owner never
    passes the filter. Tombstoned, expired and superseded memories are never returned."""

    clock: Clock

    async def get_many(self, flt: OwnerFilter, ids: Sequence[str]) -> dict[str, MemoryRecord]:
        """The live memories among ``ids`` that ``flt`` may read, by id."""

    async def keyword_search(
        self, flt: OwnerFilter, query: str, limit: int
    ) -> list[tuple[str, float]]:
        """(id, rank) of live memories sharing a word with ``query``, best first."""

    async def touch(self, tenant: str, counts: Mapping[str, int]) -> list[str]:
        """Add to the access counts of memories of ``tenant``; the ids of those another
        transaction holds are returned uncounted, to be counted again later."""


class ManagedMemories(Protocol):
    """The management commands' reads and writes, each within the caller's filter; every
    write records its audit row in the same transaction."""

    async def get(self, flt: OwnerFilter, memory_id: str) -> MemoryRecord | None: ...

    async def list_memories(
        self, flt: OwnerFilter, limit: int = 100, offset: int = 0, live: bool = True
    ) -> list[MemoryRecord]: ...

    async def set_pinned(
        self, flt: OwnerFilter, memory_id: str, pinned: bool
    ) -> MemoryRecord | None: ...

    async def update_content(
        self,
        flt: OwnerFilter,
        memory_id: str,
        content: str,
        content_hash: str,
        metadata: dict[str, Any] | None,
        redactions: dict[str, int],
    ) -> MemoryRecord | None: ...

    async def tombstone(self, flt: OwnerFilter, memory_id: str) -> bool:
        """Forget one memory (its point is queued for deletion); False when not the
        caller's or already forgotten."""

    async def erase(self, flt: OwnerFilter) -> list[str]:
        """Delete every memory ``flt`` owns for good; the ids removed."""

    async def pending_review(
        self,
        tenant: str,
        since: dict[str, datetime],
        user: str | None = None,
        agent: str | None = None,
    ) -> dict[str, int]:
        """Memories created per agent since each time (``*``: all agents) that the caller
        ``(user, agent)`` may read as theirs or a peer's: the agent's own (no user), and the
        caller's own; never another user's (an owner boundary, even for a count)."""


class Facts(Protocol):
    """Versioned facts: one current version per owner and key; putting the current value
    again changes nothing."""

    async def current_fact(self, flt: OwnerFilter, key: str) -> MemoryRecord | None: ...

    async def put_fact(
        self,
        memory_id: str,
        content_hash: str,
        c: Candidate,
        key: str,
        valid_from: datetime,
        supersedes: str | None = None,
    ) -> tuple[MemoryRecord | None, str]:
        """(the version closed or None, the current version's id). ``supersedes``: the
        version the put must close; ``NotFound`` when another one (or none) is current, so
        that two updates of one version cannot both succeed."""

    async def fact_history(self, flt: OwnerFilter, key: str) -> list[MemoryRecord]:
        """Every version, oldest first."""


class Audit(Protocol):
    """The append-only audit trail; a replayed operation records nothing new."""

    async def record_event(
        self,
        tenant: str,
        memory_id: str | None,
        kind: str,
        cause: str,
        detail: dict[str, Any] | None = None,
    ) -> None: ...

    async def events_for(
        self, tenant: str, memory_id: str | None = None
    ) -> list[dict[str, Any]]: ...


class SessionSwitches(Protocol):
    """Memory on/off per (tenant, owner key, session); setting a state twice is a no-op."""

    async def set_memory_off(
        self, tenant: str, owner_key: str, session: str, off: bool
    ) -> None: ...

    async def is_memory_off(self, tenant: str, owner_key: str, session: str) -> bool: ...

    async def memory_off_among(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> set[tuple[str, str, str]]: ...


class IndexRows(Protocol):
    """What the indexer reads beside a memory, and the flag it sets."""

    async def session_contexts(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> dict[str, list[str]]:
        """The contents of the episodes right before each memory in its session, by id."""

    async def session_followers_many(
        self, memories: Sequence[MemoryRecord], turns: int = 2
    ) -> list[MemoryRecord]:
        """The episodes right after each memory in its session (each once)."""

    async def mark_indexed(
        self, ids: Sequence[str], read: Sequence[datetime | None] | None = None
    ) -> None:
        """The points of ``ids`` are in the vector index. ``read``: per id, the ``updated_at``
        its point was built from (None: unchecked); a memory written since keeps its flag
        (the change reset it; its writer marks it)."""
        ...


class VectorDeletes(Protocol):
    """The queue of points to delete, filled in the transaction that retires a memory."""

    async def pending_vector_deletes(self, limit: int = 1000) -> dict[str, list[str]]: ...

    async def vector_deletes_done(self, tenant: str, ids: Sequence[str]) -> None: ...


class Maintenance(IndexRows, VectorDeletes, Protocol):
    """The reconciler's and sweeper's rows."""

    async def unindexed(
        self, limit: int = 256, written_by: datetime | None = None
    ) -> list[MemoryRecord]:
        """Live memories not in the vector index, oldest first; ``written_by``: only those
        last written at or before then (by the store's clock)."""
        ...

    async def purge_expired(self, limit: int = 1000) -> list[Expired]: ...


class Keys(Protocol):
    """Tenant API keys, stored as hashes; a revoked key is never found again."""

    async def create_api_key(
        self, tenant: str, name: str = "", user: str | None = None, agent: str | None = None
    ) -> str: ...

    async def identity_of_key(self, key: str) -> tuple[str, str | None, str | None] | None: ...

    async def revoke_api_key(self, key: str) -> bool: ...

    async def tenant_of_key(self, key: str) -> str | None: ...


class Health(Protocol):
    async def ping(self) -> None: ...

    async def count(self, tenant: str | None = None) -> int: ...

    async def close(self) -> None: ...


class StageStore(
    MemoryRows,
    MemoryReads,
    ManagedMemories,
    Facts,
    Audit,
    SessionSwitches,
    Maintenance,
    Protocol,
):
    """What the stages and commands reach through ``Deps.pg``."""


class Store(StageStore, Keys, Health, Protocol):
    """Everything a worker process holds one of (``consumers.services.Services.store``)."""

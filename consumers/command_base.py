"""What every management verb shares: the caller's owner filters (what a write may touch,
what a read sees), and the effects a verb has besides its own write: the event it publishes,
the index point it builds, the points it deletes.

Separate from ``commands.py`` (the request gate and the verbs) so that a group of verbs in a
module of its own (``command_facts.py``) acts on the bus and the index exactly as the others
do, deferring to the maintenance loop when the index does not answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstream.consumers.deletions import delete_points
from memstream.consumers.logs import log
from memstream.consumers.stages import Deps
from memstream.schemas.commands import Caller
from memstream.schemas.errors import TransientError
from memstream.schemas.memory import MemoryEvent, MemoryType
from memstream.storage.postgres import OwnerFilter


def owner_filter(c: Caller, session: str | None = None) -> OwnerFilter:
    """The caller's own memories, exactly: what writes may touch."""
    return OwnerFilter(tenant=c.tenant, user=c.user, agent=c.agent, session=session)


def read_filter(c: Caller) -> OwnerFilter:
    """The caller's own memories plus the shared ones (tenant ``global``, the caller's
    project's ``project``): what reads see."""
    return OwnerFilter(tenant=c.tenant, user=c.user, agent=c.agent, project=c.project, shared=True)


class CommandBase:
    """The effects shared by every verb; ``CommandService`` sets ``deps``."""

    deps: Deps

    async def _emit(
        self,
        kind: str,
        r: Caller,
        memory_id: str | None,
        cause: str,
        type_: MemoryType | None = None,
        **detail: Any,
    ) -> None:
        """Publish what happened on mem.events.<tenant> (this also invalidates the owner's
        cached recall queries, and the tenant's: commands are rare, and the memory may be a
        shared one other owners read)."""
        await self.deps.emit(
            MemoryEvent(
                kind=kind,
                tenant=r.tenant,
                user=r.user,
                agent=r.agent,
                memory_id=memory_id,
                type=type_,
                at=self.deps.clock(),
                detail=detail,
            ),
            cause,
            shared=True,
        )

    async def _index(self, tenant: str, memory_id: str) -> None:
        """Build a memory's index point now; when the index does not answer, the row stays
        unindexed in Postgres and the maintenance loop indexes it as soon as the index is
        back (as the store stage does)."""
        try:
            await self.deps.reindex(tenant, [memory_id])
        except TransientError as exc:
            log.warning("command.vector_deferred", reason=type(exc).__name__)
            self.deps.index_behind.set()

    async def _delete_points(self, tenant: str, ids: Sequence[str]) -> None:
        """Delete retired memories' points now. When the index does not answer, the queue
        keeps them (recall answers from Postgres meanwhile, where they are gone) and the
        maintenance loop, woken here, deletes them within seconds of the index's return, not
        at its next interval: a point left there keeps a forgotten text recallable."""
        if not await delete_points(self.deps.pg, self.deps.vectors, tenant, ids):
            self.deps.index_behind.set()

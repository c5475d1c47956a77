"""remember: an explicit write (``mem.cmd.remember``) as a candidate, and where it may fold.

The command then goes the stages' way with the stages' functions: redaction, ``lifecycle``'s
expiry, ``dedupe.key``, and ``plan.plan`` over a batch of one (exact duplicate, near
duplicate or insert).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from memstream.pipeline.plan import Neighbour
from memstream.schemas.commands import RememberRequest
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import Candidate, Owner, Scope

# memories that end with their session or run (TTL, end of run)
SESSION_BOUND = frozenset({Scope.RUN, Scope.SESSION})


def candidate(r: RememberRequest, now: datetime) -> Candidate:
    """The request as a candidate at ``now``. Its id derives from the owner and the text, so
    remembering the same text again is the same candidate: an exact duplicate of the memory it
    became, or found where it was folded."""
    cid = derived_id(r.tenant, r.user or "", r.agent or "", r.content, "remember")
    return Candidate(
        candidate_id=cid,
        owner=Owner(tenant=r.tenant, user=r.user, agent=r.agent),
        project=r.project,
        session=r.session,
        type=r.type,
        scope=r.scope,
        content=r.content,
        salience=1.0,  # asked for explicitly: as salient and certain as a memory gets
        confidence=1.0,
        importance=r.importance,
        source_event_id=f"remember:{cid}",
        occurred_at=now,
        metadata=r.metadata,
        tags=list(r.tags),
        pinned=r.pinned,
        expires_at=r.expires_at,
    )


def foldable(c: Candidate, record: Mapping[str, Any]) -> bool:
    """Whether ``c`` may be folded into the memory of this index record: only into one that
    lives as long and that the same readers see. Same scope (a user memory folded into a
    session one would go at the session's expiry; a global one folded into a user one would
    stop being shared), the same project for project scope, the same session for session and
    run scopes (ending a run erases exactly its memories)."""
    if record.get("scope") != c.scope.value:
        return False
    if c.scope is Scope.PROJECT and record.get("project") != c.project:
        return False
    return c.scope not in SESSION_BOUND or record.get("session") == c.session


def neighbours(
    c: Candidate, hits: Sequence[tuple[str, float, Mapping[str, Any]]]
) -> list[Neighbour]:
    """The vector search's hits (id, similarity, record) that ``c`` may fold into, as
    ``plan`` takes them."""
    return [(mid, s, str(r.get("text", ""))) for mid, s, r in hits if foldable(c, r)]

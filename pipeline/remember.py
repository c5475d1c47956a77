"""remember: an explicit write (``mem.cmd.remember``) as a candidate, and where it may fold.

The command then goes the stages' way with the stages' functions: redaction, ``lifecycle``'s
expiry, ``dedupe.key``, the near duplicates it may fold into (``dedupe.foldable``), and
``plan.plan`` over a batch of one (exact duplicate, near duplicate or insert).
"""

from __future__ import annotations

from datetime import datetime

from memstream.schemas.commands import RememberRequest
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import Candidate, Owner


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

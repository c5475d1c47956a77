"""extract: a turn event in, memory candidates out.

Only user messages and final assistant messages carry memory. Tool calls and
results, system prompts, reasoning and recalled memories never do. One episode
per turn; typed candidates come from ``memstream.pipeline.rules`` when present.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import Candidate, MemoryType, Owner, Scope

if TYPE_CHECKING:
    from memstream.pipeline.rules import Extractor

MAX_EPISODE_CHARS = 8_000


def keep(message: Message) -> bool:
    """True for messages that may become memories."""
    if message.role is Role.USER:
        return bool(message.content.strip())
    if message.role is Role.ASSISTANT:
        return message.final and not message.tool_calls and bool(message.content.strip())
    return False


def episode_text(event: TurnEvent) -> str:
    """The turn as one text: ``speaker: content`` per kept message."""
    lines = []
    for m in event.messages:
        if keep(m):
            speaker = m.sender or m.role.value
            lines.append(f"{speaker}: {m.content.strip()}")
    return "\n".join(lines)[:MAX_EPISODE_CHARS]


def extract(event: TurnEvent, extractor: Extractor | None = None) -> list[Candidate]:
    """One episode per turn (none if nothing in the turn is kept), then the typed
    candidates ``extractor`` finds (rules by default)."""
    text = episode_text(event)
    if not text:
        return []
    typed = (extractor or DEFAULT_EXTRACTOR).candidates(event)
    owner = Owner(tenant=event.tenant, user=event.user, agent=event.agent)
    return [
        Candidate(
            candidate_id=derived_id(event.tenant, event.event_id, MemoryType.EPISODE.value, "0"),
            owner=owner,
            app=event.app,
            project=event.project,
            session=event.session,
            type=MemoryType.EPISODE,
            scope=Scope.SESSION if not (event.user or event.agent) else Scope.USER,
            content=text,
            salience=0.5,
            confidence=1.0,
            importance=0.5,
            source_event_id=event.event_id,
            occurred_at=event.occurred_at,
            metadata=dict(event.metadata),
            tags=list(event.tags),
        ),
        *typed,
    ]


def _default() -> Extractor:
    from memstream.pipeline.rules import RuleExtractor

    return RuleExtractor()


DEFAULT_EXTRACTOR = _default()

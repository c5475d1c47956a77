"""Wire models: validation and what they never show."""

import pytest
from pydantic import ValidationError

from memstream.schemas.commands import IdRequest
from memstream.schemas.events import TurnEvent
from memstream.schemas.recall import RecallRequest


def test_api_key_never_appears_in_a_repr() -> None:
    """A credential on a request stays out of repr() (and so out of any log of the object)."""
    for req in (
        RecallRequest(tenant="t", user="u", query="q", api_key="msk_SECRET"),
        IdRequest(tenant="t", user="u", id="x", api_key="msk_SECRET"),
    ):
        assert "msk_SECRET" not in repr(req) and "msk_SECRET" not in str(req)


def test_recall_needs_an_owner_and_a_sane_top_k() -> None:
    """No owner, top_k 0 or a session context without a session are rejected."""
    with pytest.raises(ValidationError):
        RecallRequest(tenant="t", query="q")
    with pytest.raises(ValidationError):
        RecallRequest(tenant="t", user="u", query="q", top_k=0)
    with pytest.raises(ValidationError):
        RecallRequest(tenant="t", user="u", query="q", context="session")
    assert RecallRequest(tenant="t", user="u", query="q", top_k=-1).limit == 100


def test_turn_event_rejects_unknown_fields_and_empty_turns() -> None:
    """Extra fields and a turn without messages are errors, not silently dropped."""
    with pytest.raises(ValidationError):
        TurnEvent(tenant="t", messages=[])
    with pytest.raises(ValidationError):
        TurnEvent.model_validate({"tenant": "t", "messages": [{"role": "user"}], "oops": 1})

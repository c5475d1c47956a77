"""The remember command's pure rules (pipeline/remember.py): its candidate, where it may fold."""

from datetime import UTC, datetime
from typing import Any

from memstream.pipeline.dedupe import foldable, key, neighbours
from memstream.pipeline.plan import Action, plan
from memstream.pipeline.remember import candidate
from memstream.schemas.commands import RememberRequest
from memstream.schemas.memory import Scope

AT = datetime(2026, 1, 1, tzinfo=UTC)
TEXT = "I keep the spare house key under the blue flower pot by the door"
NEAR = "I keep the spare house key under the blue flower pot near the door"


def req(**kw: Any) -> RememberRequest:
    return RememberRequest(tenant="t", user="u", content=kw.pop("content", TEXT), **kw)


def record(scope: str = "user", session: str = "default", project: str | None = None):
    return {"id": "m", "text": NEAR, "scope": scope, "session": session, "project": project}


def test_the_same_request_is_the_same_candidate() -> None:
    """Remembering one text twice gives one candidate id and source event (a retry changes
    nothing); another owner or text gives another."""
    a, b = candidate(req(), AT), candidate(req(), AT)
    assert a.candidate_id == b.candidate_id and a.source_event_id == b.source_event_id
    assert candidate(req(content="other"), AT).candidate_id != a.candidate_id
    other = RememberRequest(tenant="t", user="v", content=TEXT)
    assert candidate(other, AT).candidate_id != a.candidate_id


def test_the_candidate_carries_the_request() -> None:
    """Owner, scope, type, pin, tags and metadata come from the request; the write happens now."""
    c = candidate(req(scope="session", pinned=True, tags=["x"], metadata={"k": "v"}), AT)
    assert (c.owner.tenant, c.owner.user, c.scope) == ("t", "u", Scope.SESSION)
    assert c.pinned and c.tags == ["x"] and c.metadata == {"k": "v"} and c.occurred_at == AT
    assert not c.redacted  # redaction comes next, as in the stages


def test_folds_stay_within_scope_project_and_session() -> None:
    """A memory may take a near duplicate only if it has the same scope; in project scope the
    same project; in session and run scopes the same session."""
    c = candidate(req(), AT)
    assert foldable(c, record())
    assert foldable(c, record(session="elsewhere"))  # a user memory outlives its session
    assert not foldable(c, record(scope="session"))
    s = candidate(req(scope="session", session="s1"), AT)
    assert foldable(s, record("session", "s1")) and not foldable(s, record("session", "s2"))
    p = candidate(req(scope="project", project="p1"), AT)
    assert foldable(p, record("project", project="p1"))
    assert not foldable(p, record("project", project="p2"))


def test_plan_folds_a_remembered_near_duplicate_only_into_a_foldable_memory() -> None:
    """Through ``neighbours`` and ``plan``: a close memory of the same scope takes the
    candidate; the same memory in another scope leaves it an insert."""
    c = candidate(req(), AT).model_copy(update={"redacted": True})
    k = key(c)
    same = neighbours(c, [("m", 0.99, record())])
    assert same == [("m", 0.99, NEAR)]
    assert plan([k], existing=set(), neighbours={0: same}, min_similarity=0.95)[0].action is (
        Action.NEAR_MERGE
    )
    other = neighbours(c, [("m", 0.99, record(scope="global"))])
    assert other == []
    assert plan([k], existing=set(), neighbours={0: other}, min_similarity=0.95)[0].action is (
        Action.INSERT
    )

"""Whose a stored body is (schemas/owners.py): the rule the console and `dlq` share."""

from __future__ import annotations

import json

from memstream.schemas.owners import belongs_to, tenant_of


def test_tenant_of_a_turn_a_candidate_and_garbage() -> None:
    """A turn names its tenant at the top, a candidate in its owner; anything else, nobody."""
    assert tenant_of(json.dumps({"tenant": "acme", "messages": []}).encode()) == "acme"
    candidate = {"owner": {"tenant": "beta", "user": "u"}, "content": "x"}
    assert tenant_of(json.dumps(candidate).encode()) == "beta"
    assert tenant_of(b"\xff not json") is None
    assert tenant_of(b"[1, 2]") is None
    assert tenant_of(json.dumps({"tenant": 7}).encode()) is None
    assert tenant_of(json.dumps({"tenant": ""}).encode()) is None


def test_belongs_to_is_exactly_one_owner() -> None:
    """Tenant, user and agent must all match (unset matches only unset); a session narrows."""
    turn = json.dumps({"tenant": "acme", "user": "ann", "agent": None, "session": "s1"}).encode()
    assert belongs_to(turn, "acme", "ann", None, None)
    assert belongs_to(turn, "acme", "ann", None, "s1")
    assert not belongs_to(turn, "acme", "ann", None, "s2")
    assert not belongs_to(turn, "acme", "ann", "bot", None)  # an agent given, none stored
    assert not belongs_to(turn, "beta", "ann", None, None)
    assert not belongs_to(turn, "acme", None, None, None)  # a tenant-wide owner is not ann
    candidate = {"owner": {"tenant": "acme", "user": None, "agent": "bot"}, "session": "s1"}
    assert belongs_to(json.dumps(candidate).encode(), "acme", None, "bot", "s1")
    assert not belongs_to(b"\xff not json", "acme", "ann", None, None)
    assert not belongs_to(b"[1]", "acme", "ann", None, None)

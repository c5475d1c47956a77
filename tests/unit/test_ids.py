"""Deterministic ids are injective and stay what they were for every stored id."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from memstream.schemas.events import TurnEvent
from memstream.schemas.ids import _NAMESPACE, _uuid5, derived_id, memory_id
from memstream.schemas.subjects import Subjects, msg_id, token

part = st.text(alphabet="ab\x1f\x1e", max_size=4)


def test_separator_in_a_field_no_longer_collides() -> None:
    """The issue's example: a separator moved between two fields gives another id."""
    assert memory_id("A\x1fB", "C", None, "fact", "h") != memory_id(
        "A", "B\x1fC", None, "fact", "h"
    )
    assert derived_id("a\x1fb", "c") != derived_id("a", "b\x1fc")


@settings(max_examples=300, deadline=None)
@given(st.lists(part, min_size=1, max_size=4), st.lists(part, min_size=1, max_size=4))
def test_derived_id_is_injective(a: list[str], b: list[str]) -> None:
    """Distinct part lists (separators included) give distinct ids."""
    assert (derived_id(*a) == derived_id(*b)) == (a == b)


@settings(max_examples=300, deadline=None)
@given(part, st.none() | part.filter(bool), st.none() | part.filter(bool), part, part)
def test_memory_id_is_injective_over_owners(
    t: str, u: str | None, g: str | None, u2: str, t2: str
) -> None:
    """Moving characters between tenant and owner fields never maps two owners to one id."""
    if (t, u) != (t2, u2 or None):
        assert memory_id(t, u, g, "fact", "h") != memory_id(t2, u2 or None, g, "fact", "h")


def test_ids_without_separators_keep_their_stored_value() -> None:
    """Ids of separator-free parts are computed as before, so dedupe holds across a deploy."""
    old = uuid.uuid5(_NAMESPACE, "acme\x1fann\x1e\x1ffact\x1fh")
    assert memory_id("acme", "ann", None, "fact", "h") == str(old)
    assert derived_id("acme", "e1", "episode", "0") == str(
        uuid.uuid5(_NAMESPACE, "acme\x1fe1\x1fepisode\x1f0")
    )


@settings(max_examples=500, deadline=None)
@given(st.text(), st.uuids())
def test_uuid5_is_the_standard_librarys(name: str, namespace: uuid.UUID) -> None:
    """The ids are computed without ``uuid.UUID`` objects, and are the same strings for any
    name (non-ASCII and surrogate-free Unicode included) under any namespace."""
    assert _uuid5(namespace.bytes, name) == str(uuid.uuid5(namespace, name))


@pytest.mark.parametrize("field", ["tenant", "user", "agent", "session", "event_id"])
def test_identifiers_refuse_control_characters(field: str) -> None:
    """A control character in any identifier is a validation error, not a stored row."""
    body = {"tenant": "t", "user": "u", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValidationError, match=field):
        TurnEvent.model_validate(body | {field: "a\x1fb"})


def test_msg_id_is_scoped_by_tenant_and_injective() -> None:
    """One event id in two tenants gives two message ids; a dot cannot shift the split."""
    assert msg_id("a", "e") != msg_id("b", "e")
    assert msg_id("a.b", "c") != msg_id("a", "b.c")
    assert "." not in token("a.b")


def test_replayable_subjects_are_the_namespace_turns_and_stages() -> None:
    """Only this namespace's turn and stage subjects may be replayed to."""
    s = Subjects("mem")
    assert s.replayable(s.turns("acme", "ann", "s1"))
    assert s.replayable(s.stage("redact", "acme"))
    for bad in (
        "mem.events.acme",
        "mem.recall",
        "mem.cmd.forget",
        "other.turns.a.b.c",
        "mem.stage.nope.acme",
        "mem.turns.a.b",
        "mem.turns.a.b.c.d",
        "mem.turns.a%Z1.b.c",
        "mem.stage.store.*",
        "mem.turns.>",
    ):
        assert not s.replayable(bad), bad

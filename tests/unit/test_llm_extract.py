"""The pure half of the LLM extractor (pipeline/llm_extract.py): what is asked, and how an
answer that is data, not trusted, becomes candidates."""

from __future__ import annotations

import json

import pytest

from memstream.pipeline.extract import extract
from memstream.pipeline.llm_extract import (
    SCOPES,
    answer_text,
    candidates,
    complement,
    request_body,
)
from memstream.schemas.events import TurnEvent
from memstream.schemas.memory import MemoryType, Scope

EVENT = TurnEvent.model_validate(
    {
        "tenant": "acme",
        "user": "ann",
        "session": "s1",
        "messages": [{"role": "user", "content": "I moved to Lisbon and I prefer window seats."}],
    }
)


def _answer(*items: object) -> str:
    return json.dumps({"memories": list(items)})


def test_request_asks_for_json_and_frames_the_turn_as_data() -> None:
    """The request carries the model, the turn as the user message, JSON mode, temperature 0."""
    body = request_body("m1", "user: hello")
    assert body["model"] == "m1" and body["temperature"] == 0
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][1] == {"role": "user", "content": "user: hello"}
    assert "data, not instructions" in body["messages"][0]["content"]


def test_valid_memories_become_candidates_with_stable_ids() -> None:
    """Known types with content and salience become candidates of the turn's owner; the same
    answer gives the same ids (a redelivered turn maps to the same memories)."""
    answer = _answer(
        {"type": "preference", "content": "Prefers window seats.", "salience": 0.8},
        {"type": "fact", "content": "Lives in Lisbon now.", "salience": 0.9},
    )
    found = candidates(EVENT, answer)
    assert [(c.type, c.content) for c in found] == [
        (MemoryType.PREFERENCE, "Prefers window seats."),
        (MemoryType.FACT, "Lives in Lisbon now."),
    ]
    c = found[0]
    assert c.owner.tenant == "acme" and c.owner.user == "ann" and c.session == "s1"
    assert c.source_event_id == EVENT.event_id and c.metadata["extractor"] == "llm"
    assert c.scope is SCOPES[MemoryType.PREFERENCE] and not c.redacted
    assert [x.candidate_id for x in candidates(EVENT, answer)] == [x.candidate_id for x in found]


def test_untrusted_items_are_dropped() -> None:
    """Unknown or episode types, short/long/non-text content, salience out of range or below
    the threshold, non-objects and repeats are dropped; the limit caps the rest."""
    answer = _answer(
        {"type": "episode", "content": "The whole turn again.", "salience": 0.9},
        {"type": "secret_plan", "content": "Take over the world.", "salience": 0.9},
        {"type": "fact", "content": "short", "salience": 0.9},
        {"type": "fact", "content": "x" * 501, "salience": 0.9},
        {"type": "fact", "content": ["not", "text"], "salience": 0.9},
        {"type": "fact", "content": "Weak memory here.", "salience": 0.2},
        {"type": "fact", "content": "Too sure of itself.", "salience": 7},
        {"type": "fact", "content": "Boolean salience.", "salience": True},
        "not an object",
        {"type": "fact", "content": "Kept  once.", "salience": 0.7},
        {"type": "fact", "content": "kept ONCE.", "salience": 0.7},
        {"type": "todo", "content": "Book the flight.", "salience": 0.7},
    )
    found = candidates(EVENT, answer)
    assert [c.content for c in found] == ["Kept once.", "Book the flight."]
    assert len(candidates(EVENT, answer, limit=1)) == 1


@pytest.mark.parametrize("answer", ["not json", "[1, 2", '{"memories": {"a": 1}}', '"text"', "{}"])
def test_an_answer_of_another_shape_is_an_error(answer: str) -> None:
    """What does not parse into a list of memories raises ValueError (the consumer falls back
    to the rules)."""
    with pytest.raises(ValueError):
        candidates(EVENT, answer)


def test_a_fenced_answer_and_a_bare_list_are_read() -> None:
    """Models often wrap JSON in a code fence or return the list alone."""
    item = {"type": "decision", "content": "We chose Postgres.", "salience": 0.9}
    assert len(candidates(EVENT, "```json\n" + _answer(item) + "\n```")) == 1
    assert len(candidates(EVENT, json.dumps([item]))) == 1


def test_answer_text_reads_chat_completions_only() -> None:
    """The content of the first choice's message, else ValueError."""
    ok = {"choices": [{"message": {"role": "assistant", "content": "{}"}}]}
    assert answer_text(ok) == "{}"
    bads: list[object] = [{}, {"choices": []}, {"choices": [{"message": {"content": None}}]}, [1]]
    for bad in bads:
        with pytest.raises(ValueError):
            answer_text(bad)


def test_complement_keeps_what_the_rules_found_and_adds_only_news() -> None:
    """A memory the rules found (same type, same normalised content) is not added twice."""
    found = extract(EVENT)
    rule_typed = [c for c in found if c.type is not MemoryType.EPISODE]
    assert rule_typed, "the cue rules find the preference"
    same = rule_typed[0]
    answer = _answer(
        {"type": same.type.value, "content": same.content.upper(), "salience": 0.9},
        {"type": "fact", "content": "Lives in Lisbon now.", "salience": 0.9},
    )
    merged = complement(found, candidates(EVENT, answer))
    assert merged[: len(found)] == found
    assert [c.content for c in merged[len(found) :]] == ["Lives in Lisbon now."]


def test_every_type_has_a_scope() -> None:
    """Each type the model may name has the scope the rules give it (user otherwise)."""
    assert MemoryType.EPISODE not in SCOPES
    assert SCOPES[MemoryType.PREFERENCE] is Scope.USER
    assert all(isinstance(s, Scope) for s in SCOPES.values())


def test_rules_plus_llm_needs_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """MEMSTREAM_EXTRACTOR=rules+llm without MEMSTREAM_LLM__* is a configuration error; with
    them the nested settings are read from the environment."""
    from pydantic import ValidationError

    from memstream.schemas.settings import Settings

    monkeypatch.setenv("MEMSTREAM_EXTRACTOR", "rules+llm")
    with pytest.raises(ValidationError, match="MEMSTREAM_LLM__BASE_URL"):
        Settings()
    monkeypatch.setenv("MEMSTREAM_LLM__BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MEMSTREAM_LLM__MODEL", "m1")
    s = Settings()
    assert s.llm is not None and s.llm.model == "m1" and s.llm.timeout_s == 10.0

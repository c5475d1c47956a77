"""How a Qdrant Edge point's record is read back: stored as one JSON string since 2026-11-25,
as a JSON object before; anything else reads as an empty record, never an error."""

from __future__ import annotations

from memstream.storage.edge_layout import stored_record


def test_a_record_stored_as_a_json_string_is_decoded() -> None:
    """The current layout: one JSON string."""
    assert stored_record({"record": '{"text":"tea","tags":["a"]}'}) == {
        "text": "tea",
        "tags": ["a"],
    }


def test_a_record_stored_as_an_object_before_is_read_as_is() -> None:
    """The layout of shards written before: a JSON object."""
    assert stored_record({"record": {"text": "tea"}}) == {"text": "tea"}


def test_a_missing_or_damaged_record_reads_as_empty() -> None:
    """No payload, no record, JSON that does not parse or is not an object: an empty record."""
    for payload in (None, {}, {"record": "{not json"}, {"record": "[1, 2]"}, {"record": 7}):
        assert stored_record(payload) == {}

"""The redactor's fast paths use private names of google-re2 and of the standard library
(pipeline/redact/_core.py). pyproject.toml pins google-re2 to the 1.1 line they were tested
with; these tests fail loudly, naming the internal, when an upgrade changes one of them."""

from __future__ import annotations

import collections

import re2

from memstream.pipeline.redact import _core


def test_re2_compiled_pattern_exposes_the_regexp_and_its_match() -> None:
    """``re2.compile(...)._regexp.Match(anchor, bytes, pos, end)`` returns per-group byte
    spans, (-1, -1) when nothing matched: the contract Regex.search and find_all rely on."""
    compiled = re2.compile(r"(b+)(x)?")
    regexp = getattr(compiled, "_regexp", None)
    assert regexp is not None, "google-re2 no longer exposes _regexp on compiled patterns"
    anchor = getattr(getattr(re2, "_Anchor", None), "UNANCHORED", None)
    assert anchor is not None, "google-re2 no longer has _Anchor.UNANCHORED"
    spans = regexp.Match(anchor, b"aabbbc", 0, 6)
    assert [tuple(s) for s in spans] == [(2, 5), (2, 5), (-1, -1)]
    miss = regexp.Match(anchor, b"zzz", 0, 3)
    assert tuple(miss[0]) == (-1, -1)


def test_the_wrapper_agrees_with_the_fast_path() -> None:
    """Regex.search (private fast path) and the public google-re2 search find the same spans."""
    fast = _core.compile_re2(r"[a-z]+@[a-z]+\.com")
    text = "write to ann@example.com or bob@test.com today"
    for pos in range(0, len(text), 7):
        public = re2.compile(r"[a-z]+@[a-z]+\.com").search(text, pos)
        ours = fast.search(text, pos)
        assert (public is None) == (ours is None)
        if public is not None and ours is not None:
            assert public.span() == ours.span()


def test_collections_count_elements_counts_into_a_dict() -> None:
    """``collections._count_elements(mapping, iterable)``, the C loop behind Counter, used by
    shannon_entropy."""
    count = getattr(collections, "_count_elements", None)
    assert count is not None, "collections._count_elements is gone from this Python"
    counts: dict[str, int] = {}
    count(counts, "abracadabra")
    assert counts == {"a": 5, "b": 2, "r": 2, "c": 1, "d": 1}
    assert _core.shannon_entropy("aabb") == 1.0

"""Span arithmetic between the original text and a text rendered with placeholders.

Detection runs to a fixed point: each round detects on the text rendered so far (earlier
spans replaced by placeholders), so what it finds has offsets in the rendered text, and the
next round must know where every placeholder lies. These functions map offsets both ways;
they hold no state and know nothing of the detectors (``Redactor`` in ``__init__`` does).
A rendered placeholder is ``[LABEL:8 hex]``: ``len(label) + 11`` characters.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import NamedTuple

from memstream.pipeline.redact._core import Candidate


class Span(NamedTuple):
    """A redacted range of the original text (end exclusive) and its label."""

    start: int
    end: int
    label: str


def overlaps(c: Candidate, protected: list[tuple[int, int]]) -> bool:
    """Whether ``c`` touches one of the sorted, disjoint ranges ``protected``."""
    i = bisect.bisect_right(protected, (c.start, 1 << 62))
    if i and protected[i - 1][1] > c.start:
        return True
    return i < len(protected) and protected[i][0] < c.end


def rendered(fresh: list[Span], spans: list[Span]) -> list[tuple[int, int]]:
    """Offsets, in the rendered text, of the placeholders of ``fresh`` (a subset of spans)."""
    wanted = set(fresh)
    out: list[tuple[int, int]] = []
    shift = 0
    for s in spans:
        length = len(s.label) + 11  # "[" label ":" 8 hex "]"
        if s in wanted:
            out.append((s.start + shift, s.start + shift + length))
        shift += length - (s.end - s.start)
    return out


def all_placeholders(existing: list[tuple[int, int]], spans: list[Span]) -> list[tuple[int, int]]:
    """Offsets of every placeholder in the text rendered from ``spans``: those rendered for
    ``spans`` and those already in the original text (``existing``; spans never overlap
    them). Nothing else in the rendered text can match the placeholder pattern: a match has
    no brackets inside, so one touching a rendered placeholder is that placeholder."""
    out: list[tuple[int, int]] = []
    shift = 0
    i = 0
    for s in spans:
        while i < len(existing) and existing[i][0] < s.start:
            out.append((existing[i][0] + shift, existing[i][1] + shift))
            i += 1
        length = len(s.label) + 11  # "[" label ":" 8 hex "]"
        out.append((s.start + shift, s.start + shift + length))
        shift += length - (s.end - s.start)
    out.extend((a + shift, b + shift) for a, b in existing[i:])
    return out


def to_original(found: Iterable[Candidate], done: list[Span]) -> list[Span]:
    """Map spans found in the rendered text (placeholders in place of ``done``) to the original.

    Found spans never overlap a placeholder, so each lies in original text shifted by the
    length differences of the placeholders before it.
    """
    bounds: list[tuple[int, int]] = []  # (rendered start of placeholder, total shift after it)
    shift = 0
    for s in done:
        rs = s.start + shift
        shift += len(s.label) + 11 - (s.end - s.start)
        bounds.append((rs, shift))
    out: list[Span] = []
    for c in found:
        before = 0
        for rs, sh in bounds:
            if rs < c.start:
                before = sh
        out.append(Span(c.start - before, c.end - before, c.label))
    return out

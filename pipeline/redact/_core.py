"""Shared pieces of the redactor: candidate spans, overlap resolution, entropy, RE2 compilation."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import re2

# RE2 options used everywhere: no logging of compile errors to stderr, large enough memory
# budget for the rule set. RE2 guarantees linear-time matching, which is what lets untrusted
# text through without a timeout.
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = 64 << 20

Pattern = Any  # re2._Regexp has no public type


def compile_re2(pattern: str) -> Pattern:
    """Compile with RE2 (linear time); raises ``re2.error`` on syntax RE2 does not support."""
    return re2.compile(pattern, options=_OPTIONS)


class Candidate(NamedTuple):
    """A detection before overlap resolution: offsets into the scanned text, end exclusive."""

    start: int
    end: int
    label: str
    priority: int


Detector = Callable[[str, str], Iterable[Candidate]]
"""A detector gets the text and its lower-cased copy and yields candidates."""

# Priorities: higher wins an overlap. Structured secrets first, then validated identifiers,
# then keyword/cue heuristics.
P_DENY = 100
P_PRIVATE_KEY = 90
P_TOKEN = 80  # provider tokens, JWTs
P_VALIDATED = 70  # checksummed numbers, emails, IPs
P_CREDENTIAL = 60  # URL credentials, assignments
P_PHONE = 50
P_ID = 45
P_ADDRESS = 30
P_PERSON = 20


def resolve(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Non-overlapping subset: by priority, then length, then position; sorted by start."""
    ordered = sorted(candidates, key=lambda c: (-c.priority, -(c.end - c.start), c.start))
    chosen: list[Candidate] = []
    for cand in ordered:
        if cand.end <= cand.start:
            continue
        if any(cand.start < other.end and other.start < cand.end for other in chosen):
            continue
        chosen.append(cand)
    chosen.sort(key=lambda c: c.start)
    return chosen


def shannon_entropy(value: str) -> float:
    """Shannon entropy in bits per character (gitleaks' measure)."""
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


def luhn_ok(digits: str) -> bool:
    """Luhn (mod 10) checksum over a string of digits."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


_UNANCHORED = re2._Anchor.UNANCHORED
_bytes_to_chars = re2._re2.BytesToCharLen


class Match:
    """A light match: spans of every group in str offsets, with ``re``-like accessors."""

    __slots__ = ("_spans", "_text")

    def __init__(self, text: str, spans: list[tuple[int, int]]) -> None:
        self._text = text
        self._spans = spans

    def span(self, group: int = 0) -> tuple[int, int]:
        return self._spans[group]

    def start(self, group: int = 0) -> int:
        return self._spans[group][0]

    def end(self, group: int = 0) -> int:
        return self._spans[group][1]

    def group(self, group: int = 0) -> str | None:
        s, e = self._spans[group]
        return None if s < 0 else self._text[s:e]


def finditer(regex: Pattern, text: str, pos: int = 0, endpos: int | None = None) -> list[Match]:
    """All non-overlapping matches, like ``regex.finditer`` but with less per-match overhead.

    The google-re2 wrapper maps byte offsets to str offsets with a Python loop per match;
    here the text is encoded once and offsets are converted incrementally, in C.
    """
    ascii_text = text.isascii()
    data = text.encode("utf-8")
    if ascii_text:
        bpos, bend = pos, len(data) if endpos is None else endpos
    else:
        bpos = len(text[:pos].encode("utf-8"))
        bend = len(data) if endpos is None else len(text[:endpos].encode("utf-8"))
    match = regex._regexp.Match
    out: list[Match] = []
    last_b = last_c = 0
    while bpos <= bend:
        spans = match(_UNANCHORED, data, bpos, bend)
        s0, e0 = spans[0]
        if s0 < 0:
            break
        if ascii_text:
            out.append(Match(text, spans))
        else:
            conv: list[tuple[int, int]] = []
            for s, e in spans:
                if s < 0:
                    conv.append((-1, -1))
                    continue
                pair = []
                for off in (s, e):
                    if off >= last_b:
                        last_c += _bytes_to_chars(data, last_b, off)
                        last_b = off
                        pair.append(last_c)
                    else:
                        pair.append(len(data[:off].decode("utf-8")))
                conv.append((pair[0], pair[1]))
            out.append(Match(text, conv))
        bpos = e0 + 1 if e0 == s0 else e0
    return out

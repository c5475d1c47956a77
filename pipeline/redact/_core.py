"""Shared pieces of the redactor: candidate spans, overlap resolution, entropy, RE2 compilation."""

from __future__ import annotations

import bisect
import math
from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple, overload

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
    return Regex(re2.compile(pattern, options=_OPTIONS))


class Regex:
    """A compiled RE2 pattern with a cheaper ``search`` than the google-re2 wrapper's.

    The wrapper costs several microseconds per call (argument checks, byte/str offset
    conversion in Python); ASCII text, the common case, needs no conversion at all.
    """

    __slots__ = ("_compiled", "_regexp", "groups", "pattern")

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled
        self._regexp = compiled._regexp
        self.groups: int = compiled.groups
        self.pattern: str = compiled.pattern

    def search(self, text: str, pos: int = 0, endpos: int | None = None) -> Match | None:
        _, data, ends, _ = _encoded(text)
        if ends is not None:  # non-ASCII: let the wrapper map the offsets
            m = self._compiled.search(text, pos, len(text) if endpos is None else endpos)
            return None if m is None else Match(text, [m.span(g) for g in range(self.groups + 1)])
        end = len(text) if endpos is None else min(endpos, len(text))
        if pos > end:
            return None
        spans = self._regexp.Match(_UNANCHORED, data, pos, end)
        return None if spans[0][0] < 0 else Match(text, spans)

    def sub(self, repl: str, text: str) -> str:
        return str(self._compiled.sub(repl, text))


class Solo(NamedTuple):
    """A trigger searched on its own rather than in the shared set. Runs of a character class
    (``[a-z0-9+/]{32}``) multiply the states of the set's DFA and slow every search of the
    set; searched alone, each is a small DFA that stops at its first match."""

    pattern: str


Trigger = str | Solo
"""A detector's trigger: an RE2 pattern for the shared set, or a ``Solo`` pattern."""


class TriggerSet:
    """Which of several triggers occur in a text: ``Solo`` patterns by one search each, the
    others as one RE2 set (one linear pass)."""

    def __init__(self, triggers: list[Trigger]) -> None:
        self._solos: list[tuple[int, Any]] = []
        self._in_set: list[int] = []
        options = re2.Options()
        options.log_errors = False
        self._set = re2.Set.SearchSet(options)
        for i, t in enumerate(triggers):
            if isinstance(t, Solo):
                self._solos.append((i, compile_re2(t.pattern)._regexp))
                continue
            if self._set.Add(t) < 0:
                raise re2.error(f"invalid trigger pattern: {t!r}")
            self._in_set.append(i)
        self._set.Compile()

    def Match(self, text: str) -> list[int]:
        """Indices of the triggers that occur in ``text``, ascending."""
        if not (self._solos or self._in_set):
            return []
        data = text.encode("utf-8")
        found = [self._in_set[k] for k in self._set.Match(data) or ()] if self._in_set else []
        for i, regexp in self._solos:
            if regexp.Match(_UNANCHORED, data, 0, len(data))[0][0] >= 0:
                found.append(i)
        found.sort()
        return found


def compile_set(triggers: list[Trigger]) -> TriggerSet:
    return TriggerSet(triggers)


class Candidate(NamedTuple):
    """A detection before overlap resolution: offsets into the scanned text, end exclusive.

    ``check``: a costly confirmation left to ``resolve``, which calls it only for a candidate
    that nothing of higher priority has already covered (one that would lose anyway is never
    scored). A candidate whose check fails is dropped as if it had never been found.
    """

    start: int
    end: int
    label: str
    priority: int
    check: Callable[[], bool] | None = None


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
    if not ordered:
        return []
    taken = bytearray(max(c.end for c in ordered))  # 1 where a chosen candidate lies
    chosen: list[Candidate] = []
    for cand in ordered:
        if cand.end <= cand.start or cand.start < 0:
            continue
        if taken.find(1, cand.start, cand.end) >= 0:
            continue
        if cand.check is not None and not cand.check():
            continue
        taken[cand.start : cand.end] = b"\x01" * (cand.end - cand.start)
        chosen.append(cand)
    chosen.sort(key=lambda c: c.start)
    return chosen


# c * log2(c) for small counts: entropy is computed for every token candidate
_CLOG = [0.0] + [c * math.log2(c) for c in range(1, 1025)]


def shannon_entropy(value: str) -> float:
    """Shannon entropy in bits per character (gitleaks' measure)."""
    if not value:
        return 0.0
    n = len(value)
    counts: dict[str, int] = {}
    _count_elements(counts, value)  # Counter's C counting loop, without Counter's overhead
    if n < len(_CLOG):
        total = sum(map(_CLOG.__getitem__, counts.values()))
    else:
        total = sum(c * math.log2(c) for c in counts.values())
    return max(0.0, math.log2(n) - total / n)


DIGITS = b"0123456789"
UPPERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LOWERS = b"abcdefghijklmnopqrstuvwxyz"


def count_ascii(value: str, chars: bytes) -> int:
    """How many characters of ``value`` are among the ASCII ``chars`` (counted in C)."""
    data = value.encode("utf-8")
    return len(data) - len(data.translate(None, chars))


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

    @overload
    def group(self) -> str: ...
    @overload
    def group(self, group: Literal[0]) -> str: ...
    @overload
    def group(self, group: int) -> str | None: ...
    def group(self, group: int = 0) -> str | None:
        """The text of a group (group 0, the whole match, is always there); None when the
        group did not take part in the match."""
        s, e = self._spans[group]
        return None if s < 0 else self._text[s:e]


PLACEHOLDER = r"\[[A-Z][A-Z0-9_]{0,31}:[0-9a-f]{8}\]"
_PLACEHOLDER_RE: Any = None
_last_placeholders: tuple[str, list[tuple[int, int]]] = ("", [])


def placeholders(text: str) -> list[tuple[int, int]]:
    """Spans of the placeholders in ``text`` (kept for the last text: detectors share it)."""
    global _PLACEHOLDER_RE, _last_placeholders
    if "[" not in text:
        return []
    cached = _last_placeholders
    if cached[0] is text:
        return cached[1]
    if _PLACEHOLDER_RE is None:
        _PLACEHOLDER_RE = compile_re2(PLACEHOLDER)
    spans = [m.span() for m in finditer(_PLACEHOLDER_RE, text)]
    _last_placeholders = (text, spans)
    return spans


def known_placeholders(text: str, spans: list[tuple[int, int]]) -> None:
    """Record ``spans`` as the placeholders of ``text`` (the caller rendered them), so that
    ``placeholders(text)`` does not scan for them."""
    global _last_placeholders
    _last_placeholders = (text, spans)


def in_placeholder(spans: list[tuple[int, int]], pos: int) -> bool:
    """True when ``pos`` lies inside one of ``spans`` (sorted, disjoint)."""
    if not spans:
        return False
    i = bisect.bisect_right(spans, (pos, 1 << 62))
    return i > 0 and spans[i - 1][1] > pos


# The detectors scan one text many times: its UTF-8 form (and, for non-ASCII text, a table
# to map byte offsets back to str offsets) is kept for the last two texts seen (a text and
# its copy with blanked placeholders, see ``blank_placeholders``). One tuple, replaced
# atomically, so concurrent callers at worst recompute it.
_Encoded = tuple[str, bytes, list[int] | None, list[int]]
_EMPTY: _Encoded = ("", b"", None, [])
_last_encoded: tuple[_Encoded, _Encoded] = (_EMPTY, _EMPTY)
# 1 at the lead byte of each multi-byte UTF-8 sequence (0xC0-0xFF), 0 elsewhere
_LEAD_BYTES = bytes(int(b >= 0xC0) for b in range(256))


def _encoded(text: str) -> _Encoded:
    last, previous = _last_encoded
    if last[0] is text:
        return last
    if previous[0] is text:
        return previous
    data = text.encode("utf-8")
    ends: list[int] | None = None
    extra: list[int] = []
    if len(data) != len(text):
        # byte offset just past each non-ASCII character, and the extra bytes up to there:
        # the lead bytes of the UTF-8 form are found with C-level finds (non-ASCII characters
        # are few, so finding them beats a character-class scan over every character)
        ends = []
        total = 0
        leads = data.translate(_LEAD_BYTES)
        i = leads.find(1)
        while i >= 0:
            lead = data[i]
            width = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            total += width - 1
            ends.append(i + width)
            extra.append(total)
            i = leads.find(1, i + width)
    value: _Encoded = (text, data, ends, extra)
    if len(text) > 256:
        _set_last_encoded(value)
    return value


def _set_last_encoded(value: _Encoded) -> None:
    global _last_encoded
    _last_encoded = (value, _last_encoded[0])


_last_blanked: tuple[str, list[tuple[int, int]], str] = ("", [], "")


def blank_placeholders(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with the inside of each placeholder (``spans``) blanked: same length and
    offsets, but nothing in ``[API_KEY:0123abcd]`` left to match (a name, ``:``, a value)."""
    if not spans:
        return text
    global _last_blanked
    cached = _last_blanked
    if cached[0] is text and cached[1] is spans:
        return cached[2]  # the detectors of one pass share it
    parts: list[str] = []
    pos = 0
    for s, e in spans:
        parts.append(text[pos : s + 1])
        parts.append(" " * (e - s - 2))
        pos = e - 1
    parts.append(text[pos:])
    blanked = "".join(parts)
    if len(text) > 256:
        # placeholders are ASCII: the non-ASCII table of the text holds for the copy
        _, _, ends, extra = _encoded(text)
        _set_last_encoded((blanked, blanked.encode("utf-8"), ends, extra))
    _last_blanked = (text, spans, blanked)
    return blanked


def finditer(regex: Pattern, text: str, pos: int = 0, endpos: int | None = None) -> list[Match]:
    """All non-overlapping matches, like ``regex.finditer`` but with less per-match overhead.

    The google-re2 wrapper maps byte offsets to str offsets with a Python loop per match;
    here the text is encoded once per text and offsets map back through a table of its
    non-ASCII characters (none for ASCII text, the common case).
    """
    _, data, ends, extra = _encoded(text)
    if ends is None:
        bpos, bend = pos, len(data) if endpos is None else endpos
    else:
        bpos = len(text[:pos].encode("utf-8"))
        bend = len(data) if endpos is None else len(text[:endpos].encode("utf-8"))
    match = regex._regexp.Match
    out: list[Match] = []
    while bpos <= bend:
        spans = match(_UNANCHORED, data, bpos, bend)
        s0, e0 = spans[0]
        if s0 < 0:
            break
        if ends is None:
            out.append(Match(text, spans))
        else:
            conv: list[tuple[int, int]] = []
            for s, e in spans:
                if s < 0:
                    conv.append((-1, -1))
                    continue
                i = bisect.bisect_right(ends, s)
                j = bisect.bisect_right(ends, e, i)
                conv.append((s - (extra[i - 1] if i else 0), e - (extra[j - 1] if j else 0)))
            out.append(Match(text, conv))
        bpos = e0 + 1 if e0 == s0 else e0
    return out

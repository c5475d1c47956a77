"""Rule-based extraction of typed memory candidates (no LLM).

Each rule is a cue pattern over one sentence, with the memory type it implies,
a base salience and who may say it (user messages only, or also the final
assistant message, for the agent-learning tiers). A sentence becomes a typed
candidate when its salience reaches the threshold; everything else stays in
the turn's episode only.

``Extractor`` is the port: an LLM-based extractor implements the same method
and can replace or complement ``RuleExtractor``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from memstream.pipeline.redact._core import Trigger, compile_set
from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.ids import derived_id
from memstream.schemas.memory import Candidate, MemoryType, Owner, Scope

# A sentence ends at . ! or ? followed by white space (or the end), or at a line break: a dot
# inside a token (an email, a URL, a version, a decimal) never splits it. Written with
# possessive runs so that every character is looked at once: the lazy form
# ``\S.*?(?:[.!?]+(?=\s|$)|(?=\n)|$)`` retried each position of a run of dots that is not
# followed by a space (quadratic in the length of the run).
_SENTENCE = re.compile(r"\S(?:[^.!?\n]++|[.!?]++(?=\S))*+(?:[.!?]++)?")
# Longer sentences are not typed memories (they stay in the turn's episode): this bounds the
# size of a candidate, and so the work of the later stages, whatever a message holds.
MAX_SENTENCE_CHARS = 2_000
_NOISE = re.compile(
    r"^\s*(ok(ay)?|thanks?( you)?|thx|cool|great|nice|sure|yes|no|hi|hello|hey|"
    r"bye|lol|haha|got it|sounds good)\W*$",
    re.I,
)


class Extractor(Protocol):
    """Turns a turn event into typed candidates (not episodes)."""

    def candidates(self, event: TurnEvent) -> list[Candidate]:
        """Typed candidates found in the turn; deterministic ids; may be empty."""


class Matcher(Protocol):
    """What a rule needs of its cue: ``re.Pattern.search`` (a truthy result is a match)."""

    def search(self, string: str, /) -> object: ...


@dataclass(frozen=True, slots=True)
class _Ordered:
    """``a.*b`` in linear time: the earliest ``a``, then ``b`` anywhere after it. As a regex,
    ``.*`` scans to the end once per occurrence of ``a`` (quadratic over "first first ...");
    a ``b`` follows some ``a`` exactly when one follows the earliest."""

    first: re.Pattern[str]
    then: re.Pattern[str]

    def search(self, string: str, /) -> bool:
        m = self.first.search(string)
        return m is not None and self.then.search(string, m.end()) is not None


@dataclass(frozen=True, slots=True)
class _AnyOf:
    """Any of several matchers (a regex alternation that mixes in an ``_Ordered``)."""

    options: tuple[Matcher, ...]

    def search(self, string: str, /) -> bool:
        return any(o.search(string) for o in self.options)


@dataclass(frozen=True, slots=True)
class Rule:
    type: MemoryType
    pattern: Matcher
    salience: float
    importance: float
    assistant_too: bool = False
    scope: Scope = Scope.USER


def _r(expr: str) -> re.Pattern[str]:
    return re.compile(expr, re.I)


RULES: tuple[Rule, ...] = (
    Rule(
        MemoryType.RULE,
        _r(
            r"^\s*(please )?(always|never)\b|\b(you|we) (should|must) (always|never)\b"
            r"|\bdon'?t ever\b|\bmake sure (to|that) you\b"
        ),
        0.8,
        0.8,
    ),
    Rule(MemoryType.PROFILE, _r(r"\b(my name is|i am called|i'?m called)\b"), 0.9, 0.8),
    Rule(
        MemoryType.PROFILE,
        _r(r"\bi (work|am working) (at|for|as)\b|\bi'?m an? \w+ (at|by)\b"),
        0.8,
        0.7,
    ),
    Rule(MemoryType.PROFILE, _r(r"\bi (live|grew up) in\b|\bi'?m from\b|\bi am from\b"), 0.8, 0.7),
    Rule(
        MemoryType.PREFERENCE,
        _r(
            r"\bi (really |strongly |much )?(prefer|like|love|enjoy|hate|dislike|can'?t stand)\b"
            r"|\bmy favou?rite\b|\bi'?d rather\b"
        ),
        0.75,
        0.6,
    ),
    Rule(
        MemoryType.DECISION,
        _r(
            r"\bwe (decided|agreed|chose|settled on|are going with|will go with)\b"
            r"|\blet'?s go with\b|\bthe decision (is|was)\b|\bi (decided|chose) to\b"
        ),
        0.75,
        0.7,
        assistant_too=True,
        scope=Scope.PROJECT,
    ),
    Rule(MemoryType.FACT, _r(r"\bmy (\w+ ){0,2}(is|are) \S"), 0.6, 0.6),
    Rule(
        MemoryType.FIX,
        _r(
            r"\bthe (fix|solution|workaround) (was|is)\b|\bfixed (it|this|that) by\b"
            r"|\bresolved (it |this )?by\b"
        ),
        0.8,
        0.7,
        assistant_too=True,
        scope=Scope.PROJECT,
    ),
    Rule(
        MemoryType.TODO,
        _r(
            r"\btodo\b|\bremind me (to|about)\b|\bdon'?t (let me )?forget to\b"
            r"|\bi need to\b"
        ),
        0.7,
        0.6,
    ),
    Rule(
        MemoryType.LESSON_LEARNED,
        _r(
            r"\blesson(s)? learned\b|\bnext time,? (we|i) should\b"
            r"|\bi learned that\b"
        ),
        0.75,
        0.7,
        assistant_too=True,
    ),
    Rule(
        MemoryType.SKILL_HEURISTIC,
        _r(r"\b(rule of thumb|a good trick|pro tip|tip:)"),
        0.7,
        0.6,
        assistant_too=True,
    ),
    Rule(
        MemoryType.TASK_BLUEPRINT,
        _AnyOf(
            (
                _r(r"\bthe steps (are|to)\b|\bstep 1\b"),
                _Ordered(_r(r"\bfirst,? "), _r(r" then\b")),  # first ... then
            )
        ),
        0.6,
        0.6,
        assistant_too=True,
        scope=Scope.PROJECT,
    ),
    Rule(
        MemoryType.DOMAIN_PATTERN,
        _r(r"\b(in general|typically|as a rule),? (in|for|with)\b"),
        0.6,
        0.5,
        assistant_too=True,
        scope=Scope.PROJECT,
    ),
)


def _cues(m: Matcher) -> tuple[str, ...]:
    """Regexes of which one matches wherever ``m`` does."""
    if isinstance(m, re.Pattern):
        return (m.pattern,)
    if isinstance(m, _Ordered):
        return (m.first.pattern,)
    if isinstance(m, _AnyOf):
        return tuple(c for o in m.options for c in _cues(o))
    raise TypeError(f"no cue for {m!r}: a new matcher needs its own case here")


_LOOSER = (  # Python syntax -> RE2 that matches at least where the original does
    (r"^\s*", ""),  # unanchored, the rest is found wherever it starts
    (r"\b", ""),  # RE2's \b is ASCII-only: without it, a superset
    (r"\w", r"[^\s]"),  # RE2's \w is ASCII-only; a word character is never a space
    (r"\S", r"[^\s]"),  # RE2's \s is ASCII-only: [^\s] takes every Unicode space too
)


def _loosened(expr: str) -> str:
    """``expr`` (a rule's case-insensitive cue) as an RE2 pattern that matches every text
    ``expr`` matches, perhaps more. Refuses syntax it has no rule for, so that a new cue
    cannot make the screen skip a sentence its rule would take."""
    for python, looser in _LOOSER:
        expr = expr.replace(python, looser)
    if "\\" in expr.replace(r"[^\s]", "") or "$" in expr:
        raise ValueError(f"no RE2 screen for the cue {expr!r}: extend _LOOSER")
    return "(?i)" + expr


# re.I lets "i" match the dotted and dotless capitals of Turkish, which RE2's case folding
# does not: the screen reads them as "i" (one character for one: offsets stay put)
_SCREEN_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i"})


class _Screen:
    """Which rules may match a sentence, in one linear RE2 pass over it, before any rule's
    own regex runs: ~2 us a sentence against ~40 for every rule's ``re`` search, and most
    sentences match no rule. The rules' own patterns still decide (``candidates``)."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        owners: list[int] = []
        cues: list[Trigger] = []
        for ri, rule in enumerate(rules):
            for cue in _cues(rule.pattern):
                cues.append(_loosened(cue))
                owners.append(ri)
        self._set = compile_set(cues)
        self._owners = owners

    def rules(self, sentence: str) -> list[int]:
        """Indices of the rules that may match ``sentence``, ascending (the rules' order)."""
        if not sentence.isascii():
            sentence = sentence.translate(_SCREEN_FOLD)
        found = self._set.Match(sentence)
        return sorted({self._owners[k] for k in found}) if found else found


_SCREEN = _Screen(RULES)

_FACT_KEY = re.compile(r"\bmy ((?:\w+ ){0,2}?\w+) (?:is|are)\b", re.I)


def fact_key(sentence: str) -> str | None:
    """``my home city is Lisbon`` -> ``home city``: the subject facts are updated by."""
    m = _FACT_KEY.search(sentence)
    return m.group(1).lower() if m else None


def _speaker_allowed(rule: Rule, message: Message) -> bool:
    return message.role is Role.USER or (rule.assistant_too and message.role is Role.ASSISTANT)


@dataclass(frozen=True)
class RuleExtractor:
    """Cue rules over sentences; ``threshold`` gates weak candidates out."""

    threshold: float = 0.55
    max_per_turn: int = 8
    screened: bool = True  # False: every rule's regex on every sentence (the screen's reference)

    def candidates(self, event: TurnEvent) -> list[Candidate]:
        from memstream.pipeline.extract import keep  # one definition of "kept message"

        owner = Owner(tenant=event.tenant, user=event.user, agent=event.agent)
        out: list[Candidate] = []
        seen: set[tuple[str, str]] = set()
        for mi, message in enumerate(event.messages):
            if not keep(message):
                continue
            for si, sm in enumerate(_SENTENCE.finditer(message.content)):
                sentence = sm.group(0).strip()
                if not 8 <= len(sentence) <= MAX_SENTENCE_CHARS or _NOISE.match(sentence):
                    continue
                maybe = _SCREEN.rules(sentence) if self.screened else range(len(RULES))
                for rule in (RULES[ri] for ri in maybe):
                    if not _speaker_allowed(rule, message) or not rule.pattern.search(sentence):
                        continue
                    salience = min(1.0, rule.salience + (0.05 if len(sentence) > 40 else 0.0))
                    if salience < self.threshold or (rule.type.value, sentence) in seen:
                        continue
                    seen.add((rule.type.value, sentence))
                    meta = dict(event.metadata)
                    key = fact_key(sentence) if rule.type is MemoryType.FACT else None
                    if key:
                        meta["fact_key"] = key
                    out.append(
                        Candidate(
                            candidate_id=derived_id(
                                event.tenant, event.event_id, rule.type.value, f"{mi}.{si}"
                            ),
                            owner=owner,
                            app=event.app,
                            project=event.project,
                            session=event.session,
                            type=rule.type,
                            scope=rule.scope,
                            content=sentence,
                            salience=salience,
                            confidence=0.7,
                            importance=rule.importance,
                            source_event_id=event.event_id,
                            occurred_at=event.occurred_at,
                            metadata=meta,
                            tags=list(event.tags),
                        )
                    )
                    break  # one type per sentence: the first (most specific) rule wins
                if len(out) >= self.max_per_turn:
                    return out
        return out

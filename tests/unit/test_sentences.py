"""The sentence splitter and the cue rules stay linear in the size of a message."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.pipeline.extract import extract
from memstream.pipeline.rules import _SENTENCE, MAX_SENTENCE_CHARS, RULES
from memstream.schemas.events import Message, TurnEvent

# the splitter's definition as a lazy regex (quadratic on runs of dots not followed by a space)
_REFERENCE = re.compile(r"\S(?:.*?)(?:[.!?]+(?=\s|$)|(?=\n)|$)", re.S)
_BLUEPRINT = re.compile(r"\bthe steps (are|to)\b|\bstep 1\b|\bfirst,? .* then\b", re.I)


def spans(pattern: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    return [m.span() for m in pattern.finditer(text)]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="ab .!?\n\t\r,", max_size=60))
def test_splitter_matches_its_definition(text: str) -> None:
    """The linear splitter cuts every text exactly where the lazy reference regex does."""
    assert spans(_SENTENCE, text) == spans(_REFERENCE, text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["first", "first,", "then", "x", "thenx", "step 1"]), max_size=12))
def test_first_then_cue_matches_its_regex(words: list[str]) -> None:
    """The linear 'first ... then' cue agrees with the backtracking regex it replaces."""
    text = " ".join(words)
    blueprint = next(r for r in RULES if r.type.value == "task_blueprint")
    assert bool(blueprint.pattern.search(text)) == bool(_BLUEPRINT.search(text))


def _extract_seconds(content: str) -> float:
    event = TurnEvent(tenant="t", user="u", messages=[Message(role="user", content=content)])
    started = time.perf_counter()
    extract(event)
    return time.perf_counter() - started


def test_extract_is_linear_on_hostile_messages() -> None:
    """~1 MB of dots without a following space, of 'first ' cues, or of a thousand-character
    sentence repeated, each extracts in under 2 s (a quadratic splitter needs longer for 16 kB)."""
    hostile = {
        "dots": "I prefer " + "." * 990_000 + "x",
        "first": "first " * 165_000,
        "long sentences": ("I prefer " + "a" * (MAX_SENTENCE_CHARS + 1) + ". ") * 480,
    }
    for name, content in hostile.items():
        assert _extract_seconds(content) < 2.0, name


def test_extract_time_grows_linearly() -> None:
    """16x the dots costs well under the 256x a quadratic splitter needs (bound: 48x)."""
    small = min(_extract_seconds("I prefer " + "." * 16_000 + "x") for _ in range(3))
    large = min(_extract_seconds("I prefer " + "." * 256_000 + "x") for _ in range(3))
    assert large < max(small, 1e-4) * 48

"""lexical: BM25 term weights for the keyword leg of recall.

Documents become sparse vectors of BM25 term weights (term frequency saturated by k1 and
normalised by document length, ``b``, against a fixed average length); the vector index
multiplies them by an IDF, so a query vector is simply each distinct query term with weight 1.
Which documents that IDF counts is ``MEMSTREAM_IDF_SCOPE`` (tenant by default): the Qdrant
Edge adapter keeps per-tenant term statistics itself (storage/termstats.py), the server
adapter passes the scope's corpus to Qdrant's IDF (docs/recall.md).

A turn is indexed with its own words plus the words of the two turns before it in the same
session at weight 0.35: questions often name what the previous speaker said (what it is
worth on LoCoMo: docs/recall.md).

Tokens: lowercase ``\\w+`` words, English stopwords (the NLTK list) removed, Snowball
(Porter2) stems. Term ids: the first 4 bytes of blake2b of the stem, stable across processes.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from py_rust_stemmers import SnowballStemmer

_WORD = re.compile(r"\w+", re.UNICODE)
_STEMMER = SnowballStemmer("english")

# NLTK's English stopword list (179 words).
STOPWORDS = frozenset(
    """
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them their
theirs themselves what which who whom this that that'll these those am is are was were be
been being have has had having do does did doing a an the and but if or because as until
while of at by for with about against between into through during before after above below
to from up down in out on off over under again further then once here there when where why
how all any both each few more most other some such no nor not only own same so than too
very s t can will just don don't should should've now d ll m o re ve y ain aren aren't
couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma
mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't weren
weren't won won't wouldn wouldn't
""".split()
)


@dataclass(frozen=True, slots=True)
class Bm25:
    """Document weighting parameters (tuned on LoCoMo dev; see docs/recall.md)."""

    k1: float = 1.2
    b: float = 0.3
    avgdl: float = 30.0
    context_weight: float = 0.35
    context_turns: int = 2


DEFAULT = Bm25()


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    stem: str = _STEMMER.stem_word(word)
    return stem


def terms(text: str) -> list[str]:
    """Stems of the non-stopword words of ``text``, in order, repeats kept."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


@lru_cache(maxsize=4096)
def _context_terms(text: str) -> tuple[str, ...]:
    """``terms`` of an earlier turn: each episode is the context of the next two of its
    session, so the same few texts come back while a batch is indexed."""
    return tuple(terms(text))


@lru_cache(maxsize=65536)
def term_id(stem: str) -> int:
    """A stable non-negative 31-bit id for a stem."""
    return int.from_bytes(hashlib.blake2b(stem.encode(), digest_size=4).digest(), "big") >> 1


def document_vector(
    text: str, context: Sequence[str] = (), params: Bm25 = DEFAULT
) -> dict[int, float]:
    """BM25 document weights of ``text``, with ``context`` (earlier turns) at a lower weight."""
    tf: dict[str, float] = dict(Counter(terms(text)))
    length = float(sum(tf.values()))
    for ctx in context[-params.context_turns :] if params.context_turns else ():
        ctx_terms = _context_terms(ctx)
        length += params.context_weight * len(ctx_terms)
        for t in ctx_terms:
            tf[t] = tf.get(t, 0.0) + params.context_weight
    norm = params.k1 * (1.0 - params.b + params.b * length / params.avgdl)
    out: dict[int, float] = {}
    for t, f in tf.items():
        tid = term_id(t)
        out[tid] = out.get(tid, 0.0) + f * (params.k1 + 1.0) / (f + norm)
    return out


def query_vector(text: str) -> dict[int, float]:
    """Each distinct query stem with weight 1 (the index applies IDF)."""
    return {term_id(t): 1.0 for t in dict.fromkeys(terms(text))}

"""Document frequencies of keyword terms, per IDF corpus, kept next to a vector index.

Qdrant's IDF modifier counts document frequencies at query time; over a filtered corpus (one
tenant of a shared collection) that means filtering every query term's posting list on every
query. Keeping the counts as points are written turns the keyword leg into a plain dot product
(what each costs: docs/recall.md): the query's weights are multiplied by the IDF here, with
the same formula and the same corpus as the engine's (``ln((n - df + 0.5) / (df + 0.5) + 1)``,
n = points with a sparse vector in the corpus), so the scores are identical.

A corpus is a key: ``("", )`` for the collection, ``("t", tenant)`` for a tenant, and for the
"owner" scope also ``("u", tenant, user)``, ``("a", tenant, agent)`` and
``("ua", tenant, user, agent)``, matching the filters ``idf_corpus`` builds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from memstream.storage.ports import IdfScope, VectorFilter

Corpus = tuple[str, ...]


# Query terms in more than ~90% of a corpus's points (IDF below 0.1) are left out of the keyword
# search when the query has any other term: at most 0.1 x (k1 + 1) = 0.22 of a document's
# score, the same for nearly every document, against ~2.6 for a term in 7% of them, and such a
# term's posting list is the longest one the search walks (docs/recall.md).
MIN_IDF = 0.1


def idf(n: int, df: int) -> float:
    """BM25 IDF as Qdrant's modifier computes it."""
    return math.log((n - df + 0.5) / (df + 0.5) + 1.0)


class TermStats:
    """Points and per-term document counts of each corpus. Not thread-safe: the owner
    serialises writes (reads may interleave with them)."""

    __slots__ = ("_df", "_n", "scope")

    def __init__(self, scope: IdfScope) -> None:
        self.scope = scope
        self._df: dict[Corpus, dict[int, int]] = {}
        self._n: dict[Corpus, int] = {}

    def corpora(self, tenant: str, user: str | None, agent: str | None) -> list[Corpus]:
        """Every corpus a point of this owner belongs to."""
        if self.scope == "collection":
            return [("",)]
        keys: list[Corpus] = [("t", tenant)]
        if self.scope == "owner":
            if user is not None:
                keys.append(("u", tenant, user))
            if agent is not None:
                keys.append(("a", tenant, agent))
            if user is not None and agent is not None:
                keys.append(("ua", tenant, user, agent))
        return keys

    def corpus_of(self, flt: VectorFilter) -> Corpus:
        """The corpus a search with ``flt`` takes its statistics from (see ``idf_corpus``):
        session, type, time and tag filters never change it."""
        if self.scope == "collection":
            return ("",)
        if self.scope == "owner":
            if flt.user is not None and flt.agent is not None:
                return ("ua", flt.tenant, flt.user, flt.agent)
            if flt.user is not None:
                return ("u", flt.tenant, flt.user)
            if flt.agent is not None:
                return ("a", flt.tenant, flt.agent)
        return ("t", flt.tenant)

    def add(self, corpora: Iterable[Corpus], terms: Iterable[int], sign: int = 1) -> None:
        """Count one point with ``terms`` in (sign 1) or out of (sign -1) ``corpora``."""
        terms = tuple(terms)
        if not terms:
            return  # a point without a sparse vector is not in any keyword corpus
        for key in corpora:
            n = self._n.get(key, 0) + sign
            if n <= 0:
                self._n.pop(key, None)
                self._df.pop(key, None)
                continue
            self._n[key] = n
            df = self._df.setdefault(key, {})
            for t in terms:
                c = df.get(t, 0) + sign
                if c > 0:
                    df[t] = c
                else:
                    df.pop(t, None)

    def points(self, corpus: Corpus) -> int:
        return self._n.get(corpus, 0)

    def weigh(
        self, corpus: Corpus, query: Mapping[int, float], min_idf: float = 0.0
    ) -> dict[int, float]:
        """Query weights times IDF; terms no point of the corpus has are dropped, and so are
        terms whose IDF is below ``min_idf`` while another term is above it (a term in nearly
        every point adds almost the same to every score, but its posting list is the whole
        corpus: ``MIN_IDF``)."""
        n = self._n.get(corpus, 0)
        df = self._df.get(corpus)
        if not n or df is None:
            return {}
        out: dict[int, float] = {}
        faint: dict[int, float] = {}
        for t, w in query.items():
            d = df.get(t)
            if d:
                weight = idf(n, d)
                (out if weight >= min_idf else faint)[t] = w * weight
        return out or faint

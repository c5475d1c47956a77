"""What the Qdrant Edge adapter counts beside its shard, so that a search needs no count
from the engine: the BM25 document frequencies (``TermStats``: the adapter sends IDF-weighted
query vectors, storage/qdrant_edge.py) and when each tenant's points expire (``Expiries``: a
search adds the expiry condition only while one has expired).

Both are counted from the shard when it is opened (one scan) and moved by every write: new
points count in, the stored points a write overwrites or deletes count out. The adapter
serialises its writes, so counts and shard change together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memstream.storage.expiries import Expiries
from memstream.storage.ports import IdfScope, VectorFilter, VectorPoint
from memstream.storage.termstats import MIN_IDF, TermStats

SPARSE_NAME = "bm25"
OWNER_FIELDS = ["tenant", "user", "agent", "scope", "project"]
COUNTED_FIELDS = [*OWNER_FIELDS, "expires_at"]  # the payload fields the counts are made of


class ShardCounts:
    """The term statistics and expiries of one shard's points."""

    def __init__(self, idf_scope: IdfScope) -> None:
        self.stats = TermStats(idf_scope)
        self.expiries = Expiries()

    def _owned_terms(self, records: Sequence[Any]) -> list[tuple[list[tuple[str, ...]], list[int]]]:
        """(corpora, term ids) of each stored point (records with the owner fields and bm25)."""
        out = []
        for r in records:
            vector = (r.vector or {}).get(SPARSE_NAME)
            p = r.payload  # read once: each read converts the payload again
            if vector is None or not p:
                continue
            out.append(
                (
                    self.stats.corpora(p["tenant"], p.get("user"), p.get("agent")),
                    list(vector.indices),
                )
            )
        return out

    def _count_expiring(self, records: Sequence[Any], sign: int) -> None:
        """Count stored points (records with ``tenant`` and ``expires_at``) in or out."""
        for r in records:
            p = r.payload
            if p and p.get("expires_at") is not None:
                count = self.expiries.add if sign > 0 else self.expiries.remove
                count(p["tenant"], str(r.id), float(p["expires_at"]))

    def count_stored(self, records: Sequence[Any]) -> None:
        """Count points read from the shard (a page of the scan at load) in."""
        self._count_expiring(records, 1)
        for corpora, terms in self._owned_terms(records):
            self.stats.add(corpora, terms)

    def uncount(self, records: Sequence[Any]) -> None:
        """Take stored points that were overwritten or deleted out of the counts."""
        self._count_expiring(records, -1)
        for corpora, terms in self._owned_terms(records):
            self.stats.add(corpora, terms, -1)

    def expiring(self, tenant: str, point_id: str, at: float) -> None:
        """A point about to be written that expires at ``at``: counted before the write, so a
        search in between may check expiry needlessly, never skip it wrongly."""
        self.expiries.add(tenant, point_id, at)

    def written(self, point: VectorPoint) -> None:
        """A point written: its terms count in its corpora."""
        self.stats.add(
            self.stats.corpora(point.tenant, point.user, point.agent), point.sparse or ()
        )

    def may_expire(self, tenant: str, now: float | None) -> bool:
        """Whether a search of ``tenant`` at ``now`` needs the expiry condition: only while a
        stored point of the tenant has expired (None: no expiry filtering asked for)."""
        return now is not None and self.expiries.any_expired(tenant, now)

    def weigh(self, flt: VectorFilter, sparse: Mapping[int, float]) -> dict[int, float]:
        """The query's terms weighted by their IDF over the corpus ``flt`` reads."""
        return self.stats.weigh(self.stats.corpus_of(flt), sparse, MIN_IDF)

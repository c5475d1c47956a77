"""The Qdrant Edge engine's calls, translated, and the state the adapter keeps beside its
shard: the base of ``EdgeVectorIndex`` (storage/qdrant_edge.py), whose reads are in
storage/edge_reads.py.

Threads: single-point writes and fetches of up to 64 ids are cheaper than a hop to a thread,
so they run on the event loop; batches, flushes, searches and ``optimize`` run in
``asyncio.to_thread``, whose tail latency on a busy machine is what the loop must be spared.
A thread does not free the loop for the engine's time, though: qdrant-edge-py 0.9 holds the
interpreter lock through its calls (``benchmarks/engine_gil.py``: a 64-point update leaves
other threads ~11 % of it, a flush and ``optimize`` none), so the loop stalls for the whole
of a flush (~65 ms) and of an optimize that builds an index (~9 s at 20k points;
docs/benchmarks.md, "the engine holds the interpreter lock"). Searches of up to
``direct_search_max`` hits run on the loop while the shard is known to be nearly optimized
(at most ``inline_unoptimized_max`` points written since the last completed ``optimize()``;
unknown after a load): an indexed search then costs less than the thread hop's tail.
Otherwise an exact scan of unindexed segments would stall the loop, so they go to a thread
(where the hop lets other work in between calls). ``search_many`` (dedupe's batch of
neighbour searches, storage/edge_reads.py) runs its slices of queries on the loop whatever the
shard: each slice is short, and hops cost it more than they spared the loop. Each search
uses one engine thread (``search_threads=1``): the engine's own pool makes concurrent
searches contend for the cores and widens the tail. Figures: docs/benchmarks.md.

qdrant_edge raises bare ``Exception`` for every failure. Calls into it are wrapped here, once:
an incompatible or locked shard raises ``ConfigurationError``, anything else
``StorageUnavailable``. Wrong vector sizes and sparse indices outside 0..2**32-1 are caught
before the call (``ValueError``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import qdrant_edge as qe

from memstream.schemas.errors import ConfigurationError, MemstreamError, StorageUnavailable
from memstream.storage.edge_counts import ShardCounts
from memstream.storage.ports import IdfScope

__all__ = ["CONFIG_FILE", "EdgeEngine", "stored_dim"]

T = TypeVar("T")

_DIRECT_FETCH_MAX = 64  # ids per fetch run on the loop (cheaper than a thread hop); more go to one
CONFIG_FILE = "edge_config.json"
_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z").match


def stored_dim(path: Path, vector_name: str = "dense") -> int | None:
    """The dense vector size a shard under ``path`` was created with (read from its config
    file, without opening the shard, which a running worker holds); None if there is none."""
    try:
        config = json.loads((Path(path) / CONFIG_FILE).read_text())
        return int(config["vectors"][vector_name]["size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _engine_error(exc: Exception, action: str, path: Path) -> MemstreamError:
    text = str(exc)
    error: MemstreamError
    if "incompatible" in text.lower():
        error = ConfigurationError(f"Qdrant Edge shard {path} does not match: {text}")
    elif "WouldBlock" in text:
        error = ConfigurationError(f"Qdrant Edge shard {path} is open in another process")
    else:
        error = StorageUnavailable(f"Qdrant Edge {action} failed: {text}")
    return error


class EdgeEngine:
    """A Qdrant Edge shard under ``path``, its engine calls translated into memstream's
    errors, and the adapter's state: the base of ``EdgeVectorIndex``."""

    def __init__(
        self,
        path: Path,
        vector_name: str = "dense",
        flush_every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        direct_fetch_max: int = _DIRECT_FETCH_MAX,
        direct_search_max: int = 100,
        inline_unoptimized_max: int = 10_000,
        idf_scope: IdfScope = "tenant",
        hnsw_ef: int | None = None,
        search_threads: int = 1,
        quantize: bool = True,
        segment_kb: int | None = None,
        segments: int | None = None,
        on_optimized: Callable[[float, BaseException | None], None] | None = None,
    ) -> None:
        """``hnsw_ef``: the dense search's candidate list on HNSW-indexed segments (None: the
        engine's default); lower is faster, at some cost in recall on large tenants.
        ``search_threads``: engine threads per search (1: requests run side by side instead;
        the engine's default pool makes concurrent searches contend and widens the tail).
        ``quantize``: int8 scalar quantization of the dense vectors (kept in RAM; the top hits
        are rescored with the original vectors), for a faster dense search.
        ``segment_kb``: the largest segment ``optimize`` builds, in KB of dense vectors (a
        segment's points get their HNSW graph once it holds half as much, and the writes
        start an optimize then); None: the engine's defaults, which merge every segment
        into one (see the module docstring for what each costs).
        ``segments``: how many segments the engine's merges keep (None: its default, one
        per CPU); more keep the large segments from being merged and rebuilt again.
        ``on_optimized``: told the seconds and the error (None) of each ``optimize`` started
        by the writes themselves (logs and metrics are the caller's)."""
        self.path = Path(path)
        self.segment_kb = segment_kb
        self.segments = segments
        self.on_optimized = on_optimized
        self._due_points = 0  # points written that make an optimize due (0: never by writes)
        # points not in a graph yet: written since the last optimize that built (at load,
        # the shard's count of them, which also counts points without a sparse vector)
        self._unbuilt = 0
        self._optimizing: asyncio.Task[None] | None = None
        self.hnsw_ef = hnsw_ef
        self.search_threads = search_threads
        self.quantize = quantize
        # BM25 document frequencies (IDF is applied here) and when each tenant's points
        # expire: counted at load, moved with every write
        self._counts = ShardCounts(idf_scope)
        self._write_lock = asyncio.Lock()
        self._optimize_lock = asyncio.Lock()  # a second caller waits, then finds what is left
        self.vector_name = vector_name
        self.flush_every_s = flush_every_s
        self.direct_fetch_max = direct_fetch_max
        self.direct_search_max = direct_search_max  # limit up to which a search runs inline
        self.inline_unoptimized_max = inline_unoptimized_max
        self._since_optimize: int | None = None  # points written since; None: unknown
        self.idf_scope = idf_scope
        self._clock = clock
        self._shard: qe.EdgeShard | None = None
        self._dim = 0
        self._last_flush = 0.0

    # -- engine calls, translated -------------------------------------------------------

    def _call(self, action: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except Exception as exc:  # qdrant_edge raises bare Exception for every failure
            raise _engine_error(exc, action, self.path) from exc

    async def _in_thread(self, action: str, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(self._call, action, fn, *args)

    async def _read(self, action: str, inline: bool, fn: Callable[..., T], *args: Any) -> T:
        if inline:
            return self._call(action, fn, *args)
        return await self._in_thread(action, fn, *args)

    @property
    def searches_inline(self) -> bool:
        """Whether searches run on the event loop now: only while the shard is known to be
        nearly optimized (see the module docstring)."""
        since = self._since_optimize
        return since is not None and since <= self.inline_unoptimized_max

    @property
    def shard(self) -> qe.EdgeShard:
        if self._shard is None:
            raise ConfigurationError(f"EdgeVectorIndex({self.path}) used before ensure()")
        return self._shard

    def _check(self, vector: Sequence[float]) -> None:
        self.shard  # noqa: B018 - before ensure() this raises ConfigurationError
        if len(vector) != self._dim:
            raise ValueError(f"vector has {len(vector)} dims, the index {self._dim}")

    @staticmethod
    def _ids(ids: Sequence[str]) -> dict[str, str]:
        """Canonical uuid string -> the id as given; ValueError for a non-uuid id. Ids in
        canonical form already (all of memstream's) skip the ``uuid.UUID`` round trip."""
        return {i if _CANONICAL(i) else str(uuid.UUID(i)): i for i in ids}

    def _persisted_sparse(self) -> dict[str, Any]:
        config = json.loads((self.path / CONFIG_FILE).read_text())
        sparse = config.get("sparse_vectors") or {}
        return sparse if isinstance(sparse, dict) else {}

    def may_expire(self, tenant: str, now: float | None) -> bool:
        """Whether a search of ``tenant`` at ``now`` needs the expiry condition
        (``ShardCounts.may_expire``)."""
        return self._counts.may_expire(tenant, now)

"""A worker's index maintenance (the ``store`` role runs it beside the stage that writes the
index): deletes that did not happen, memories kept unindexed during an index outage, expiry,
the engine's optimization; and the loop that runs them (docs/topology.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from memstream.consumers import deletions, indexing
from memstream.consumers.indexproc import RemoteIndex
from memstream.consumers.logs import log
from memstream.consumers.metrics import WorkerMetrics
from memstream.consumers.outage import Backoff, is_outage
from memstream.consumers.services import ReadsServices
from memstream.consumers.stages import Deps
from memstream.schemas.errors import MemstreamError
from memstream.schemas.memory import MemoryEvent
from memstream.storage.pgports import Store


class Maintenance(ReadsServices):
    """What ``Worker`` runs besides its stages and responders to keep the index whole."""

    deps: Deps
    telemetry: WorkerMetrics
    optimizations: int
    optimized_s: float

    @property
    def pg(self) -> Store:
        return self.services.store

    async def reconcile_once(self, limit: int = 256) -> int:
        """Delete the points of memories forgotten, erased, superseded or expired whose delete
        did not happen (index down, process died: ``deletions``), then index memories kept in
        Postgres while the vector index was down: every one of them, ``limit`` at a time (an
        outage of minutes leaves thousands). Returns how many were indexed.

        Only the memories written before the round began: under a steady ingest the store
        stage always has some written and not yet marked indexed, which it indexes itself.
        A round that took those too never ended while turns kept coming: it indexed a quarter
        of a 40,000-turn benchmark's memories a second time, and no optimize or expiry ran
        meanwhile (docs/benchmarks.md, "twenty-fifth session").

        Nor the memories a store tail of this process is indexing (``Deps.indexing``): the
        round began with a few hundred in flight, and indexed each a second time. The tail
        marks them; one it could not index it leaves to the next round. Each read asks for
        that many more rows, so a page of them cannot hide the older memories behind (a
        merge puts an old memory back in flight)."""
        began = self.clock()
        if removed := await deletions.drain(self.pg, self.vectors):
            log.info("reconcile.deleted", count=removed)
        # a worker not started (the reconciler alone, in tests) has no tail in flight
        deps: Deps | None = getattr(self, "deps", None)
        busy = deps.indexing if deps is not None else {}
        done = 0
        while True:
            ask = limit + len(busy)
            page = await self.pg.unindexed(ask, written_by=began)
            pending = [m for m in page if m.id not in busy]
            if pending:
                await indexing.index(self.pg, self.vectors, self.embedder, pending)
                log.info(
                    "reconcile.indexed", count=len(pending), in_flight=len(page) - len(pending)
                )
                done += len(pending)
            if len(page) < ask or not pending:
                break
        return done

    async def sweep_once(self) -> int:
        """Purge expired memories from Postgres and the vector index; emit ``expired``."""
        removed = await self.pg.purge_expired()
        by_tenant: dict[str, list[str]] = {}
        for tenant, mid, _, _ in removed:
            by_tenant.setdefault(tenant, []).append(mid)
        for tenant, ids in by_tenant.items():
            await deletions.delete_points(self.pg, self.vectors, tenant, ids)
        for tenant, mid, user, agent in removed:
            event = MemoryEvent(
                kind="expired",
                tenant=tenant,
                user=user,
                agent=agent,
                memory_id=mid,
                at=self.deps.clock(),
            )
            await self.deps.emit(event, "sweeper", shared=True)
        if removed:
            log.info("sweep.expired", count=len(removed))
        return len(removed)

    async def maintain_once(self) -> None:
        """One maintenance round: (re)create the collection if the server came back, index
        what waited, expire what is due, and let the engine build its indexes."""
        await self.vectors.ensure(self.embedder.dim)
        await self.reconcile_once()
        await self.sweep_once()
        started = time.perf_counter()
        changed = await self._optimize()
        spent = time.perf_counter() - started
        self.telemetry.optimize_seconds.observe(spent)
        if changed:
            self._built(spent)
            log.info("vector_index.optimized", seconds=round(spent, 3))

    async def _optimize(self) -> bool:
        """``optimize``; when the shard is in an index process and the optimize would build,
        that process stops answering recall and this one answers it meanwhile, from Postgres
        (``standby_recall``): the process that builds holds its interpreter lock throughout
        (33 s at 120k points), and recall would wait for all of it. Every round first has
        the index process answer recall (idempotent): one left paused by a hand-over whose
        last step failed (NATS away) answers again within a round, with no restart."""
        index = self.vectors
        if not isinstance(index, RemoteIndex):
            return await index.optimize()
        await index.resume_recall()
        if not await index.optimize_builds():
            return await index.optimize()
        log.info("vector_index.recall_handed_over", reason="the index process optimizes")
        async with self.standby_recall():
            try:
                await index.pause_recall()  # a failure may leave it paused: resumed below
                return await index.optimize()
            finally:
                with contextlib.suppress(MemstreamError):  # else the next round resumes it
                    await index.resume_recall()

    def standby_recall(self) -> contextlib.AbstractAsyncContextManager[None]:
        raise NotImplementedError  # Worker's: it holds the NATS connection

    def _built(self, seconds: float) -> None:
        self.optimizations += 1
        self.optimized_s += seconds

    def index_optimized(self, seconds: float, error: BaseException | None) -> None:
        """An optimize the index's own writes started (``EdgeVectorIndex.on_optimized``): the
        process that holds the shard waited ``seconds`` for it."""
        self.telemetry.optimize_seconds.observe(seconds)
        if error is None:
            self._built(seconds)
            log.info("vector_index.optimized", seconds=round(seconds, 3), started_by="writes")
        else:
            log.warning("vector_index.optimize_failed", error=type(error).__name__)

    async def _left_behind(self) -> bool:
        """Whether an earlier process left memories unindexed or points undeleted (it was
        killed during an index outage, or between a delete's two writes)."""
        try:
            return bool(await self.pg.unindexed(1) or await self.pg.pending_vector_deletes(1))
        except MemstreamError:  # Postgres away: let the first round find out
            return True

    async def _reconcile_forever(self) -> None:
        """Maintenance every ``sweep_every_s``, whatever a round raises.

        A healthy wait ends early when a stage could not write to the index
        (``deps.index_behind``; set at start too when an earlier process left work behind),
        so memories kept unindexed during an outage are indexed within seconds of its end,
        not at the next interval. A round failed by an outage (the index or Postgres away) is
        tried again every 1-5 s, not woken by the deferrals meanwhile; any other failure is
        logged and tried again after a pause that doubles from 1 s up to the interval."""
        every = self.settings.sweep_every_s
        pause, failing = every, False
        backoff, outage = Backoff(1.0, every), Backoff(1.0, 5.0)
        behind = self.deps.index_behind
        while True:
            if failing:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(behind.wait(), pause)
            behind.clear()  # a deferral from now on asks for another round
            try:
                await self.maintain_once()
            except MemstreamError as exc:
                failing = True
                pause = outage.next() if is_outage(exc) else backoff.next()
                log.warning("maintenance.failed", error=type(exc).__name__, retry_in_s=pause)
            except Exception:  # noqa: BLE001 - the maintenance loop's one catch-all: it must outlive any round
                failing = True
                pause = backoff.next()
                log.exception("maintenance.error", retry_in_s=pause)
            else:
                pause, failing = every, False
                backoff.reset()
                outage.reset()

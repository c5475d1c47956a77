"""A stage consumer (or its stream) that disappears comes back by itself.

An operator deleting a durable consumer (to change a setting JetStream cannot update in place,
by mistake) or a NATS server that lost its JetStream state leaves a stage whose pull requests
are refused: it takes nothing, says so (``pull.request_refused``, MemstreamStageRefused), and
before this waited for a restart. ``Healer.heal`` re-creates what is missing, from the same
definitions ``topology.apply`` uses at start-up, without losing or needlessly redoing work:

- a stream that is gone is created empty, and so is every other stream of the project's that
  is gone too (what they held is lost with the server's state; new publishes flow again, and
  their consumers start at their beginning);
- a consumer of a work-queue stream (``MEM_STAGES``) starts at the beginning: the stream holds
  only what no stage has acked yet;
- the extract consumer of ``MEM_TURNS`` (limits retention: days of turns) starts after the
  last ack floor this process read (``note_floors``, every ``every_s``): every turn above it
  comes again (a redelivery; every write is idempotent), none below it, which were processed
  already. With no floor known, or one the stream no longer reaches, it starts at the
  beginning: the retained turns are processed again, idempotently, and a warning says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from nats.js.api import ConsumerConfig, RetentionPolicy, StreamConfig
from nats.js.errors import APIError, NotFoundError

from memstream.consumers.logs import log
from memstream.consumers.topology import after_floor, topology
from memstream.schemas.settings import Settings

HEAL_EVERY_S = 2.0  # a stage asks for a heal at most this often
FLOORS_EVERY_S = 10.0


class Healer:
    """Re-creates the streams and durable consumers of ``stages`` when they are gone."""

    def __init__(
        self,
        js: Any,
        settings: Settings,
        stages: Iterable[str],
        every_s: float = FLOORS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        topo = topology(settings)
        self.js, self.every_s, self.clock = js, every_s, clock
        self.consumers = {s: topo.consumers[s] for s in stages if s in topo.consumers}
        self.streams: dict[str, StreamConfig] = {c.name or "": c for c in topo.streams}
        self.floors: dict[str, int] = {}  # stage -> the last ack floor read (stream sequence)
        self._asked: dict[str, float] = {}
        self.healed = 0

    def _keeps_history(self, stream: str) -> bool:
        return self.streams[stream].retention is RetentionPolicy.LIMITS

    async def note_floors(self) -> None:
        """Read the ack floor of each consumer on a stream that keeps what was acked."""
        for stage, (stream, cfg) in self.consumers.items():
            if not self._keeps_history(stream):
                continue
            try:
                info = await self.js.consumer_info(stream, cfg.durable_name or "")
            except Exception:  # noqa: BLE001 - gone or NATS away: keep the last floor read
                continue
            if info.ack_floor is not None and info.ack_floor.stream_seq is not None:
                self.floors[stage] = info.ack_floor.stream_seq

    async def watch(self) -> None:
        """``note_floors`` every ``every_s`` until cancelled."""
        while True:
            await self.note_floors()
            await asyncio.sleep(self.every_s)

    async def heal(self, stage: str) -> None:
        """Re-create the stage's stream and consumer if they are gone; at most every
        ``HEAL_EVERY_S`` for one stage (each refused fetch asks). Never raises: NATS away is
        the next ask's to retry."""
        now = self.clock()
        last = self._asked.get(stage)
        if stage not in self.consumers or (last is not None and now - last < HEAL_EVERY_S):
            return
        self._asked[stage] = now
        try:
            await self._heal(stage)
        except Exception as exc:  # noqa: BLE001 - NATS away or refusing: the next ask retries
            log.warning("stage.heal_failed", stage=stage, reason=type(exc).__name__)

    async def _heal(self, stage: str) -> None:
        stream, cfg = self.consumers[stage]
        fresh = False
        try:
            state = (await self.js.stream_info(stream)).state
        except NotFoundError:
            # a stream gone is most often every stream gone (a server that lost its state):
            # the events and dead-letter streams the stages publish to are made again too
            for name, scfg in self.streams.items():
                try:
                    await self.js.stream_info(name)
                except NotFoundError:
                    await self.js.add_stream(scfg)
                    log.warning("stage.stream_recreated", stage=stage, stream=name)
            state, fresh = None, True
        try:
            await self.js.consumer_info(stream, cfg.durable_name or "")
            return  # it is there: the refusal was something else (a leader change)
        except NotFoundError:
            pass
        wanted = self._start(stage, stream, cfg, fresh, state)
        try:
            await self.js.add_consumer(stream, wanted)
        except APIError:
            # another worker re-created it first, perhaps from another floor: theirs stands
            await self.js.consumer_info(stream, cfg.durable_name or "")
            return
        self.healed += 1
        log.warning(
            "stage.consumer_recreated",
            stage=stage,
            stream=stream,
            consumer=cfg.durable_name,
            deliver_policy=str(wanted.deliver_policy.value if wanted.deliver_policy else ""),
            start_seq=wanted.opt_start_seq,
        )

    def _start(
        self, stage: str, stream: str, cfg: ConsumerConfig, fresh: bool, state: Any
    ) -> ConsumerConfig:
        """Where the re-created consumer starts (the module's docstring)."""
        if fresh or not self._keeps_history(stream):
            return cfg
        floor, last = self.floors.get(stage), getattr(state, "last_seq", None)
        wanted = after_floor(cfg, self.streams[stream], floor, last)
        if wanted is cfg:
            log.warning(
                "stage.consumer_replays_stream",
                stage=stage,
                stream=stream,
                reason="no ack floor known" if floor is None else "the stream is behind it",
            )
        return wanted

"""Streams and durable consumers, owned by the project (created or updated at
start-up, never left to a client library's defaults)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from memstream.consumers.logs import log
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import STAGES, Subjects

DAY = 24 * 3600.0
# The version of the stage consumers' definitions, kept in each consumer's metadata. Raise it
# with a change JetStream cannot make in place (a deliver or ack policy, a filter it refuses):
# workers of the new release then replace the older consumer at start-up, starting where it
# stood, and workers of the older release leave the newer one alone during the roll.
DEFINITIONS = 1
DEFINITIONS_KEY = "memstream_definitions"


@dataclass(frozen=True)
class Topology:
    streams: list[StreamConfig]
    consumers: dict[str, tuple[str, ConsumerConfig]]  # stage -> (stream, config)


def topology(settings: Settings) -> Topology:
    s = Subjects(settings.namespace)

    def stream_config(
        kind: str, subject: str, retention: RetentionPolicy, age: float, what: str
    ) -> StreamConfig:
        return StreamConfig(
            name=s.stream(kind),
            subjects=[subject],
            retention=retention,
            max_age=age,
            description=what,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            duplicate_window=settings.duplicate_window_s,
            num_replicas=settings.stream_replicas,
        )

    streams: list[StreamConfig] = [
        stream_config(
            "turns",
            s.turns_filter(),
            RetentionPolicy.LIMITS,
            settings.turns_max_age_s,
            "raw turn events from agents (may hold PII: short retention)",
        ),
        stream_config(
            "stages",
            s.stage_filter(),
            RetentionPolicy.WORK_QUEUE,
            7 * DAY,
            "hand-off between pipeline stages",
        ),
        stream_config(
            "events",
            s.events(),
            RetentionPolicy.LIMITS,
            30 * DAY,
            "what happened to memories (no raw PII)",
        ),
        stream_config(
            "dlq",
            s.dlq(),
            RetentionPolicy.LIMITS,
            14 * DAY,
            "messages a stage gave up on, reason in headers",
        ),
    ]
    st = settings.stage
    consumers: dict[str, tuple[str, ConsumerConfig]] = {}
    for stage in STAGES:
        stream = s.stream("turns") if stage == "extract" else s.stream("stages")
        subject = s.turns_filter() if stage == "extract" else s.stage_filter(stage)
        consumers[stage] = (
            stream,
            ConsumerConfig(
                durable_name=s.durable(stage),
                description=f"memstream {stage} stage",
                deliver_policy=DeliverPolicy.ALL,
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=st.ack_wait_s,
                max_deliver=st.max_deliver,
                filter_subject=subject,
                max_ack_pending=st.batch_size * 16,
                metadata={DEFINITIONS_KEY: str(DEFINITIONS)},
            ),
        )
    return Topology(streams, consumers)


async def apply(js: JetStreamContext, settings: Settings) -> Topology:
    """Create or update every stream and durable consumer; idempotent. A consumer that
    cannot take this release's definition in place is replaced when its definition is older
    (``DEFINITIONS``), starting where it stood (``after_floor``), and left as it is when it is
    newer (a worker of an older release during a rolling upgrade)."""
    topo = topology(settings)
    streams = {cfg.name: cfg for cfg in topo.streams}
    for cfg in topo.streams:
        assert cfg.name is not None
        try:
            await js.stream_info(cfg.name)
        except NotFoundError:
            await js.add_stream(cfg)
        else:
            await js.update_stream(cfg)
    for stage, (stream, ccfg) in topo.consumers.items():
        try:
            await js.add_consumer(stream, ccfg)
        except APIError as exc:
            if not await _reconcile(js, stage, stream, streams[stream], ccfg):
                raise ConfigurationError(
                    f"durable consumer for stage {stage!r} exists with a configuration that "
                    f"cannot be updated in place ({exc.description}) and the same definition "
                    f"version ({DEFINITIONS}); delete it to let memstream recreate it"
                ) from exc
    return topo


def definitions_of(cfg: ConsumerConfig) -> int:
    """The ``DEFINITIONS`` a consumer was made with (0: before they were recorded)."""
    try:
        return int((cfg.metadata or {}).get(DEFINITIONS_KEY, "0"))
    except ValueError:
        return 0


def after_floor(
    ccfg: ConsumerConfig, stream: StreamConfig, floor: int | None, last_seq: int | None
) -> ConsumerConfig:
    """``ccfg`` for a consumer made again in place of one whose ack floor was ``floor``: on a
    stream that keeps what was acked (limits retention: the turns), it starts after the
    floor, so nothing above it is lost and nothing below it is done again; on a work queue
    (which holds only what is unacked), or with no floor the stream still reaches, it starts
    at the stream's beginning."""
    if stream.retention is not RetentionPolicy.LIMITS or floor is None:
        return ccfg
    if last_seq is None or last_seq < floor:
        return ccfg
    return dataclasses.replace(
        ccfg, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=floor + 1
    )


async def _reconcile(
    js: JetStreamContext, stage: str, stream: str, scfg: StreamConfig, ccfg: ConsumerConfig
) -> bool:
    """Whether a consumer that refused ``ccfg`` in place could be dealt with: kept (its
    definition is newer), updated around the start sequence it was made again at
    (``consumers/healing.py``), or replaced (its definition is older)."""
    durable = ccfg.durable_name or ""
    try:
        info = await js.consumer_info(stream, durable)
    except APIError:
        return False
    have = info.config
    theirs = definitions_of(have)
    if theirs > DEFINITIONS:
        log.info("topology.consumer_newer_kept", stage=stage, definitions=theirs)
        return True
    if have.deliver_policy != ccfg.deliver_policy:
        kept = dataclasses.replace(
            ccfg,
            deliver_policy=DeliverPolicy(have.deliver_policy),  # nats-py reads it as a str
            opt_start_seq=have.opt_start_seq,
            opt_start_time=have.opt_start_time,
        )
        try:
            await js.add_consumer(stream, kept)
            return True
        except APIError:
            pass
    if theirs == DEFINITIONS:
        return False
    floor = info.ack_floor.stream_seq if info.ack_floor is not None else None
    last = (await js.stream_info(stream)).state.last_seq
    await js.delete_consumer(stream, durable)
    wanted = after_floor(ccfg, scfg, floor, last)
    await js.add_consumer(stream, wanted)
    log.warning(
        "topology.consumer_replaced",
        stage=stage,
        consumer=durable,
        definitions=f"{theirs} -> {DEFINITIONS}",
        start_seq=wanted.opt_start_seq,
    )
    return True


async def drained(js: JetStreamContext, settings: Settings) -> bool:
    """True when no stage consumer has a message pending or unacked: everything published
    so far has been processed (or dead-lettered)."""
    for stream, cfg in topology(settings).consumers.values():
        info = await js.consumer_info(stream, cfg.durable_name or "")
        if info.num_pending or info.num_ack_pending:
            return False
    return True

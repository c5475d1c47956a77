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

from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import STAGES, Subjects

DAY = 24 * 3600.0


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
            ),
        )
    return Topology(streams, consumers)


async def apply(js: JetStreamContext, settings: Settings) -> Topology:
    """Create or update every stream and durable consumer; idempotent."""
    topo = topology(settings)
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
            if not await _update_keeping_start(js, stream, ccfg):
                raise ConfigurationError(
                    f"durable consumer for stage {stage!r} exists with a configuration that "
                    f"cannot be updated in place ({exc.description}); delete it to let "
                    "memstream recreate it"
                ) from exc
    return topo


async def _update_keeping_start(js: JetStreamContext, stream: str, ccfg: ConsumerConfig) -> bool:
    """A consumer re-created at a start sequence (``consumers/healing.py``) keeps it, which
    JetStream cannot change in place anyway: the rest of ``ccfg`` is applied around it. False
    when it differs in something else that cannot be updated."""
    try:
        have = (await js.consumer_info(stream, ccfg.durable_name or "")).config
    except APIError:
        return False
    if have.deliver_policy == ccfg.deliver_policy:
        return False
    kept = dataclasses.replace(
        ccfg,
        deliver_policy=DeliverPolicy(have.deliver_policy),  # nats-py reads it back as a str
        opt_start_seq=have.opt_start_seq,
        opt_start_time=have.opt_start_time,
    )
    try:
        await js.add_consumer(stream, kept)
    except APIError:
        return False
    return True


async def drained(js: JetStreamContext, settings: Settings) -> bool:
    """True when no stage consumer has a message pending or unacked: everything published
    so far has been processed (or dead-lettered)."""
    for stream, cfg in topology(settings).consumers.values():
        info = await js.consumer_info(stream, cfg.durable_name or "")
        if info.num_pending or info.num_ack_pending:
            return False
    return True

"""The bus checks: NATS and JetStream, stream and stage-consumer drift against
``consumers/topology.py``, dead letters waiting, and the workers' own report
(``<ns>.ops.stats``)."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig

from memstream.consumers.doctor.findings import TIMEOUT_S, Finding
from memstream.consumers.natsconn import nats_options
from memstream.consumers.opsstats import answers
from memstream.consumers.topology import topology
from memstream.producers.connection import display_url
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import Subjects

APPLY = "run `memstream streams apply` (creates or updates streams and consumers in place)"


def _same(want: Any, have: Any) -> bool:
    if isinstance(want, float) or isinstance(have, float):
        return abs(float(want or 0) - float(have or 0)) < 1e-3
    return bool(want == have)


def _drift(want: Any, have: Any, fields: tuple[str, ...]) -> list[str]:
    out = []
    for name in fields:
        w, h = getattr(want, name), getattr(have, name)
        if not _same(w, h):
            w, h = getattr(w, "value", w), getattr(h, "value", h)
            out.append(f"{name} is {h}, memstream wants {w}")
    return out


STREAM_FIELDS = (
    "subjects",
    "retention",
    "max_age",
    "storage",
    "discard",
    "duplicate_window",
    "num_replicas",
)
CONSUMER_FIELDS = (
    "deliver_policy",
    "ack_policy",
    "ack_wait",
    "max_deliver",
    "filter_subject",
    "max_ack_pending",
)


async def _quiet(exc: Exception) -> None:
    del exc


async def check_bus(settings: Settings, nats_url: str) -> tuple[list[Finding], Any]:
    """NATS, streams, consumers and dead letters; returns the findings and an open
    connection (None when NATS did not answer)."""
    where = display_url(nats_url)
    try:
        nc = await asyncio.wait_for(
            nats.connect(
                nats_url,
                connect_timeout=TIMEOUT_S,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                error_cb=_quiet,  # the failure is the finding, not a logged traceback
                **nats_options(settings),
            ),
            TIMEOUT_S * 2,
        )
    except Exception as exc:  # noqa: BLE001 - any failure to connect is the finding
        return [
            Finding(
                "nats",
                False,
                f"cannot connect to {where} ({type(exc).__name__})",
                "start NATS with JetStream, or set MEMSTREAM_NATS_URL and the MEMSTREAM_NATS_* "
                "credentials to a reachable server",
            )
        ], None
    js = nc.jetstream(timeout=TIMEOUT_S)
    try:
        await js.account_info()
    except Exception as exc:  # noqa: BLE001 - JetStream off or not permitted
        return [
            Finding(
                "nats",
                False,
                f"{where} answers but JetStream does not ({type(exc).__name__})",
                "enable JetStream on the server (`jetstream {}` in its configuration) and give "
                "this user access to the JetStream API",
            )
        ], nc
    found = [Finding("nats", True, f"connected to {where}, JetStream enabled")]
    topo = topology(settings)
    drifted: list[str] = []
    for want in topo.streams:
        name = want.name or ""
        try:
            have: StreamConfig = (await js.stream_info(name)).config
        except Exception:  # noqa: BLE001 - missing (or unreadable) is the finding
            drifted.append(f"stream {name} is missing")
            continue
        drifted += [f"stream {name}: {d}" for d in _drift(want, have, STREAM_FIELDS)]
    found.append(
        Finding(
            "streams", not drifted, "; ".join(drifted) or f"{len(topo.streams)} as defined", APPLY
        )
    )
    drifted = []
    for stage, (stream, want_c) in topo.consumers.items():
        durable = want_c.durable_name or ""
        try:
            have_c: ConsumerConfig = (await js.consumer_info(stream, durable)).config
        except Exception:  # noqa: BLE001 - missing (or unreadable) is the finding
            drifted.append(f"stage {stage}: consumer {stream}/{durable} is missing")
            continue
        fields: tuple[str, ...] = CONSUMER_FIELDS
        if have_c.deliver_policy == DeliverPolicy.BY_START_SEQUENCE:
            # made again after its ack floor (consumers/healing.py): its start is its own
            fields = tuple(f for f in CONSUMER_FIELDS if f != "deliver_policy")
        drifted += [
            f"stage {stage} ({stream}/{durable}): {d}" for d in _drift(want_c, have_c, fields)
        ]
    found.append(
        Finding(
            "consumers",
            not drifted,
            "; ".join(drifted) or f"{len(topo.consumers)} stage consumers as defined",
            APPLY + "; a field the server cannot change in place needs the consumer deleted "
            "first (`nats consumer rm <stream> <durable>`): a running worker makes it again "
            "within seconds, after its last ack floor",
        )
    )
    found.append(await _dead_letters(js, settings))
    return found, nc


async def _dead_letters(js: Any, settings: Settings) -> Finding:
    s = Subjects(settings.namespace)
    try:
        state = (await js.stream_info(s.stream("dlq"), subjects_filter=s.dlq())).state
    except Exception as exc:  # noqa: BLE001 - reported with the streams above when missing
        return Finding(
            "dead_letters",
            False,
            f"cannot read the dead-letter stream ({type(exc).__name__})",
            APPLY,
        )
    if not state.messages:
        return Finding("dead_letters", True, "none waiting")
    by_stage = ", ".join(
        f"{subject.rsplit('.', 1)[-1]}: {n}"
        for subject, n in sorted((state.subjects or {}).items())
    )
    return Finding(
        "dead_letters",
        False,
        f"{state.messages} waiting ({by_stage})",
        "read the reasons with `memstream dlq list` (or the console's Dead letters page), fix "
        "the cause, then `memstream dlq replay`, or discard them in the console",
    )


async def worker_stats(nc: Any, settings: Settings) -> dict[str, Any] | None:
    """A worker's answer to ``<ns>.ops.stats``, the first from a process that holds the vector
    index if one answers (an extract/redact process reports no index); None when none
    answers."""
    if nc is None:
        return None
    try:
        found = await answers(nc, Subjects(settings.namespace).ops("stats"), TIMEOUT_S, holds_index)
    except Exception:  # noqa: BLE001 - no worker answered
        return None
    return next((a for a in found if holds_index(a)), found[0] if found else None)


def holds_index(stats: dict[str, Any]) -> bool:
    return "index" in (stats.get("health") or {})

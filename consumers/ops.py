"""The ops surface: Prometheus metrics and health over HTTP, and ``memstream status``.

``GET /metrics``: per-stage counters of this process (processed, acked, retried,
dead-lettered, outputs, busy seconds), redactions by type, recall and command counts, and,
from JetStream, each stage consumer's lag (pending, unacked, redelivered) and the
dead-letter stream's size. ``GET /healthz``: 200 when NATS, Postgres and the vector index
all answer, else 503 naming what is missing (consumers/health.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

import nats

from memstream.consumers.health import problems
from memstream.consumers.natsconn import nats_options
from memstream.consumers.topology import topology
from memstream.producers.connection import servers
from memstream.schemas.settings import Settings


async def lag(js: Any, settings: Settings) -> dict[str, dict[str, int]]:
    """Per stage: messages not yet delivered, delivered but unacked, redelivered; plus the DLQ."""
    out: dict[str, dict[str, int]] = {}
    topo = topology(settings)
    for stage, (stream, cfg) in topo.consumers.items():
        try:
            info = await js.consumer_info(stream, cfg.durable_name or "")
        except Exception:  # noqa: BLE001 - a consumer not created yet reads as unknown
            out[stage] = {"pending": -1, "ack_pending": -1, "redelivered": -1}
            continue
        out[stage] = {
            "pending": info.num_pending or 0,
            "ack_pending": info.num_ack_pending or 0,
            "redelivered": info.num_redelivered or 0,
        }
    for kind in ("turns", "stages", "events", "dlq"):
        name = next(s.name for s in topo.streams if s.name and s.name.endswith(kind.upper()))
        try:
            state = (await js.stream_info(name)).state
            out[f"stream:{kind}"] = {"messages": state.messages, "bytes": state.bytes}
        except Exception:  # noqa: BLE001 - a stream not created yet reads as unknown
            out[f"stream:{kind}"] = {"messages": -1, "bytes": -1}
    return out


def render(worker: Any, lags: dict[str, dict[str, int]]) -> str:
    """Prometheus text exposition."""
    lines: list[str] = []

    def metric(name: str, help_text: str, kind: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value}" for labels, value in samples)

    stages = worker.deps.metrics
    for field, help_text in (
        ("processed", "messages handled"),
        ("acked", "messages acked"),
        ("retried", "messages nacked for retry"),
        ("dead_lettered", "messages sent to the dead-letter subject"),
        ("outputs", "messages or rows produced"),
    ):
        metric(
            f"memstream_stage_{field}_total",
            help_text,
            "counter",
            [(f'{{stage="{s}"}}', getattr(m, field)) for s, m in stages.items()],
        )
    metric(
        "memstream_stage_busy_seconds_total",
        "time spent handling",
        "counter",
        [(f'{{stage="{s}"}}', round(m.busy_s, 6)) for s, m in stages.items()],
    )
    redactions = stages["redact"].redactions if "redact" in stages else {}
    metric(
        "memstream_redactions_total",
        "values replaced by placeholders, by type",
        "counter",
        [(f'{{type="{k}"}}', v) for k, v in sorted(redactions.items())],
    )
    metric(
        "memstream_recall_total",
        "recall requests",
        "counter",
        [('{result="ok"}', worker.recall.served), ('{result="error"}', worker.recall.failed)],
    )
    cache = worker.deps.cache
    if cache is not None:
        metric(
            "memstream_recall_cache_lookups_total",
            "recall cache lookups (a miss is decided locally, without a KV call)",
            "counter",
            [('{result="hit"}', cache.hits), ('{result="miss"}', cache.misses)],
        )
    for key in ("pending", "ack_pending", "redelivered"):
        metric(
            f"memstream_consumer_{key}",
            f"stage consumer {key}",
            "gauge",
            [(f'{{stage="{s}"}}', v[key]) for s, v in lags.items() if key in v],
        )
    metric(
        "memstream_stream_messages",
        "messages held by each stream",
        "gauge",
        [
            (f'{{stream="{s.split(":")[1]}"}}', v["messages"])
            for s, v in lags.items()
            if s.startswith("stream:")
        ],
    )
    return "\n".join(lines) + "\n"


async def serve_http(worker: Any, host: str, port: int) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await reader.readline()).decode(errors="replace").split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            path = request[1] if len(request) > 1 else "/"
            if path == "/metrics":
                body = render(worker, await lag(worker.deps.js, worker.settings))
                status = "200 OK"
            elif path == "/healthz":
                missing = await problems(worker)
                body = "".join(f"{k}: {v}\n" for k, v in missing.items()) or "ok\n"
                status = "503 Service Unavailable" if missing else "200 OK"
            else:
                status, body = "404 Not Found", "not found\n"
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, host, port)


async def status(settings: Settings, nats_url: str, as_json: bool) -> int:
    nc = await nats.connect(servers(nats_url), **nats_options(settings))
    try:
        lags = await lag(nc.jetstream(), settings)
    finally:
        await nc.close()
    if as_json:
        print(json.dumps(lags))
        return 0
    print(f"{'stage':<10} {'pending':>9} {'unacked':>9} {'redelivered':>12}")
    for stage, v in lags.items():
        if not stage.startswith("stream:"):
            print(f"{stage:<10} {v['pending']:>9} {v['ack_pending']:>9} {v['redelivered']:>12}")
    print(f"\n{'stream':<10} {'messages':>9} {'bytes':>12}")
    for name, v in lags.items():
        if name.startswith("stream:"):
            print(f"{name[7:]:<10} {v['messages']:>9} {v['bytes']:>12}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("status", help="stage lag, stream sizes and dead letters")
    p.add_argument("--json", action="store_true")

    def run(a: argparse.Namespace) -> int:
        from memstream.producers.client import discover_nats_url

        settings = Settings()
        return asyncio.run(status(settings, settings.nats_url or discover_nats_url(), a.json))

    p.set_defaults(func=run)

"""The ops surface: Prometheus metrics and health over HTTP, and ``memstream status``.

``GET /metrics``: the worker's Prometheus registry (consumers/metrics.py): per-stage
counters and histograms, recall latency overall and per leg, dead letters by category,
JetStream lag and stream sizes, process metrics. ``GET /healthz``: 200 when NATS, Postgres
and the vector index all answer, else 503 naming what is missing (consumers/health.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from typing import Any

import nats
from prometheus_client import CONTENT_TYPE_LATEST

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


class OpsServer:
    """The ops HTTP endpoint of one worker; ``close()`` also stops the gauge refresher."""

    def __init__(self, server: asyncio.Server, worker: Any) -> None:
        self.server, self.worker = server, worker

    @property
    def sockets(self) -> Any:
        return self.server.sockets

    def close(self) -> None:
        self.worker.telemetry.stop_refreshing()
        self.server.close()


async def serve_http(worker: Any, host: str, port: int) -> OpsServer:
    """``/metrics`` (the worker's registry, consumers/metrics.py) and ``/healthz`` on
    ``host:port``; starts refreshing the JetStream gauges."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = (await reader.readline()).decode(errors="replace").split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            path = request[1].split("?", 1)[0] if len(request) > 1 else "/"
            content_type = "text/plain; charset=utf-8"
            if path == "/metrics":
                data = await worker.telemetry.render_all()
                content_type = CONTENT_TYPE_LATEST
                status = "200 OK"
            elif path == "/healthz":
                missing = await problems(worker)
                data = ("".join(f"{k}: {v}\n" for k, v in missing.items()) or "ok\n").encode()
                status = "503 Service Unavailable" if missing else "200 OK"
            else:
                status, data = "404 Not Found", b"not found\n"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port)
    await worker.telemetry.start_refreshing(worker.deps.js, worker.settings)
    return OpsServer(server, worker)


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

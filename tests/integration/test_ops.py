"""The ops surface: metrics, health and status over real servers."""

from __future__ import annotations

import asyncio

import pytest

from memstream.consumers.ops import lag, serve_http

pytestmark = pytest.mark.integration


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = (await reader.read()).decode()
    writer.close()
    status = int(data.split(" ", 2)[1])
    return status, data.split("\r\n\r\n", 1)[1]


async def _known(running) -> bool:
    return bool(running.worker.deps.cache.known)


async def test_metrics_show_throughput_lag_failures_and_redactions(running) -> None:
    """/metrics exposes per-stage counters, consumer lag, dead letters, redaction counts and
    recall cache hits and misses;
    /healthz answers 200 while connected."""
    async with running.client("acme", user="ops") as mem:
        await mem.publish_turn([("user", "mail me at ops@example.org")])
        await running.wait_for(running.drained, 20, "ingestion")
        await mem.recall("mail")
        await running.wait_for(lambda: _known(running), 5, "the cache entry")
        assert (await mem.recall("mail")).cached
    server = await serve_http(running.worker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        status, body = await http_get(port, "/metrics")
        assert status == 200
        assert 'memstream_stage_acked_total{stage="extract"} 1' in body
        # a worker running every stage hands the candidate on to store in memory
        assert 'memstream_stage_fused_total{stage="store"} 1' in body
        assert 'memstream_stage_redelivered_total{stage="extract"} 0' in body
        assert 'memstream_redactions_total{type="EMAIL"} 1' in body
        assert 'memstream_consumer_pending{stage="extract"} 0' in body
        assert 'memstream_recall_total{result="ok"} 2' in body
        assert 'memstream_recall_cache_lookups_total{result="hit"} 1' in body
        assert 'memstream_recall_cache_lookups_total{result="miss"} 1' in body
        assert "ops@example.org" not in body
        assert (await http_get(port, "/healthz"))[0] == 200
        assert (await http_get(port, "/nope"))[0] == 404
    finally:
        server.close()
    lags = await lag(running.worker.deps.js, running.settings)
    assert lags["stream:dlq"]["messages"] == 0 and lags["store"]["ack_pending"] == 0

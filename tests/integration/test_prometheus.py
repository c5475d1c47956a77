"""The dashboard and the alert rules, evaluated by a real Prometheus scraping a real worker.

Debian's ``prometheus`` package provides ``prometheus`` and ``promtool`` (.ci/run installs it).
The test starts Prometheus on a free port with a temp config and data directory, a 1 s scrape
and rule interval, the repository's alert rules loaded, and one scrape job named ``memstream``
(the name deploy/prometheus/prometheus.yml gives it) pointed at the worker's ops port.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import yaml

from memstream.consumers.ops import serve_http
from memstream.schemas.subjects import Subjects

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
APT_HINT = "install Debian's package: apt-get install prometheus (provides prometheus and promtool)"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: {APT_HINT}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of every panel of every dashboard in deploy/grafana/."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted((DEPLOY / "grafana").glob("*.json")):
        walk(json.loads(path.read_text()))
    return found


def alert_rules() -> dict[str, str]:
    """alert name -> expression, from deploy/prometheus/alerts.yml."""
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def measure(expr: str) -> str:
    """The left operand of an alert's top-level comparison (``x > 5`` -> ``x``): the signal the
    alert watches, which must exist whether or not the alert fires."""
    depth, quote = 0, ""
    for i, ch in enumerate(expr):
        if quote:
            quote = "" if ch == quote and expr[i - 1] != "\\" else quote
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and ch in "<>=!" and expr[i : i + 2] != "=~" and expr[i : i + 2] != "!~":
            return expr[:i].strip()
    return expr


@pytest.fixture
def prometheus_binary() -> str:
    return tool("prometheus")


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.AsyncClient(base_url=url, timeout=10)

    async def query(self, expr: str) -> dict[str, Any]:
        r = await self.http.get("/api/v1/query", params={"query": expr})
        body: dict[str, Any] = r.json()
        return body

    async def series(self, expr: str) -> list[Any]:
        body = await self.query(expr)
        assert body["status"] == "success", f"{expr}: {body.get('error')}"
        result: list[Any] = body["data"]["result"]
        return result

    async def until(self, expr: str, seconds: float, what: str) -> list[Any]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if found := await self.series(expr):
                return found
            await asyncio.sleep(0.25)
        raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what} ({expr})")


@pytest.fixture
def prometheus_for(prometheus_binary: str, tmp_path: Path) -> Iterator[Any]:
    """Starts Prometheus scraping the given ops port; stopped at the end of the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target_port: int) -> Prometheus:
        port = free_port()
        rules = tmp_path / "alerts.yml"
        shutil.copy(DEPLOY / "prometheus" / "alerts.yml", rules)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "memstream",
                    "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                }
            ],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    prometheus_binary,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        return Prometheus(f"http://127.0.0.1:{port}")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def stage_helper() -> bool:
    """The worker runs its helper process, as `memstream worker` does on two or more CPUs:
    the helper's series are scraped too."""
    return True


@pytest.fixture
async def scraped(running, prometheus_for) -> AsyncIterator[tuple[Any, Prometheus]]:
    """A worker behind its ops port, scraped by Prometheus (first scrape done)."""
    ops = await serve_http(running.worker, "127.0.0.1", 0)
    prom = prometheus_for(ops.sockets[0].getsockname()[1])
    try:
        await _wait_ready(prom)
        await prom.until('up{job="memstream"} == 1', 30, "the first successful scrape")
        yield running, prom
    finally:
        await prom.http.aclose()
        ops.close()


async def _wait_ready(prom: Prometheus) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if (await prom.http.get("/-/ready")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("Prometheus did not become ready within 30 s")


async def _traffic(running) -> None:
    """Turns stored (with a redaction), recalls answered (one cached), recalls refused and a
    dead letter: something for every panel and for two alerts to fire."""
    async with running.client("acme", user="ops") as mem:
        await mem.publish_turn([("user", "I prefer green tea, mail me at ops@example.org")])
        await running.wait_for(running.drained, 30, "ingestion")
        await mem.recall("green tea")
        await running.wait_for(lambda: _cached(running), 5, "the cache entry")
        await mem.recall("green tea")
    s = Subjects(running.settings.namespace)
    nc = await nats.connect(running.nats_url)
    try:
        await nc.jetstream().publish(s.turns("acme", "ops", "s1"), b"not a turn")
        for _ in range(5):  # an unreadable request: answered bad_request, counted as an error
            await nc.request(s.recall, b"{", timeout=5)
    finally:
        await nc.close()
    await running.wait_for(
        lambda: _dead_lettered(running), 30, "the invalid turn to be dead-lettered"
    )


async def _cached(running) -> bool:
    return bool(running.worker.deps.cache.known)


async def _dead_lettered(running) -> bool:
    return bool(running.worker.deps.metrics["extract"].dead_lettered)


async def test_every_dashboard_and_alert_expression_returns_series(scraped) -> None:
    """Each PromQL expression of the Grafana dashboard and of the alert rules is valid and
    returns series on a real Prometheus scraping a worker that processed turns; the alert
    rules evaluate without error, and the induced ones (dead letters, recall errors) fire."""
    running, prom = scraped
    await _traffic(running)
    # the traffic seen by Prometheus: samples before and after it in every rate() window
    await prom.until(
        'increase(memstream_stage_dead_lettered_total{stage="extract"}[1m]) > 0',
        30,
        "the dead letter in Prometheus",
    )
    await prom.until(
        'increase(memstream_recall_leg_duration_seconds_count{leg="dense"}[1m]) > 0',
        30,
        "the recall histograms in Prometheus",
    )
    exprs = dashboard_exprs()
    assert len(exprs) >= 20, exprs
    empty = [e for e in exprs if not await prom.series(e)]
    assert not empty, f"dashboard expressions without series: {empty}"
    rules = alert_rules()
    assert {"MemstreamDeadLetters", "MemstreamStageLag", "MemstreamRecallErrors"} <= set(rules)
    for name, expr in rules.items():
        await prom.series(expr)  # valid (a non-firing alert returns no series)
        assert await prom.series(measure(expr)), f"{name}: {measure(expr)} returns no series"
    firing = await prom.until(
        'ALERTS{alertname="MemstreamDeadLetters"}', 30, "the dead-letter alert to fire"
    )
    assert firing[0]["metric"]["stage"] == "extract"
    assert firing[0]["metric"]["alertstate"] == "firing"
    pending = await prom.until(
        'ALERTS{alertname="MemstreamRecallErrors"}', 30, "the recall-error alert"
    )
    assert pending[0]["metric"]["alertstate"] == "pending"  # it has `for: 5m`
    groups = (await prom.http.get("/api/v1/rules")).json()["data"]["groups"]
    health = {r["name"]: (r["health"], r.get("lastError", "")) for g in groups for r in g["rules"]}
    assert set(health) == set(rules)
    assert all(h == ("ok", "") for h in health.values()), health


async def test_metrics_carry_no_tenant_and_no_values(scraped) -> None:
    """No series scraped from the worker has a label holding a tenant, an owner or a
    redacted value; the new histograms and process metrics are there."""
    running, prom = scraped
    await _traffic(running)
    await prom.until(
        'increase(memstream_dead_letters_total{stage="extract",category="invalid_input"}[1m]) > 0',
        30,
        "the categorised dead letter",
    )
    names = set((await prom.http.get("/api/v1/label/__name__/values")).json()["data"])
    for wanted in (
        "memstream_stage_duration_seconds_bucket",
        "memstream_stage_batch_size_bucket",
        "memstream_recall_duration_seconds_bucket",
        "memstream_recall_leg_duration_seconds_bucket",
        "memstream_dead_letters_total",
        "memstream_consumer_pending",
        "memstream_stream_messages",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ):
        assert wanted in names, wanted
    series = (await prom.http.get("/api/v1/series", params={"match[]": '{job="memstream"}'})).json()
    values = {v for s in series["data"] for k, v in s.items() if k not in ("__name__",)}
    for secret in ("acme", "ops", "ops@example.org", running.settings.namespace):
        assert secret not in values, secret


def test_promtool_accepts_the_rules_and_the_config() -> None:
    """``promtool check rules`` passes on deploy/prometheus/alerts.yml and ``promtool check
    config`` on deploy/prometheus/prometheus.yml (which loads those rules)."""
    promtool = tool("promtool")
    rules = subprocess.run(
        [promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS" in rules.stdout
    config = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert config.returncode == 0, config.stdout + config.stderr

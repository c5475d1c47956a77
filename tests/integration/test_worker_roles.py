"""`memstream worker --stages`: extra extract/redact processes beside the process that owns the
Qdrant Edge shard share the work and keep exactly-once through a SIGKILL; a process of a role
subset runs only its roles and never opens the shard; a second owner of a shard is refused."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.request
from pathlib import Path

import faultsbench
import nats
import pytest

from memstream.consumers.bench.processes import WorkerProcess
from memstream.consumers.opsstats import answers
from memstream.producers.client import MemoryClient
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import Subjects
from memstream.storage.embedding import make_embedder
from memstream.storage.qdrant_edge import EdgeVectorIndex

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as reply:
        status: int = reply.status
        return status


def _worker(
    tmp_path: Path, nats_url: str, database_url: str, namespace: str, *args: str, ops_port: int = 0
):
    env = {
        "MEMSTREAM_NATS_URL": nats_url,
        "MEMSTREAM_DATABASE_URL": database_url,
        "MEMSTREAM_NAMESPACE": namespace,
        "MEMSTREAM_CONSOLE_PORT": "0",
        "MEMSTREAM_OPS_PORT": str(ops_port),
    }
    return WorkerProcess(env, tmp_path / "state", tmp_path / "worker.log", args)


async def _dedupe_pending(nc, namespace: str) -> int:
    s = Subjects(namespace)
    info = await nc.jetstream().consumer_info(s.stream("stages"), s.durable("dedupe"))
    return int(info.num_pending or 0)


@pytest.mark.timeout(120)
async def test_a_subset_runs_only_its_roles_and_never_opens_the_shard(
    tmp_path: Path, nats_url: str, database_url: str, namespace: str
) -> None:
    """With the Qdrant Edge shard held by another process, `--stages extract,redact` still
    starts (it never opens the shard), is healthy without the index, answers ops.stats with
    only its roles and no index, runs no recall responder, and hands a published turn on to
    dedupe without consuming it; a process with every role on that shard exits 2 saying the
    shard is open elsewhere."""
    dim = make_embedder(None, None).dim
    shard = EdgeVectorIndex(tmp_path / "state" / "qdrant" / Settings().collection)
    await shard.ensure(dim)  # held, as the owner process would hold it
    port = _free_port()
    extra = _worker(
        tmp_path, nats_url, database_url, namespace, "--stages", "extract,redact", ops_port=port
    )
    owner = _worker(tmp_path, nats_url, database_url, namespace)
    nc = await nats.connect(nats_url)
    try:
        with pytest.raises(ConfigurationError, match="exited with code 2"):
            await asyncio.to_thread(owner.start, 90)
        assert "is open in another process" in owner.log.read_text()
        await asyncio.to_thread(extra.start, 90)
        assert await asyncio.to_thread(_status, f"http://127.0.0.1:{port}/healthz") == 200
        found = await answers(nc, Subjects(namespace).ops("stats"), 1.0)
        assert len(found) == 1
        assert found[0]["roles"] == ["extract", "redact"]
        assert set(found[0]["stages"]) == {"extract", "redact"}
        assert set(found[0]["health"]) == {"nats", "postgres"}
        with pytest.raises(nats.errors.NoRespondersError):
            await nc.request(Subjects(namespace).recall, b"{}", timeout=2)
        async with MemoryClient("acme", nats_url=nats_url, namespace=namespace) as client:
            await client.publish_turn([("user", "I prefer green tea")], user="alice", session="s1")
        deadline = time.monotonic() + 30
        while await _dedupe_pending(nc, namespace) == 0:
            assert time.monotonic() < deadline, "the turn never reached the dedupe stage"
            await asyncio.sleep(0.1)
        assert await asyncio.to_thread(extra.stop) == 0
    finally:
        extra.kill()
        owner.kill()
        for kind in ("turns", "stages", "events", "dlq"):  # leave the shared server as it was
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_stream(Subjects(namespace).stream(kind))
        await nc.close()
        await shard.close()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_two_extra_processes_keep_exactly_once_through_a_sigkill(batched: bool) -> None:
    """One owner process and two `--stages extract,redact` processes ingest 300 turns of three
    tenants while one extra process is SIGKILLed and restarted: every acked turn has exactly
    one episode, the index holds what Postgres holds, nothing is dead-lettered, and each extra
    process extracted and redacted turns itself."""
    report, stderr, code = faultsbench.run(
        ["--turns", "300", "--faults", "extra_kill", "--extra-workers", "2"],
        140,
        MEMSTREAM_STAGE__BATCHED=str(batched).lower(),
        # a killed process's unacked messages come back after the ack deadline: keep it short
        MEMSTREAM_STAGE__ACK_WAIT_S="10",
    )
    assert [f["fault"] for f in report["faults"]] == ["extra_kill"], stderr[-2000:]
    faultsbench.assert_exactly_once(report, 300)
    assert report["extra_workers"] == 2 and report["extra_starts"] == 3
    assert report["extra_exit_codes"] == [0, 0] and report["worker_exit_code"] == 0
    rows = report["processes"]
    assert [r["process"] for r in rows] == ["owner", "extra-0", "extra-0", "extra-1"]
    for row in rows[1:]:  # an extra process never runs dedupe or store
        assert set(row["handled"] or {}) <= {"extract", "redact"}
    for first in (rows[1], rows[3]):  # the killed one counted before its kill, the other
        assert first["handled"]["extract"] > 0 and first["handled"]["redact"] > 0, rows
    assert all(report["targets"].values()) and code == 0

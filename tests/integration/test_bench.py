"""The benchmark commands, end to end against the configured services (the test servers, named
by MEMSTREAM_NATS_URL / MEMSTREAM_DATABASE_URL as a user would name external ones)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from hostcaps import may_lock_memory

from memstream.consumers import cpulatency
from memstream.consumers.bench import pgstatements
from memstream.consumers.embedded import EmbeddedPostgres, free_port
from memstream.consumers.stagemetrics import STEPS

pytestmark = pytest.mark.integration

MEMSTREAM = str(Path(sys.executable).parent / "memstream")


def bench(args: list[str], nats_url: str, database_url: str, **more_env: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "MEMSTREAM_NATS_URL": nats_url,
        "MEMSTREAM_DATABASE_URL": database_url,
        **more_env,
    }
    done = subprocess.run(
        [MEMSTREAM, "bench", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def turn(dia: str, speaker: str, text: str) -> dict[str, str]:
    return {"speaker": speaker, "dia_id": dia, "text": text}


CONVERSATION = {
    "sample_id": "conv-test",
    "conversation": {
        "speaker_a": "Mia",
        "speaker_b": "Leo",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            turn("D1:1", "Mia", "I adopted a grey greyhound named Biscuit last week!"),
            turn("D1:2", "Leo", "Congratulations, greyhounds are lovely dogs."),
            turn("D1:3", "Mia", "I also started pottery classes on Tuesdays."),
            turn("D1:4", "Leo", "Nice, I have been learning the cello for a year."),
        ],
        "session_2_date_time": "10:04 am on 19 June, 2023",
        "session_2": [
            turn("D2:1", "Leo", "I finally performed my first cello recital in Lisbon."),
            turn("D2:2", "Mia", "Biscuit ran a race at the beach and won a ribbon."),
            turn("D2:3", "Leo", "How is pottery going?"),
            turn("D2:4", "Mia", "I glazed a blue vase for my grandmother."),
        ],
    },
    "qa": [
        {"question": "What kind of dog did Mia adopt?", "evidence": ["D1:1"], "category": 4},
        {"question": "Where was Leo's cello recital?", "evidence": ["D:2:1"], "category": 4},
        {
            "question": "What hobbies does Mia have?",
            "evidence": ["D1:3; D2:4"],
            "category": 1,
        },
        {"question": "When did Biscuit win a ribbon?", "evidence": ["D2:02"], "category": 2},
        {"question": "What is Mia's favourite colour?", "evidence": [], "category": 4},
        {"question": "Did Leo adopt a cat?", "evidence": ["D1:1"], "category": 5},
    ],
}


def test_locomo_bench_publishes_ingests_and_scores(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    """`memstream bench locomo` on a small file of the LoCoMo format: malformed evidence ids
    are normalised, empty-evidence and category-5 questions are left out, every turn goes
    through the pipeline, and the planted answers are found."""
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([CONVERSATION]))
    r = bench(["locomo", "--data", str(data)], nats_url, database_url)
    assert (r["questions"], r["turns"]) == (4, 8)
    assert r["recall"]["5"] >= 75.0 and r["hit"]["1"] >= 50.0  # 8 turns: top 5 is not all
    assert set(r["per_category"]) == {"multi-hop", "temporal", "single-hop"}
    assert r["per_category"]["single-hop"]["hit"]["5"] == 100.0
    lat = r["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"]
    assert r["ingest_s"] > 0


def test_recall_bench_measures_over_nats(nats_url: str, database_url: str) -> None:
    """`memstream bench recall` loads the tenant and noise tenants, then reports percentiles
    per round, pooled and with concurrent clients, plus the worker's own time."""
    r = bench(
        "recall --memories 300 --noise-tenants 1 --queries 40 --concurrency 2 --rounds 2 "
        "--top-k 5 --lock-memory --cpu-latency-us 0".split(),
        nats_url,
        database_url,
    )
    assert (r["memories"], r["noise_tenants"], r["queries"]) == (300, 1, 40)
    assert len(r["rounds"]) == 2 and r["cpu_gauge_s"] > 0
    assert r["index_layout"]["points"] == 330  # 300 + one noise tenant of 30
    assert r["postgres_checkpoint"] is True  # the test servers' role may CHECKPOINT
    # --lock-memory: locked where the process may, else it ran unlocked (and said why)
    assert r["memory_locked"] is may_lock_memory()
    # --cpu-latency-us 0: held where the device is writable (root), else it ran without
    writable = os.access(cpulatency.DEVICE, os.W_OK)
    assert r["cpu_latency_us"] == (0 if writable else None)
    for s in (r["latency_ms"], r["concurrent"], *r["rounds"]):
        assert 0 < s["p50"] <= s["p95"] <= s["p99"]
        assert 0 < s["server_p50"] <= s["p50"]
    parts = r["latency_ms"]["server_parts"]  # where the worker's time went, per part
    assert set(parts) == {"embed", "dense", "keyword", "fetch"}
    assert all(0 < p["p50"] <= p["p95"] <= r["latency_ms"]["server_p95"] for p in parts.values())
    assert r["concurrent"]["clients"] == 2


@pytest.mark.parametrize("processes", [0, 2], ids=["in-process", "two-processes"])
def test_ingest_bench_reports_throughput_latency_and_loses_nothing(
    nats_url: str, database_url: str, processes: int
) -> None:
    """`memstream bench ingest` run small, with the workers in its own process or in an owner
    and an extract/redact process: every turn becomes recallable exactly once, and the
    report's hop, throughput, stage (summed over processes), latency and recall figures are
    consistent; in process, recall is paced at 20 requests a second, out of process back to
    back; either way from a recall client in a process of its own. With index segments of
    64 KB, the index's writes start optimizations, which the report counts. Out of process,
    PostgreSQL's statements are counted too, the rows' upserts among them; in process, on
    the tests' server, which does not preload pg_stat_statements, the report says so."""
    recall_rate = 20 if processes == 0 else 0
    # PostgreSQL's statements: the server the benchmark starts preloads the extension, the
    # tests' own does not (the report says so)
    r = bench(
        "ingest --turns 240 --paced-turns 120 --rate 100 --tenants 2 --users 2 --sessions 2 "
        f"--hop-messages 500 --timeout 120 --processes {processes} "
        f"--recall-rate {recall_rate} --pg-statements 4".split(),
        nats_url,
        database_url,
        MEMSTREAM_INDEX_SEGMENT_KB="64",
    )
    assert (r["turns"], r["tenants"], r["sessions"], r["processes"]) == (240, 2, 8, processes)
    assert r["lost"] == 0 and r["duplicate_events"] == 0
    assert r["redelivered"] == {"throughput": 0, "paced": 0}  # no deadline passed
    # read from PostgreSQL's own count: the indexed marks and recall's access counts never
    # wait for a row the store's transaction holds (test_row_locks.py)
    assert r["postgres_deadlocks"] == {"throughput": 0, "paced": 0}
    assert r["throughput"]["missing"] == 0 and r["paced"]["missing"] == 0
    hop, t = r["bare_hop"], r["throughput"]
    assert hop["msgs_per_s"] > 0 and t["turns_per_s"] > 0 and t["seconds"] > 0
    assert r["cpu_gauge_s"] > 0  # how fast the machine was, printed with the figures
    assert t["ratio_to_bare_hop"] == pytest.approx(t["turns_per_s"] / hop["msgs_per_s"], rel=0.01)
    # each turn has an episode and most carry typed candidates too (the generator plants them)
    assert 1.2 <= r["candidates_per_turn"] <= 3.0
    stages = r["stages"]
    assert stages["extract"]["messages"] == 240  # the throughput run's turns, each once
    assert stages["redact"]["messages"] == stages["dedupe"]["messages"] >= 240
    for s in stages.values():
        assert s["batches"] >= 1 and 1.0 <= s["mean_batch"] <= 1000
        # wall time with work in hand, per process
        assert 0 < s["busy_s"] <= (t["seconds"] + 5) * max(1, processes)
    # where a stored batch's time went, step by step (summed over processes), in both runs
    for steps in (r["steps"], r["paced"]["steps"]):
        assert set(steps) == set(STEPS)
        for name in ("write", "index", "upsert", "announce"):
            assert steps[name]["batches"] >= 1 and steps[name]["mean_ms"] > 0, (name, steps)
        assert all(s["mean_ms"] >= 0 for s in steps.values())
    lat = r["paced"]["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"]
    assert r["paced"]["stages"]["extract"]["messages"] == 120  # the paced run's turns, once
    # the cores each process used, per run: the benchmark's own clients always; as deployed,
    # the owner, its helper and index processes (on two CPUs or more), PostgreSQL and
    # nats-server, all at work; the recall client, a process of its own, in the paced run
    assert "recall client" not in t["cores"] and "recall client" in r["paced"]["cores"]
    # its CPU is read from /proc in clock ticks (10 ms): over a paced run of about a second it
    # may read 0, paced at 20 a second, and also back to back when its requests wait (with
    # 64 KB segments the writes start optimizations, which hold the index process that
    # answers recall); that it answered is checked below (requests > 0, no errors)
    assert r["paced"]["cores"]["recall client"] >= 0
    for run in (t, r["paced"]):
        cores = {k: v for k, v in run["cores"].items() if k != "recall client"}
        assert all(0 <= c <= os.cpu_count() for c in cores.values())
        if processes:
            roles = {"worker (owns the index)", "postgres", "nats-server", "benchmark (clients)"}
            others = {"its helper process", "its index process", "extract/redact processes"}
            assert roles | others >= set(cores) >= roles
            assert cores["worker (owns the index)"] > 0
            assert cores["postgres"] > 0 or run is r["paced"]  # the backends, read under it
        else:
            assert set(cores) == {"benchmark and workers"} and cores["benchmark and workers"] > 0
    # what a turn cost each process in CPU, in the throughput run: its cores over the run's
    # length, per turn (the same processes; the worker's share is never nothing)
    per_turn = t["cpu_ms_per_turn"]
    assert set(per_turn) == set(t["cores"]) and all(v >= 0 for v in per_turn.values())
    assert sum(per_turn.values()) > 0
    # 64 KB segments: an optimization every 32 points of 256 dims, in whichever process
    # holds the index (the owner's index process when there is one)
    built = r["index_optimizations"]["throughput"]
    assert built["count"] >= 1 and built["seconds"] >= 0
    rec = r["recall_during_ingest"]
    assert rec["requests"] > 0 and rec["errors"] == 0
    assert 0 < rec["latency_ms"]["p50"] <= rec["latency_ms"]["p95"]
    # the worker's own search time, read from the replies: part of what the client waited
    assert 0 < rec["server_ms"]["p50"] <= rec["latency_ms"]["p99"]
    assert rec["rate"] == (recall_rate or None)
    if processes:  # the throughput run's statements, most time first; every turn upserted
        pg = r["pg_statements"]
        assert pg["unavailable"] is None and 1 <= len(pg["top"]) <= 4
        assert [s["ms"] for s in pg["top"]] == sorted((s["ms"] for s in pg["top"]), reverse=True)
        assert 0 < sum(s["share"] for s in pg["top"]) <= 1.001
        upserts = [s for s in pg["top"] if s["statement"].startswith("INSERT INTO memories ")]
        assert len(upserts) == 1 and upserts[0]["calls"] >= 240, pg
    elif not os.environ.get("MEMSTREAM_TEST_DATABASE_URL"):  # the tests' embedded server
        reason = r["pg_statements"]["unavailable"]
        assert r["pg_statements"]["top"] == [] and "does not preload" in reason, reason
    if recall_rate:  # at most one request per slot over the paced run and its drain
        paced_s = 120 / r["paced"]["achieved_rate"] + lat["p99"] / 1000
        assert rec["requests"] <= recall_rate * (paced_s + 1)


@pytest.mark.parametrize("name", ["locomo", "redaction"])
def test_a_missing_data_file_is_a_usage_error(tmp_path: Path, name: str) -> None:
    """A benchmark whose data file is missing says so and exits 2, without a traceback."""
    missing = tmp_path / "nothing-here.json"
    done = subprocess.run(
        [MEMSTREAM, "bench", name, "--data", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"no such file: {missing}" in done.stderr and "Traceback" not in done.stderr


def test_ctrl_c_stops_a_benchmark_without_a_traceback(nats_url: str, database_url: str) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) in the middle of a
    benchmark: it stops what it started, says it was interrupted and exits 130, the code a
    shell gives a command stopped by SIGINT, instead of printing a KeyboardInterrupt
    traceback."""
    env = {**os.environ, "MEMSTREAM_NATS_URL": nats_url, "MEMSTREAM_DATABASE_URL": database_url}
    proc = subprocess.Popen(
        [MEMSTREAM, "bench", "recall", "--memories", "200000", "--noise-tenants", "0"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    assert proc.stderr is not None
    seen = b""
    try:
        while b"memories (queried tenant)" not in seen:  # loading: its workers are running
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk, seen.decode(errors="replace")
            seen += chunk
        os.killpg(proc.pid, signal.SIGINT)
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = (seen + rest).decode(errors="replace")
    assert proc.returncode == 130, err[-2000:]
    assert "memstream: interrupted" in err and "Traceback" not in err, err[-2000:]
    deadline = time.monotonic() + 10  # and nothing it started is left in its group
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the benchmark outlived it"
        time.sleep(0.1)


def test_statements_from_a_server_gone_are_none_and_say_why() -> None:
    """Reading the statements from a server that went away gives none and the reason, so the
    run's other figures are still reported."""
    top, why = asyncio.run(pgstatements.stop(f"postgresql://postgres@127.0.0.1:{free_port()}/x", 3))
    assert top == [] and why is not None and "Connection" in why, why


def test_a_run_that_fails_while_counting_leaves_the_server_not_counting(tmp_path: Path) -> None:
    """Statements are counted server-wide (ALTER SYSTEM): a benchmark that fails before it
    reads them turns counting off again, as one that finishes does."""
    server = EmbeddedPostgres.start(tmp_path / "pg", statements=True)

    async def track() -> str:
        con = await asyncpg.connect(server.dsn)
        try:
            return str(await con.fetchval("SHOW pg_stat_statements.track"))
        finally:
            await con.close()

    async def run() -> tuple[str, str, str]:
        async with pgstatements.Counting(server.dsn, 3) as counting:
            finished = await track()
            assert (await counting.report() or {}).get("unavailable") is None
        with pytest.raises(RuntimeError, match="the run failed"):
            async with pgstatements.Counting(server.dsn, 3):
                during = await track()
                raise RuntimeError("the run failed")
        return finished, during, await track()

    try:
        finished, during, after = asyncio.run(run())
    finally:
        server.stop()
    assert finished == during == "top"
    assert after == "none"

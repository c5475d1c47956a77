"""LoCoMo evidence recall through the whole system: publish, ingest, recall over NATS.

Every turn of every conversation is published through the SDK as a turn event of its
conversation (tenant ``locomo``, one user per conversation, the session date as the event
time, ``dia_id`` in metadata and in the event id). After ingestion, every question of
categories 1-4 is sent to recall, scoped to its conversation; a hit's evidence ids are the
dia_ids of its source events. Scores (shared/bench/README.md): evidence recall@k and hit@k for
k = 1, 5, 10, 20, per category and overall, client-side latency p50/p95/p99, ingestion time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from memstream.consumers.bench.args import data_file
from memstream.consumers.bench.harness import bench_stack, percentile, progress

KS = (1, 5, 10, 20)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
TENANT = "locomo"
_DIA = re.compile(r"D:?(\d+):0*(\d+)")


@dataclass(frozen=True)
class Turn:
    conv: str
    dia_id: str
    speaker: str
    text: str
    session: str
    at: datetime


@dataclass(frozen=True)
class Question:
    conv: str
    text: str
    category: int
    evidence: frozenset[str]


def parse_date(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> aware datetime (UTC)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def normalise_evidence(raw: list[str]) -> list[str]:
    """Split 'D8:6; D9:17', fix 'D:11:26' and 'D30:05' -> canonical 'D11:26', 'D30:5'."""
    return [f"D{m.group(1)}:{m.group(2)}" for item in raw for m in _DIA.finditer(item)]


def load(path: Path) -> tuple[list[Turn], list[Question]]:
    samples = json.loads(path.read_text())
    turns: list[Turn] = []
    questions: list[Question] = []
    for sample in samples:
        conv = str(sample["sample_id"])
        c = sample["conversation"]
        known: set[str] = set()
        for key, value in c.items():
            if not re.fullmatch(r"session_\d+", key) or not isinstance(value, list):
                continue
            at = parse_date(c[f"{key}_date_time"])
            for position, t in enumerate(value):
                dia = normalise_evidence([t["dia_id"]])[0]
                known.add(dia)
                text = t.get("text", "")
                if t.get("blip_caption"):  # what the agent saw: part of the message
                    text = f"{text} [shared a photo: {t['blip_caption']}]"
                # the session date is the event time; turns keep their order a second apart
                turns.append(
                    Turn(conv, dia, t["speaker"], text, key, at + timedelta(seconds=position))
                )
        for qa in sample.get("qa", []):
            cat = int(qa.get("category", 0))
            if cat not in CATEGORIES:
                continue
            evidence = frozenset(
                e for e in normalise_evidence(qa.get("evidence", [])) if e in known
            )
            if evidence:
                questions.append(Question(conv, qa["question"], cat, evidence))
    return turns, questions


def score(ranked: list[list[str]], questions: list[Question]) -> dict[str, Any]:
    """Evidence recall@k and hit@k per category and overall; ranked[i] = dia_ids, best first."""
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for q, dias in zip(questions, ranked, strict=True):
        seen: list[str] = []
        for d in dias:  # one turn counts once, at its best rank
            if d not in seen:
                seen.append(d)
        for k in KS:
            top = set(seen[:k])
            found = len(q.evidence & top)
            for group in ("overall", str(q.category)):
                sums[group][f"r{k}"].append(found / len(q.evidence))
                sums[group][f"h{k}"].append(1.0 if found else 0.0)
    out: dict[str, Any] = {}
    for group, metrics in sums.items():
        out[group] = {
            "recall": {str(k): round(100 * _mean(metrics[f"r{k}"]), 2) for k in KS},
            "hit": {str(k): round(100 * _mean(metrics[f"h{k}"]), 2) for k in KS},
            "questions": len(metrics["r1"]),
        }
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


async def run(path: Path, concurrency: int, method: str) -> dict[str, Any]:
    turns, questions = load(path)
    async with bench_stack() as bench:
        clients = {}
        for conv in sorted({t.conv for t in turns}):
            clients[conv] = await bench.client(TENANT, user=conv).connect()
        started = time.perf_counter()
        done = 0

        async def publish_conversation(conv_turns: list[Turn]) -> None:
            # in order, as an agent would: each turn after the previous one's PubAck
            nonlocal done
            for t in conv_turns:
                await clients[t.conv].publish_turn(
                    [{"role": "user", "content": t.text, "sender": t.speaker}],
                    session=t.session,
                    event_id=f"{t.conv}:{t.dia_id}",
                    occurred_at=t.at,
                    metadata={"dia_id": t.dia_id},
                )
                done += 1
                if done % 250 == 0 or done == len(turns):
                    progress("published", done, len(turns), started)

        await asyncio.gather(
            *(publish_conversation([t for t in turns if t.conv == conv]) for conv in clients)
        )
        await bench.wait_drained()
        ingest_s = time.perf_counter() - started
        print(f"  ingested {len(turns)} turns in {ingest_s:.1f} s", flush=True)

        latencies: list[float] = []
        ranked: list[list[str]] = [[] for _ in questions]
        # calibrated scores of the hits that are evidence of their question and of the others
        calibrated: dict[str, list[float]] = {"evidence": [], "other": []}
        qsem = asyncio.Semaphore(concurrency)
        qstart = time.perf_counter()
        answered = 0

        async def ask(i: int, q: Question) -> None:
            nonlocal answered
            async with qsem:
                t0 = time.perf_counter()
                reply = await clients[q.conv].recall(q.text, top_k=max(KS), method=method)
                latencies.append((time.perf_counter() - t0) * 1000)
            ranked[i] = [
                eid.split(":", 1)[1]
                for h in reply.hits
                for eid in h.source_event_ids
                if eid.startswith(f"{q.conv}:")
            ]
            for h in reply.hits:
                if h.calibrated is None:
                    continue
                dias = {e.split(":", 1)[1] for e in h.source_event_ids if ":" in e}
                calibrated["evidence" if dias & q.evidence else "other"].append(h.calibrated)
            answered += 1
            if answered % 100 == 0 or answered == len(questions):
                progress("questions", answered, len(questions), qstart)

        await asyncio.gather(*(ask(i, q) for i, q in enumerate(questions)))
        for c in clients.values():
            await c.close()
    scores = score(ranked, questions)
    overall = scores.pop("overall")
    return {
        "recall": overall["recall"],
        "hit": overall["hit"],
        "per_category": {CATEGORIES[int(k)]: v for k, v in sorted(scores.items())},
        "latency_ms": {
            p: round(percentile(latencies, q), 3)
            for p, q in (("p50", 50), ("p95", 95), ("p99", 99))
        },
        "questions": len(questions),
        "turns": len(turns),
        "ingest_s": round(ingest_s, 2),
        "method": method,
        "calibrated": calibration(calibrated),
    }


RADII = (0.1, 0.2, 0.3, 0.4, 0.5)


def calibration(scores: dict[str, list[float]]) -> dict[str, Any]:
    """Quantiles of the calibrated score of evidence hits and other hits, and the share of
    each a radius (an absolute threshold) keeps."""
    out: dict[str, Any] = {}
    for kind, xs in scores.items():
        out[kind] = {
            "hits": len(xs),
            **{f"p{q}": round(percentile(xs, q), 3) if xs else None for q in (10, 50, 90)},
            "kept_by_radius": {
                str(r): round(100 * sum(x >= r for x in xs) / len(xs), 1) if xs else None
                for r in RADII
            },
        }
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=data_file, required=True, help="a LoCoMo-format JSON file")
    p.add_argument("--concurrency", type=int, default=1, help="recall requests in flight")
    p.add_argument("--method", default="hybrid", choices=["hybrid", "keyword", "vector"])


def main(args: argparse.Namespace) -> int:
    result = asyncio.run(run(args.data, args.concurrency, args.method))
    print(
        f"\nLoCoMo evidence recall, {result['questions']} questions (categories 1-4), "
        f"method {result['method']}"
    )
    print(
        f"{'group':<14}" + "".join(f"  R@{k:<5}" for k in KS) + "".join(f"  H@{k:<5}" for k in KS)
    )
    rows = [("overall", result), *result["per_category"].items()]
    for name, r in rows:
        print(
            f"{name:<14}"
            + "".join(f"  {r['recall'][str(k)]:<7.1f}" for k in KS)
            + "".join(f"  {r['hit'][str(k)]:<7.1f}" for k in KS)
        )
    lat = result["latency_ms"]
    print(
        f"recall latency at the client: p50 {lat['p50']:.2f} ms, p95 {lat['p95']:.2f} ms, "
        f"p99 {lat['p99']:.2f} ms; ingestion {result['ingest_s']:.1f} s for "
        f"{result['turns']} turns"
    )
    for kind, c in result["calibrated"].items():
        kept = ", ".join(f">= {r}: {v}%" for r, v in c["kept_by_radius"].items())
        print(
            f"calibrated score of {kind} hits ({c['hits']}): p10 {c['p10']}, p50 {c['p50']}, "
            f"p90 {c['p90']}; kept by radius {kept}"
        )
    if args.json:
        print(json.dumps(result))
    return 0

"""The ingest benchmark's report: what changed between two counts of the pipeline's
counters (``pipelines.Counts``), and the tables ``memstream bench ingest`` prints."""

from __future__ import annotations

from typing import Any

from memstream.consumers.bench.pipelines import DEADLOCKS, OPTIMIZE, REDELIVERED, STEP, Counts
from memstream.consumers.stagemetrics import STEPS
from memstream.schemas.subjects import STAGES


def optimizations(before: Counts, after: Counts) -> dict[str, float]:
    """The index's optimizations that built something between two counts, and their
    seconds in all."""
    (s0, n0, *_), (s1, n1, *_) = before[OPTIMIZE], after[OPTIMIZE]
    return {"count": n1 - n0, "seconds": round(s1 - s0, 2)}


def redelivered(before: Counts, after: Counts) -> int:
    """Messages the stages handled again between two counts: a turn whose ack deadline
    passed while it was being handled is delivered again, and announced twice."""
    return after[REDELIVERED][1] - before[REDELIVERED][1]


def deadlocks(before: Counts, after: Counts) -> int:
    """Deadlocks PostgreSQL broke between two counts (``pipelines.DEADLOCKS``)."""
    return after[DEADLOCKS][1] - before[DEADLOCKS][1]


def step_report(before: Counts, after: Counts) -> dict[str, dict[str, float]]:
    """Each batch step (``stagemetrics.STEPS``) between two counts: batches, and mean ms a batch."""
    out = {}
    for step in STEPS:
        s0, n0, *_ = before.get(STEP + step, (0.0, 0, 0, 0))
        s1, n1, *_ = after.get(STEP + step, (0.0, 0, 0, 0))
        n = n1 - n0
        out[step] = {"batches": n, "mean_ms": round(1000 * (s1 - s0) / n, 2) if n else 0.0}
    return out


def stage_report(before: Counts, after: Counts, elapsed: float) -> dict[str, dict[str, float]]:
    out = {}
    for s in STAGES:
        busy = after[s][0] - before[s][0]
        msgs = after[s][1] - before[s][1]
        batches = after[s][2] - before[s][2]
        out[s] = {
            "busy_s": round(busy, 2),
            "busy_share": round(busy / elapsed, 3) if elapsed else 0.0,
            "messages": msgs,
            "batches": batches,
            "mean_batch": round(msgs / batches, 1) if batches else 0.0,
            "ms_per_message": round(1000 * busy / msgs, 3) if msgs else 0.0,
        }
    return out


def print_report(r: dict[str, Any]) -> None:
    """``run``'s result as tables: the measures, each stage's busy time and batches, each
    batch step's mean, and the cores each process used, for the throughput and paced runs."""
    t, hop, paced, rec = r["throughput"], r["bare_hop"], r["paced"], r["recall_during_ingest"]
    print(
        f"\nIngest, {r['turns']} turns over {r['tenants']} tenants and {r['sessions']} sessions "
        f"({r['candidates_per_turn']} candidates per turn), "
        + (
            f"{r['processes']} worker process{'es' if r['processes'] > 1 else ''}"
            if r["processes"]
            else "workers in the benchmark's process"
        )
    )
    print(f"{'measure':<40} value")
    rows = [
        ("CPU gauge (10M-step Python loop)", f"{r['cpu_gauge_s']} s"),
        ("bare JetStream hop (publish, pull+ack)", f"{hop['msgs_per_s']:,.0f} msgs/s"),
        ("end to end (publish to recallable)", f"{t['turns_per_s']:,.1f} turns/s"),
        ("ratio to the bare hop", f"{100 * t['ratio_to_bare_hop']:.2f} %"),
        ("publish rate (PubAcks)", f"{t['publish_per_s']:,.0f} turns/s"),
        (
            f"publish-to-recallable at {paced['rate']:.0f}/s",
            "p50 {p50} / p95 {p95} / p99 {p99} ms".format(**paced["latency_ms"]),
        ),
        (
            "recall during that ingest"
            + (f" ({rec['rate']:.0f}/s)" if rec.get("rate") else " (back to back)"),
            "p50 {p50} / p95 {p95} / p99 {p99} ms".format(**rec["latency_ms"])
            + f" ({rec['requests']} requests, {rec['errors']} errors)",
        ),
        (
            "  of which searching, in the worker",
            "p50 {p50} / p95 {p95} / p99 {p99} ms".format(**rec["server_ms"]),
        ),
        ("lost turns / duplicate events", f"{r['lost']} / {r['duplicate_events']}"),
        (
            "messages redelivered: throughput; paced",
            "{throughput}; {paced}".format(**r["redelivered"]),
        ),
        (
            "Postgres deadlocks: throughput; paced",
            "{throughput}; {paced}".format(**r["postgres_deadlocks"]),
        ),
        (
            "index optimizations: throughput; paced",
            "; ".join(
                f"{o['count']} ({o['seconds']} s)"
                for o in (r["index_optimizations"]["throughput"], r["index_optimizations"]["paced"])
            ),
        ),
    ]
    for name, value in rows:
        print(f"{name:<40} {value}")
    print(
        f"\n{'stage':<10} {'busy s':>8} {'share':>7} {'msgs':>7} {'batches':>8} "
        f"{'mean':>6} {'ms/msg':>8}"
    )
    for label, stages in (("throughput run", r["stages"]), ("paced run", paced["stages"])):
        print(f"{label}:")
        for s, st in stages.items():
            print(
                f"{s:<10} {st['busy_s']:>8.2f} {st['busy_share']:>7.2f} {st['messages']:>7} "
                f"{st['batches']:>8} {st['mean_batch']:>6.1f} {st['ms_per_message']:>8.3f}"
            )
    # where a stored batch's time goes, beyond the stages' busy time (dedupe is its own)
    print(f"\n{'batch step, mean ms a batch':<46} {'throughput':>10} {'paced':>8}")
    for step, what in STEPS.items():
        during = (r["steps"][step]["mean_ms"], paced["steps"][step]["mean_ms"])
        print(f"{what:<46} {during[0]:>10.2f} {during[1]:>8.2f}")
    # busy is wall time with a batch in hand: the cores show what of it was work
    # and, for the throughput run, what a turn cost each process in CPU (the cores' cap)
    print(f"\n{'cores used':<28} {'throughput':>10} {'paced':>8} {'CPU ms a turn':>14}")
    for role in {**t["cores"], **paced["cores"]}:  # the recall client runs in the paced run only
        during = (t["cores"].get(role, 0.0), paced["cores"].get(role, 0.0))
        per_turn = t["cpu_ms_per_turn"].get(role, 0.0)
        print(f"{role:<28} {during[0]:>10.2f} {during[1]:>8.2f} {per_turn:>14.3f}")
    print(
        f"{'all':<28} {sum(t['cores'].values()):>10.2f} {sum(paced['cores'].values()):>8.2f} "
        f"{sum(t['cpu_ms_per_turn'].values()):>14.3f}"
    )
    pg = r.get("pg_statements")
    if pg is not None:
        print_statements(pg)


def print_statements(pg: dict[str, Any]) -> None:
    """``--pg-statements``: PostgreSQL's statements by execution time in the throughput run."""
    if pg["unavailable"]:
        print(f"\nPostgreSQL statements: not counted ({pg['unavailable']})")
        return
    print(
        f"\n{'ms':>9} {'share':>6} {'calls':>7} {'rows':>7}  PostgreSQL statement, throughput run"
    )
    for st in pg["top"]:
        print(
            f"{st['ms']:>9,.1f} {st['share']:>6.1%} {st['calls']:>7} {st['rows']:>7}  "
            f"{st['statement']}"
        )

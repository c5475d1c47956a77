"""Faults during ingest: worker, nats-server and PostgreSQL killed, the vector index taken away.

Starts its own nats-server and PostgreSQL (from the wheels, free ports, a temp directory) and
``memstream worker`` as a child process, publishes N turns with the SDK (several tenants;
preferences, facts, personal data, filler), and while the pipeline works through them makes
each fault of the plan happen once, at a share of the turns stored: the worker SIGKILLed and
started again, nats-server SIGKILLed and started again on its port and store, PostgreSQL
SIGKILLed (every process) and started again, the vector index made unavailable (the worker's
offline switch, ``fault_vector_offline_file``) and brought back, the worker SIGKILLed again.
With ``--extra-workers N``, N ``memstream worker --stages extract,redact`` processes share
those stages with the worker (which owns the Qdrant Edge shard), and ``extra_kill`` SIGKILLs
the first of them and starts it again. ``helper_kill`` SIGKILLs the worker's helper process
(consumers/helper.py), which the worker replaces by itself; ``index_kill`` its index process
(consumers/indexproc.py), which the worker replaces at its next index call.

The publisher keeps at most ``--ahead`` turns beyond what is stored, so publishing lasts the
whole ingest and meets the NATS outage too; a publish that fails is retried with the same
event id (``Nats-Msg-Id``), so a turn whose PubAck was lost is stored once. Until a fault is
made, it publishes no more than ``--ahead`` turns past the one at which that fault is due
(``Gate``, consumers/bench/fault_plan.py). Each fault's row says how many turns were in
flight when it was made.

Targets: no turn lost or duplicated, the index holding exactly the memories Postgres holds,
no dead letter, everything processed within 60 s of the end of the last fault, and every
extra process extracted and redacted turns. The exit code is 1 when a target is missed.
The workers take the stage settings of the environment (MEMSTREAM_STAGE__*: batches on or off,
the ack deadline ...).

This module is the command: its arguments, the targets and the report it prints. The run
itself (servers, processes, publishing, the counts afterwards) is in ``fault_run.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from memstream.consumers.bench import fleet
from memstream.consumers.bench.fault_plan import KINDS, PLAN
from memstream.consumers.bench.fault_run import run

DRAIN_TARGET_S = 60.0


def targets(r: dict[str, Any]) -> dict[str, bool]:
    """Each target, met or not."""
    drain = r["drain_after_last_fault_s"]
    extras: dict[str, bool] = {}
    for row in r["processes"]:
        if row["process"] != "owner":
            did = all((row["handled"] or {}).get(stage, 0) > 0 for stage in ("extract", "redact"))
            extras[row["process"]] = extras.get(row["process"], False) or did
    return {
        "every fault injected": [f["fault"] for f in r["faults"]] == r["plan"],
        "0 lost": r["lost"] == 0 and r["published"] == r["turns"],
        "0 duplicated": r["duplicated"] == 0 and r["unexpected"] == 0,
        "index == Postgres": r["points_index"] == r["memories_live"] == r["memories_postgres"]
        and r["missing_in_index"] == 0,
        "0 dead letters": r["dead_letters"] == 0,
        f"drained within {DRAIN_TARGET_S:.0f} s of the last fault": drain is not None
        and drain <= DRAIN_TARGET_S,
        "every extra process extracted and redacted": all(extras.values()),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--turns", type=int, default=3000)
    p.add_argument(
        "--faults",
        type=_plan,
        default=PLAN,
        help=f"the faults, in order, comma-separated, from {', '.join(KINDS)} "
        f"(default: {','.join(PLAN)})",
    )
    p.add_argument("--tenants", type=int, default=3)
    p.add_argument("--users", type=int, default=4, help="users per tenant")
    p.add_argument(
        "--ahead",
        type=int,
        default=None,
        help="turns published beyond those stored (default: a tenth of --turns, at least 100)",
    )
    p.add_argument("--outage-s", type=float, default=2.0, help="NATS and Postgres stay down")
    p.add_argument("--index-outage-s", type=float, default=5.0, help="the index stays away")
    p.add_argument("--drain-limit-s", type=float, default=300.0, help="give up waiting after")
    p.add_argument("--stall-limit-s", type=float, default=180.0, help="no progress: give up")
    p.add_argument(
        "--extra-workers",
        type=int,
        default=0,
        help="extra `memstream worker --stages extract,redact` processes beside the worker",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp directory (logs, data)")


def _plan(text: str) -> list[str]:
    plan = [f.strip() for f in text.split(",") if f.strip()]
    if not plan or any(f not in KINDS for f in plan):
        raise argparse.ArgumentTypeError(f"faults are from {', '.join(KINDS)}")
    return plan


def main(args: argparse.Namespace) -> int:
    if "extra_kill" in args.faults and args.extra_workers < 1:
        print("memstream: the extra_kill fault needs --extra-workers 1 or more", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="memstream-faults-")
    try:
        r = asyncio.run(run(args, Path(tmp)))
    finally:
        if args.keep:
            print(f"  kept {tmp}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    met = targets(r)
    print(
        f"\nfaults during ingest: {r['turns']:,} turns, {r['tenants']} tenants, "
        f"{r['total_s']} s in all (worker start-up {r['worker_startup_s']} s)"
    )
    print(
        f"  {'fault':<15}{'at stored':>12}{'in flight':>11}{'started':>10}{'away':>8}"
        f"{'next stored':>13}"
    )
    for f in r["faults"]:
        nxt = "-" if f["next_stored_after_s"] is None else f"+{f['next_stored_after_s']} s"
        print(
            f"  {f['fault']:<15}{f['at_stored']:>12,}{f['in_flight']:>11,}{f['started_s']:>9} s"
            f"{f['down_s']:>6} s{nxt:>13}"
        )
    drain = r["drain_after_last_fault_s"]
    rows = [
        (
            "turns published (acked)",
            r["published"],
            f"in {r['publish_s']} s, {r['publish_retries']} publishes retried "
            f"({r['acked_as_duplicate']} acked as duplicates), at most {r['ahead']} ahead",
        ),
        ("episodes stored", r["episodes_stored"], f"lost {r['lost']}"),
        ("duplicated", r["duplicated"], f"stored but never acked {r['unexpected']}"),
        ("memories in Postgres", r["memories_postgres"], f"live {r['memories_live']}"),
        ("points in the index", r["points_index"], f"missing {r['missing_in_index']}"),
        ("dead letters", r["dead_letters"], "; ".join(r["dead_letter_reasons"]) or "-"),
        ("drained after last fault", "never" if drain is None else f"{drain} s", ""),
    ]
    for label, value, note in rows:
        print(f"  {label:<26}{value!s:>10}   {note}")
    if r["extra_workers"]:
        print("\n".join(fleet.table(r["processes"])))
    for turn in r["duplicated_turns"]:
        print(f"  duplicated turn {turn['event']}: episodes {', '.join(turn['memories'])}")
        print(f"    audit: {'; '.join(turn['audit'])}")
    for name, ok in met.items():
        print(f"  target {name}: {'met' if ok else 'MISSED'}")
    if args.json:
        print(json.dumps({**r, "targets": met}))
    return 0 if all(met.values()) else 1

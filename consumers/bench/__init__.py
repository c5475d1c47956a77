"""``memstream bench <name>``: benchmarks that print a table, or one JSON object with ``--json``.

Each benchmark module exposes ``add_arguments(parser)`` and ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "redaction": "memstream.consumers.bench.redaction",
    "locomo": "memstream.consumers.bench.locomo",
    "recall": "memstream.consumers.bench.recall",
    "faults": "memstream.consumers.bench.faults",
    "ingest": "memstream.consumers.bench.ingest",
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="run a benchmark")
    names = bench.add_subparsers(dest="bench", required=True)
    for name, module_name in BENCHES.items():
        module = importlib.import_module(module_name)
        parser = names.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        parser.add_argument("--json", action="store_true", help="print one JSON object last")
        module.add_arguments(parser)
        parser.set_defaults(func=module.main)

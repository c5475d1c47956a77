"""``memstream``: the command line. Agent verbs (publish, recall) live here; worker verbs
(dev, worker, bench ...) are added by the ``memstream[worker]`` extra via entry points."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from importlib.util import find_spec


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memstream", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from memstream.producers.commands import register as register_agent_verbs

    register_agent_verbs(sub)
    for ep in entry_points(group="memstream.cli"):
        try:
            ep.load()(sub)
        except ImportError:
            if find_spec("faststream") is not None:
                raise  # the worker extra is installed: a real error, not a missing extra
            continue  # SDK-only install: agent verbs only
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())

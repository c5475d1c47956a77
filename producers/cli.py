"""``memstream``: the command line. Agent verbs (publish, recall) live here; worker verbs
(dev, worker, bench ...) are added by the ``memstream[worker]`` extra via entry points."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from importlib.util import find_spec

from pydantic import ValidationError


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
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        # Ctrl-C: each command has stopped what it started on its way out (asyncio.run
        # cancels its tasks, their finally blocks stop the servers); a traceback would only
        # say where it was waiting. 130 is what a shell reports for a command stopped by SIGINT
        print("memstream: interrupted", file=sys.stderr)
        return 130
    except ValidationError as exc:
        if exc.title != "Settings":
            raise
        print(settings_error(exc), file=sys.stderr)
        return 2
    return code


def settings_error(exc: ValidationError) -> str:
    """One line per invalid ``MEMSTREAM_*`` variable, without its value (it may be a secret)."""
    lines = ["memstream: invalid configuration:"]
    for err in exc.errors(include_input=False, include_url=False):
        name = "MEMSTREAM_" + "__".join(str(p) for p in err["loc"]).upper()
        lines.append(f"  {name}: {err['msg']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

"""`memstream bench faults` run as a child process on servers it starts itself (never the
machine's), and the exactly-once checks every run of it must pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MEMSTREAM = str(Path(sys.executable).parent / "memstream")


def run(args: list[str], timeout_s: float, **env: str) -> tuple[dict[str, Any], str, int]:
    """The bench's JSON report, its stderr and exit code; ``env`` (MEMSTREAM_STAGE__* ...) is
    all of the MEMSTREAM_ environment it sees."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    done = subprocess.run(
        [MEMSTREAM, "bench", "faults", *args, "--json"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr, done.returncode


def assert_exactly_once(report: dict[str, Any], turns: int) -> None:
    """Every acked turn has exactly one episode, the index holds what Postgres holds, and
    nothing was dead-lettered."""
    assert report["published"] == report["episodes_stored"] == turns
    assert report["lost"] == 0 and report["duplicated"] == 0 and report["unexpected"] == 0
    assert report["points_index"] == report["memories_live"] == report["memories_postgres"]
    assert report["memories_postgres"] > turns  # typed memories besides the episodes
    assert report["missing_in_index"] == 0
    assert report["dead_letters"] == 0, report["dead_letter_reasons"]

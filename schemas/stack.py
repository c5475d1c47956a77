"""The stack file: how a running ``memstream dev`` tells other processes where it is.

``<state_dir>/stack.json`` is written by the dev/worker process once its services are up
and removed when it stops. The CLI and the SDK read it when no URL is configured. It holds
addresses only, never a credential: the embedded Postgres DSN it carries is a loopback
server without a password, and a configured DSN is never written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

STACK_FILE = "stack.json"


def stack_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / STACK_FILE


def read_stack(state_dir: str | Path) -> dict[str, str]:
    """The stack file's entries; empty when there is no running stack (or the file is not
    one of ours)."""
    try:
        data = json.loads(stack_path(state_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items() if isinstance(v, str | int)}


def write_stack(state_dir: str | Path, entries: Mapping[str, str]) -> Path:
    """Replace the stack file atomically (readers never see half a file), owner-only."""
    path = stack_path(state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    tmp.touch(mode=0o600)  # created owner-only before anything is written into it
    tmp.write_text(json.dumps(dict(entries)), encoding="utf-8")
    tmp.replace(path)
    return path


def remove_stack(state_dir: str | Path) -> None:
    stack_path(state_dir).unlink(missing_ok=True)

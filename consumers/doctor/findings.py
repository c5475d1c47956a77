"""What one check found, and the limits every check shares."""

from __future__ import annotations

from dataclasses import dataclass

TIMEOUT_S = 5.0  # per server: a doctor that hangs on a dead server explains nothing


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""  # what to do, when not ok

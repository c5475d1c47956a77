"""MEMSTREAM_LOCK_MEMORY: mlockall the worker, or say why not (never a failure later)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from memstream.consumers import memlock

PROBE = """
from memstream.consumers.memlock import lock_memory
why = lock_memory()
locked_kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmLck:"))
print(repr(why), locked_kb)
"""


def test_locks_the_process_when_allowed_else_says_why() -> None:
    """In a child process (this one stays unlocked): with CAP_IPC_LOCK or an unlimited
    RLIMIT_MEMLOCK the pages are locked (VmLck > 0), else nothing is and the reason is given."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    why, locked_kb = out[0], int(out[-1])
    allowed = memlock._can_ipc_lock() or (
        resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] == resource.RLIM_INFINITY
    )
    if allowed:
        assert why == "None" and locked_kb > 0
    else:
        assert "RLIMIT_MEMLOCK" in " ".join(out) and locked_kb == 0


def test_refuses_up_front_when_future_allocations_could_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finite limit without CAP_IPC_LOCK: MCL_FUTURE could make later allocations fail, so
    mlockall is never called."""
    monkeypatch.setattr(memlock, "_can_ipc_lock", lambda: False)
    monkeypatch.setattr(memlock.resource, "getrlimit", lambda _: (8 << 20, 8 << 20))

    def no_libc(*_: object, **__: object) -> None:
        raise AssertionError("mlockall must not be called")

    monkeypatch.setattr(memlock.ctypes, "CDLL", no_libc)
    why = memlock.lock_memory()
    assert why is not None and "RLIMIT_MEMLOCK is 8388608 bytes" in why

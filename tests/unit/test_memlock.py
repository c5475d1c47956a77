"""MEMSTREAM_LOCK_MEMORY: mlockall the worker, or say why not (never a failure later)."""

from __future__ import annotations

import os
import resource
import shutil
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

# The conditions are set on the child process from outside (its RLIMIT_MEMLOCK, its
# capability bounding set), so the expected outcome never comes from the code under test.
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="setting a child's RLIMIT_MEMLOCK and capabilities needs root and util-linux setpriv",
)


def _probe(limit: int, drop_ipc_lock: bool) -> tuple[str, int]:
    cmd = [sys.executable, "-c", PROBE]
    if drop_ipc_lock:
        cmd = ["setpriv", "--bounding-set", "-ipc_lock", "--inh-caps", "-ipc_lock", *cmd]

    def limit_memlock() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))

    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, preexec_fn=limit_memlock
    ).stdout.split()
    return " ".join(out[:-1]), int(out[-1])


@needs_root
@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] != resource.RLIM_INFINITY,
    reason="the hard RLIMIT_MEMLOCK is finite here and CAP_SYS_RESOURCE is needed to raise it",
)
def test_locks_the_process_with_an_unlimited_limit() -> None:
    """A child with an unlimited RLIMIT_MEMLOCK and no CAP_IPC_LOCK locks its pages
    (VmLck > 0)."""
    why, locked_kb = _probe(resource.RLIM_INFINITY, drop_ipc_lock=True)
    assert why == "None" and locked_kb > 0


@needs_root
def test_locks_the_process_with_cap_ipc_lock() -> None:
    """A child with CAP_IPC_LOCK and a small RLIMIT_MEMLOCK locks its pages."""
    why, locked_kb = _probe(64 << 10, drop_ipc_lock=False)
    assert why == "None" and locked_kb > 0


@needs_root
def test_refuses_without_the_right_and_says_why() -> None:
    """A child with a finite RLIMIT_MEMLOCK and without CAP_IPC_LOCK locks nothing and
    gives the reason."""
    why, locked_kb = _probe(64 << 10, drop_ipc_lock=True)
    assert "RLIMIT_MEMLOCK is 65536 bytes" in why and locked_kb == 0


def test_refuses_up_front_when_future_allocations_could_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finite limit without CAP_IPC_LOCK: MCL_FUTURE could make later allocations fail, so
    mlockall is never called."""
    monkeypatch.setattr(memlock, "_can_ipc_lock", lambda: False)
    monkeypatch.setattr(
        "memstream.consumers.memlock.resource.getrlimit", lambda _: (8 << 20, 8 << 20)
    )

    def no_libc(*_: object, **__: object) -> None:
        raise AssertionError("mlockall must not be called")

    monkeypatch.setattr("memstream.consumers.memlock.ctypes.CDLL", no_libc)
    why = memlock.lock_memory()
    assert why is not None and "RLIMIT_MEMLOCK is 8388608 bytes" in why

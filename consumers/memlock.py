"""Keep the worker's memory resident: ``mlockall`` (``MEMSTREAM_LOCK_MEMORY``).

The Qdrant Edge shard is memory-mapped files. A host that reclaims page cache it considers
cold (DAMON-based reclaim on some VMs, even with plenty of free memory) makes searches fault
those pages back in from disk, in the middle of a recall (docs/recall.md has what that cost
on this project's VM). Locking keeps every mapped and future page in RAM, as Elasticsearch's
``bootstrap.memory_lock`` does; the shard then costs its full size in RAM. Needs
``CAP_IPC_LOCK`` or a ``RLIMIT_MEMLOCK`` (``ulimit -l``) above the process's size; when
refused, the worker logs why and runs unlocked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource

MCL_CURRENT, MCL_FUTURE = 1, 2


def lock_memory() -> str | None:
    """Lock the process's current and future pages; None on success, else why not. Refused
    up front when future locking could make later allocations fail: only with CAP_IPC_LOCK
    or an unlimited RLIMIT_MEMLOCK."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != resource.RLIM_INFINITY and not _can_ipc_lock():
        return f"RLIMIT_MEMLOCK is {soft} bytes and the process lacks CAP_IPC_LOCK"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.mlockall(MCL_CURRENT | MCL_FUTURE) != 0:
        return f"mlockall failed: {os.strerror(ctypes.get_errno())}"
    return None


def _can_ipc_lock() -> bool:
    """Whether the effective capabilities hold CAP_IPC_LOCK (bit 14)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 14 & 1)
    except OSError:
        pass
    return False

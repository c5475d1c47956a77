"""What this host lets a process do, found out by trying it in a child process, so that a test's
expectation never comes from the code under test."""

from __future__ import annotations

import subprocess
import sys

# mlock more than RLIMIT_MEMLOCK allows: only CAP_IPC_LOCK (or no limit) lets that succeed
_MLOCK_PROBE = """
import ctypes, ctypes.util, mmap, resource, sys
soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
if soft == resource.RLIM_INFINITY:
    print(1)
    sys.exit()
size = soft + 4 * mmap.PAGESIZE
buf = mmap.mmap(-1, size)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
print(1 if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) == 0 else 0)
"""


def may_lock_memory() -> bool:
    """Whether a process of this user may lock more memory than its RLIMIT_MEMLOCK: the
    condition under which the worker's ``mlockall`` is attempted and succeeds."""
    out = subprocess.run(
        [sys.executable, "-c", _MLOCK_PROBE], capture_output=True, text=True, check=True
    )
    return out.stdout.strip() == "1"

"""Ingest below recall on a busy machine (``MEMSTREAM_STAGE__INGEST_NICE``).

On a machine whose cores the pipeline keeps busy, a recall request waits for its process to
be scheduled: the index process's own search took p95 5-7 ms while the client saw 19-30 ms
(docs/benchmarks.md, "thirteenth session"). A worker that does not answer recall itself (its
index process does, or it runs only extract and redact) may run its stages at a higher nice
value, so that the recall path wins the cores when both want them. With nice 10 on the worker
and its helper, recall p95 at the client fell from 16-23 to 10-14 ms while publish-to-
recallable p95 rose from 0.4-0.8 to 0.9-1.5 s (twelfth session): a trade, off by default.

Linux keeps a nice value per thread, and a thread or process inherits the value of the
thread that creates it. So the worker raises the value of each of its threads but one: the
thread that starts its index process (``RemoteIndex``, which starts every index process from
that thread), so an index process started again after a crash runs at the worker's original
value. The helper process is lowered with the worker, and one started again inherits it.
Raising a nice value needs no privilege; lowering it would, which is why the index process
is never lowered in the first place rather than restored later.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from pathlib import Path

from memstream.consumers.logs import log


def threads(pid: int | None = None) -> list[int]:
    """The thread ids of a process (this one by default); none where /proc is missing."""
    try:
        return [int(t.name) for t in Path(f"/proc/{pid or 'self'}/task").iterdir()]
    except OSError:
        return []


def nice_of(tid: int) -> int:
    """A thread's nice value (Linux: ``PRIO_PROCESS`` with a thread id names one thread)."""
    return os.getpriority(os.PRIO_PROCESS, tid)


def lower(nice: int, tids: Iterable[int], keep: Collection[int] = ()) -> int:
    """Raise every thread of ``tids`` but ``keep`` to ``nice`` (never lower one already
    above it); the threads changed. A thread that has exited meanwhile is skipped."""
    changed = 0
    for tid in tids:
        if tid in keep:
            continue
        try:
            if nice_of(tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return changed


def lower_ingest(nice: int, keep: Collection[int], helper_pid: int | None) -> None:
    """This worker's threads but ``keep``, and its helper process's, at ``nice``."""
    if not hasattr(os, "setpriority") or not threads():
        log.warning("stage.ingest_nice_unsupported", reason="no per-thread priorities here")
        return
    mine = lower(nice, threads(), keep)
    helper = lower(nice, threads(helper_pid)) if helper_pid is not None else 0
    log.info("stage.ingest_niced", nice=nice, threads=mine, helper_threads=helper)

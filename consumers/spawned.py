"""What the worker's child processes (the helper, the index process) share about their lives:
Ctrl-C does not reach them, and they leave with their worker.

Ctrl-C at a terminal sends SIGINT to the whole process group, children included; the worker
stops its children itself, in order (``consumers/run.py``). A child ignores SIGINT from the
top of its main, but a ``spawn`` child imports the module of its main first, ~1 s of
imports during which a Ctrl-C raised KeyboardInterrupt in it and printed its traceback. So
the child is started with SIGINT blocked: the thread that starts it blocks the signal for
the time of ``start``, the blocked mask is inherited through fork and exec, and the child
unblocks it once it ignores it (a SIGINT that came meanwhile is then discarded). Only the
starting thread blocks it, so the worker's other threads still take a Ctrl-C meant for it.
(CPython starts its resource tracker the same way.)
"""

from __future__ import annotations

import os
import signal
import time
from multiprocessing import resource_tracker
from typing import Any

PARENT_CHECK_S = 0.5  # how often a child checks that its worker is still there


def start(proc: Any) -> None:
    """``proc.start()`` (a multiprocessing ``Process``) with SIGINT blocked in the child until
    it calls ``ignore_ctrl_c``."""
    # a spawn starts multiprocessing's resource tracker first if it is not running, and that
    # start unblocks SIGINT in this thread when it is done: started here, before the block
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_ctrl_c() -> None:
    """In the child, first thing: SIGINT ignored from now on, and no longer blocked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def exit_with(parent: int) -> None:
    """Exit once ``parent`` is no longer this process's parent (killed outright, it could not
    stop its child): run in a daemon thread of the child."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)

"""MEMSTREAM_CPU_LATENCY_US: a PM QoS request held while the worker runs, or why not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memstream.consumers import cpulatency
from memstream.consumers.run import cpu_latency

PROBE = """
from memstream.consumers.cpulatency import current_cpu_latency, hold_cpu_latency
before = current_cpu_latency()
hold = hold_cpu_latency(3)
during = current_cpu_latency()
if not isinstance(hold, str):
    hold.close()
print(repr(hold if isinstance(hold, str) else None), before, during, current_cpu_latency())
"""


@pytest.mark.skipif(
    not cpulatency.DEVICE.exists(), reason="this kernel has no /dev/cpu_dma_latency"
)
def test_holds_the_latency_until_closed_where_allowed() -> None:
    """In a child process: where the device is writable the kernel enforces the request while
    it is held (3 µs, below the idle default, for the few milliseconds the child lives) and
    drops it when closed; elsewhere the reason is given and nothing changes."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    before, during, after = int(out[-3]), int(out[-2]), int(out[-1])
    if os.access(cpulatency.DEVICE, os.W_OK):
        assert out[0] == "None" and during == min(before, 3) and after == before
    else:
        assert "cannot open" in " ".join(out[:-3]) and during == before


def test_says_why_not_instead_of_failing(tmp_path: Path) -> None:
    """A missing device or a negative latency gives a reason, never an exception."""
    missing = tmp_path / "no-such-device"
    why = cpulatency.hold_cpu_latency(0, missing)
    assert isinstance(why, str) and why.startswith(f"cannot open {missing}")
    assert cpulatency.current_cpu_latency(missing) is None
    assert cpulatency.hold_cpu_latency(-1, missing) == "the latency must be 0 or more µs, not -1"


def test_the_worker_holds_only_when_configured() -> None:
    """Unset, nothing is opened; set, the worker holds the request where the device allows
    it, and runs on without it elsewhere. The value asked for is the one already in force,
    so the test never changes the host's CPU latency."""
    assert cpu_latency(None) is None  # unset: the kernel decides, nothing is opened
    now = cpulatency.current_cpu_latency()
    hold = cpu_latency(now if now is not None else 2_000_000_000)
    if os.access(cpulatency.DEVICE, os.W_OK):
        assert hold is not None and hold.us == now
        assert cpulatency.current_cpu_latency() == now
        hold.close()
        hold.close()  # closing twice is harmless
    else:
        assert hold is None  # logged as worker.cpu_latency_failed; the worker runs on

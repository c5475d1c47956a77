"""Keep the CPUs out of deep idle states while the worker runs (``MEMSTREAM_CPU_LATENCY_US``).

A recall is a chain of wake-ups: the client's request wakes NATS, NATS wakes the worker, the
reply wakes NATS and the client again. An idle CPU of a virtual machine halts, and waking a
halted virtual CPU goes through the host, which adds to every hop of the chain (measured on
this project's VM: docs/recall.md, "where the client's time goes").

Linux's PM QoS interface does this: a process writes the wake-up latency it tolerates, in µs,
to ``/dev/cpu_dma_latency`` and the request holds, for every CPU, for as long as it keeps the
file open (``Documentation/power/pm_qos_interface.rst``; tuned's latency-performance profile
does the same). 0 keeps idle CPUs polling instead of halting: the lowest latency, at the cost
of busy idle CPUs (power, and the host sees them used). Needs write access to the device
(root); when refused, the worker logs why and runs without it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

DEVICE = Path("/dev/cpu_dma_latency")


class CpuLatencyHold:
    """An open PM QoS request; ``close()`` (or the process's exit) releases it."""

    def __init__(self, fd: int, us: int) -> None:
        self._fd: int | None = fd
        self.us = us

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def hold_cpu_latency(us: int, device: Path = DEVICE) -> CpuLatencyHold | str:
    """Ask every CPU to wake within ``us`` µs until the hold is closed; the hold, or why
    not (the device is missing or not writable)."""
    if us < 0:
        return f"the latency must be 0 or more µs, not {us}"
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as exc:
        return f"cannot open {device}: {exc.strerror}"
    try:
        os.write(fd, struct.pack("i", us))  # the binary form: a native 32-bit int
    except OSError as exc:
        os.close(fd)
        return f"cannot write {device}: {exc.strerror}"
    return CpuLatencyHold(fd, us)


def current_cpu_latency(device: Path = DEVICE) -> int | None:
    """The latency the kernel enforces now (the lowest of all holds), or None if unreadable."""
    try:
        data = device.read_bytes()[:4]
    except OSError:
        return None
    return int(struct.unpack("i", data)[0]) if len(data) == 4 else None

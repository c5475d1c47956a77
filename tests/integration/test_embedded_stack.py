"""The embedded stack's servers across runs: a nats-server that an earlier run left on the
state directory (``memstream dev`` killed outright cannot stop it: it runs in a session of
its own) is stopped before another starts on the same JetStream store."""

from __future__ import annotations

import os
import subprocess

import nats

from memstream.consumers.embedded import NATS_PIDFILE, EmbeddedNats, stop_stale_nats


async def test_a_nats_server_left_on_the_store_is_stopped_before_another_starts(tmp_path):
    """A server still running on the state directory (as after a SIGKILLed `memstream dev`)
    is stopped when the next one starts there, and the new one serves JetStream."""
    left = EmbeddedNats.start(tmp_path / "nats")  # nobody will stop this one: a killed run's
    try:
        ours = EmbeddedNats.start(tmp_path / "nats")
        try:
            # the one left behind is gone (two servers would both write the store) ...
            assert left.proc.wait(timeout=15) is not None
            # ... and ours serves JetStream on that store
            nc = await nats.connect(ours.url)
            try:
                info = await nc.jetstream().account_info()
                assert info.limits is not None
            finally:
                await nc.close()
        finally:
            ours.stop()
    finally:
        left.stop()


def test_a_pid_file_naming_another_process_stops_nothing(tmp_path):
    """A pid in the file that is not a nats-server on this store (a reused pid, or this very
    process) is left alone."""
    store = tmp_path / "nats" / "jetstream"
    store.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "30"])  # a process that reused the pid: not a server
    try:
        (tmp_path / "nats" / NATS_PIDFILE).write_text(str(other.pid))
        assert stop_stale_nats(tmp_path / "nats" / NATS_PIDFILE, store) is False
        assert other.poll() is None
        (tmp_path / "nats" / NATS_PIDFILE).write_text(str(os.getpid()))  # this test's process
        assert stop_stale_nats(tmp_path / "nats" / NATS_PIDFILE, store) is False
    finally:
        other.kill()
        other.wait()

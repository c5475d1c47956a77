"""Ctrl-C at a terminal reaches a worker's children too (the whole process group). A child
still importing its main's module, before that main ignores SIGINT, must neither die of it
nor print a KeyboardInterrupt traceback (consumers/spawned.py): the helper and the index
process, each sent SIGINT the moment it exists, start and answer."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstream.consumers.helper import Helper
from memstream.consumers.indexproc import RemoteIndex
from memstream.schemas.events import Message, Role, TurnEvent
from memstream.schemas.memory import MemoryType, Scope
from memstream.schemas.settings import Settings
from memstream.storage.ports import VectorFilter, VectorPoint

pytestmark = pytest.mark.integration


def _children() -> set[int]:
    """This process's child processes (Linux /proc)."""
    me, found = str(os.getpid()), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if ppid == me:
            found.add(int(entry.name))
    return found


@contextlib.contextmanager
def ctrl_c_to_new_children() -> Iterator[list[int]]:
    """Send SIGINT to each child process started meanwhile as soon as it is seen (within a
    millisecond or two: a spawned child spends ~1 s importing); yields the pids sent it."""
    before, sent = _children(), list[int]()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in sorted(_children() - before - set(sent)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
                    sent.append(pid)
            done.wait(0.001)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        done.set()
        thread.join()


async def test_a_helper_sent_ctrl_c_while_it_imports_starts_and_prepares(capfd) -> None:
    """A helper sent SIGINT the moment it exists still starts, prepares a turn, and prints
    no KeyboardInterrupt."""
    helper = Helper(Settings(), b"k" * 32)
    try:
        with ctrl_c_to_new_children() as sent:
            await helper.start()
        assert helper.pid in sent  # it was sent SIGINT while it started, and lived
        turn = TurnEvent(
            tenant="acme", user="bo", messages=[Message(role=Role.USER, content="I prefer tea.")]
        )
        prepared = await helper.prepare([turn])
        assert [c.content for c in prepared.candidates[0]][-1] == "I prefer tea."
    finally:
        await helper.close()
    assert "KeyboardInterrupt" not in capfd.readouterr().err


async def test_an_index_process_sent_ctrl_c_while_it_imports_starts_and_answers(
    capfd, nats_url: str, database_url: str, namespace: str, tmp_path: Path, embedder
) -> None:
    """An index process sent SIGINT the moment it exists still starts, stores a point and
    finds it, and prints no KeyboardInterrupt."""
    settings = Settings(nats_url=nats_url, namespace=namespace, state_dir=tmp_path)
    index = RemoteIndex(settings, nats_url, database_url, b"test-key", schema=namespace)
    try:
        with ctrl_c_to_new_children() as sent:
            await index.start()
        assert index.pid in sent
        [vector] = embedder.embed(["a note about the harbour"])
        point = VectorPoint(
            id=str(uuid.uuid4()),
            vector=list(vector),
            tenant="acme",
            user="bo",
            agent=None,
            session="s1",
            type=MemoryType.EPISODE,
            scope=Scope.USER,
            occurred_at=time.time(),
        )
        await index.upsert([point])
        hits = await index.search(vector, VectorFilter(tenant="acme", user="bo"), 1)
        assert [h[0] for h in hits] == [point.id]
    finally:
        await index.close()
    assert "KeyboardInterrupt" not in capfd.readouterr().err

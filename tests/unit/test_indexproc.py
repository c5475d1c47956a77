"""The worker's side of the index process (consumers/indexproc.py) on a real socket, with this
test playing the child: an answer that cannot be read fails its call with an index outage
instead of leaving it waiting, and the calls after it are answered."""

from __future__ import annotations

import asyncio
import pickle
import socket

import pytest

from memstream.consumers import indexproc, indexwire
from memstream.schemas.errors import StorageUnavailable
from memstream.schemas.settings import Settings


class _TwoArgs(Exception):
    """An exception that pickles but does not unpickle (its __init__ needs two arguments)."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(a)


async def test_an_unreadable_answer_fails_its_call_and_the_next_is_answered() -> None:
    """The child answers the first call with an exception that cannot be unpickled: that
    call raises StorageUnavailable at once; the second call gets its answer."""
    mine, theirs = socket.socketpair()
    index = indexproc.RemoteIndex(Settings(), "nats://unused", "postgres://unused", b"k")
    reader, writer = await asyncio.open_connection(sock=mine)
    index._writer = writer
    index._reading = asyncio.create_task(index._answers(reader, writer))
    child_reader, child_writer = await asyncio.open_connection(sock=theirs)

    async def child() -> None:
        rid, _ = await indexwire.read(child_reader)
        child_writer.write(indexwire.frame(rid, ("error", _TwoArgs("x", "y"))))
        rid, data = await indexwire.read(child_reader)
        assert pickle.loads(data)[0] == "count"
        child_writer.write(indexwire.frame(rid, ("ok", 7)))
        await child_writer.drain()

    answering = asyncio.create_task(child())
    async with asyncio.timeout(5):
        with pytest.raises(StorageUnavailable, match="unreadable answer"):
            await index.count()
        assert await index.count() == 7
    await answering
    child_writer.close()
    await index.close()

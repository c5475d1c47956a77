"""The wire between a worker and its index process (consumers/indexproc.py): one socket,
frames of a request id and a pickle. The worker sends ``(method, args, kwargs)``; the child
answers ``("ok", value)`` or ``("error", exception)`` under the same id, and its first frame
(id 0) says whether it started: ``("ready", None)`` or ``("error", exception)``."""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

from memstream.schemas.errors import StorageUnavailable

FRAME = struct.Struct("!QI")  # request id, payload length
# the calls a worker may make: the VectorIndex port's methods, nothing else of the adapter
METHODS = frozenset(
    {
        "ensure",
        "upsert",
        "search",
        "search_many",
        "search_sparse",
        "fetch",
        "delete",
        "count",
        "optimize",
    }
)
# what the worker asks around an optimize that builds (``Maintenance``): whether it would,
# and this process's recall responder off and on again, while the worker answers recall
RECALL_HANDOVER = frozenset({"optimize_builds", "recall_off", "recall_on"})


def frame(rid: int, answer: tuple[Any, ...]) -> bytes:
    """One frame: ``answer`` pickled under ``rid``; an answer that does not pickle is sent as
    an error naming its type only."""
    try:
        data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - an answer that does not pickle: its type only
        data = pickle.dumps(("error", StorageUnavailable(f"index process: {type(exc).__name__}")))
    return FRAME.pack(rid, len(data)) + data


async def read(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The next frame: its request id and its pickled body."""
    rid, size = FRAME.unpack(await reader.readexactly(FRAME.size))
    return rid, await reader.readexactly(size)


def answer_of(data: bytes) -> tuple[str, Any]:
    """An answer of the index process, or the error that fails its call if it cannot be
    read (an exception that does not unpickle): that call fails, never waits for ever."""
    try:
        answer: tuple[str, Any] = pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - any unreadable answer
        return "error", StorageUnavailable(
            f"index process: unreadable answer ({type(exc).__name__})"
        )
    return answer

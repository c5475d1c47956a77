"""The index process itself: it opens the Qdrant Edge shard, answers ``<ns>.recall`` and
the command verbs as a worker of the ``recall`` role, and serves its worker's index calls over
the socket (consumers/indexwire.py), one at a time, in the order sent. Started by
``RemoteIndex`` (consumers/indexproc.py), whose module docstring says why it exists."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import pickle
import signal
import socket
import threading
from typing import Any

from memstream.consumers import loops, spawned
from memstream.consumers.indexwire import METHODS, RECALL_HANDOVER, frame, read
from memstream.consumers.logs import configure, log
from memstream.schemas.errors import MemstreamError, StorageUnavailable
from memstream.schemas.settings import Settings

NAME = b"memstream-index"  # the process's name, 15 bytes at most
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def _linux_prctl(option: int, value: int | bytes) -> None:
    """``prctl(2)`` where there is one (Linux); nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, value, 0, 0, 0)


async def _handover(method: str, worker: Any, vectors: Any) -> bool:
    try:
        if method == "optimize_builds":
            return bool(vectors.optimize_builds())
        if method == "recall_off":
            await worker.recall_off()
        else:
            await worker.recall_on()
    except MemstreamError:
        raise
    except Exception as exc:  # a NATS error: the worker sees an outage, and says which step
        raise StorageUnavailable(f"index process: {method} failed ({type(exc).__name__})") from exc
    return True


def main(
    sock: socket.socket, settings: Settings, nats_url: str, dsn: str, key: bytes, schema: str
) -> None:
    # Ctrl-C reaches the whole process group: the worker stops the child, not the signal
    spawned.ignore_ctrl_c()
    # A worker killed outright cannot stop its child, and the child holds the shard's lock,
    # which the worker started again in its place needs: the kernel kills the child with its
    # worker (Linux), else the child leaves on its own within PARENT_CHECK_S.
    _linux_prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    _linux_prctl(PR_SET_NAME, NAME)  # /proc/<pid>/comm: tells it from the helper process
    threading.Thread(target=spawned.exit_with, args=(os.getppid(),), daemon=True).start()
    loops.run(_serve(sock, settings, nats_url, dsn, key, schema), settings.event_loop)


async def _serve(
    sock: socket.socket, settings: Settings, nats_url: str, dsn: str, key: bytes, schema: str
) -> None:
    from memstream.consumers.app import Worker
    from memstream.consumers.quietgc import quieter_gc
    from memstream.consumers.redaction_key import make_redactor
    from memstream.consumers.services import Services
    from memstream.consumers.stack import make_vector_index
    from memstream.storage.embedding import make_embedder
    from memstream.storage.postgres import PgStore

    configure(settings.log_level)
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        embedder = make_embedder(settings.embedding_model, settings.embedding_path)
        redactor = make_redactor(settings, key)
        pg = await PgStore.connect(dsn, schema=schema)
        vectors = make_vector_index(settings, embedder.dim)
        try:
            await vectors.ensure(embedder.dim)
        except StorageUnavailable:  # as the worker starts: degraded, maintenance retries
            log.warning("startup.vector_index_unreachable", action="starting degraded")
        mine = settings.model_copy(update={"stages": ("recall",)})
        worker = Worker(Services(mine, pg, vectors, embedder, redactor), nats_url)
        worker.dev_redaction_key = settings.redaction_key is None
        await worker.start()
    except Exception as exc:  # noqa: BLE001 - the worker's start raises it
        writer.write(frame(0, ("error", exc)))
        await writer.drain()
        return
    quieter_gc()
    writer.write(frame(0, ("ready", None)))
    log.info("index_process.started")
    try:
        while True:
            try:
                rid, data = await read(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # the worker closed its end, or is gone
            answer: tuple[str, Any]
            try:
                method, args, kwargs = pickle.loads(data)
            except Exception as exc:  # noqa: BLE001 - that call fails, the others go on
                method, args, kwargs = f"<unreadable: {type(exc).__name__}>", (), {}
            if method == "metrics":  # this process's series, for the worker's /metrics
                answer = ("ok", worker.telemetry.render())
            elif method in RECALL_HANDOVER:
                try:
                    answer = ("ok", await _handover(method, worker, vectors))
                except Exception as exc:  # noqa: BLE001 - raised again in the worker
                    answer = ("error", exc)
            elif method not in METHODS:
                answer = ("error", StorageUnavailable(f"index process: no method {method!r}"))
            else:
                try:
                    answer = ("ok", await getattr(vectors, method)(*args, **kwargs))
                except Exception as exc:  # noqa: BLE001 - raised again in the worker
                    answer = ("error", exc)
            writer.write(frame(rid, answer))
            if writer.transport.get_write_buffer_size() > 1 << 20:
                await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            await worker.stop()
        await vectors.close()
        await pg.close()

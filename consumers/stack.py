"""The services a worker runs against (``Stack``): NATS and PostgreSQL, each the configured
one or an embedded server started under the state directory, and the vector index the
settings name (a Qdrant server, else a Qdrant Edge shard).

Separate from ``run.py`` (the ``dev`` and ``worker`` commands, their start-up and shutdown)
because more than those commands open it: ``memstream reindex --now`` and the index process
open the same vector index, the benchmarks and the tests the same stack.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from memstream.consumers import creds
from memstream.consumers.embedded import EmbeddedNats, EmbeddedPostgres
from memstream.schemas.settings import Settings
from memstream.storage.ports import VectorIndex
from memstream.storage.postgres import PgStore


def make_vector_index(settings: Settings, dim: int = 0) -> VectorIndex:
    if settings.fault_vector_offline_file is not None:
        from memstream.consumers.faults import OfflineSwitch

        inner = make_vector_index(settings.model_copy(update={"fault_vector_offline_file": None}))
        return cast(VectorIndex, OfflineSwitch(inner, settings.fault_vector_offline_file))
    if settings.qdrant_url:
        from memstream.storage.qdrant_server import ServerVectorIndex

        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return ServerVectorIndex(
            url=settings.qdrant_url,
            api_key=key,
            collection=settings.collection,
            idf_scope=settings.idf_scope,
            dim=dim,
        )
    from memstream.storage.qdrant_edge import EdgeVectorIndex

    return EdgeVectorIndex(
        settings.state_dir / "qdrant" / settings.collection,
        idf_scope=settings.idf_scope,
        hnsw_ef=settings.hnsw_ef,
        segment_kb=settings.index_segment_kb,
        segments=settings.index_segments,
    )


@dataclass
class Stack:
    """Everything a worker needs, started (embedded) or connected (configured)."""

    settings: Settings
    nats_url: str
    database_url: str
    pg: PgStore
    vectors: VectorIndex
    embedded: list[Any] = field(default_factory=list)
    schema: str = "public"

    @classmethod
    async def open(cls, settings: Settings, schema: str = "public", dim: int = 0) -> Stack:
        embedded: list[Any] = []
        state = settings.state_dir
        try:
            if settings.nats_url:
                nats_url = settings.nats_url
            else:
                config = None
                if settings.embedded_bus_auth:
                    config, worker_creds = await asyncio.to_thread(bus_authority, settings)
                    settings = settings.model_copy(update={"nats_creds": worker_creds})
                n = await _server(EmbeddedNats.start, state / "nats", None, config)
                embedded.append(n)
                nats_url = n.url
            if settings.database_url:
                db = settings.database_url.get_secret_value()
            else:
                p = await _server(EmbeddedPostgres.start, state / "postgres")
                embedded.append(p)
                db = p.dsn
            pg = await PgStore.connect(db, schema=schema)
            vectors = make_vector_index(settings, dim)
        except BaseException:
            for e in reversed(embedded):
                e.stop()
            raise
        return cls(settings, nats_url, db, pg, vectors, embedded, schema)

    async def close(self) -> None:
        await self.vectors.close()
        await self.pg.close()
        for e in reversed(self.embedded):
            await asyncio.to_thread(e.stop)


async def _server(start: Callable[..., Any], *args: Any) -> Any:
    """``start(*args)``, a blocking server start, in a thread. A cancellation (a stop signal
    during start-up) cannot stop that thread: what it starts is stopped once it is up, and
    only then does the cancellation go on."""
    starting = asyncio.ensure_future(asyncio.to_thread(start, *args))
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            server = await starting
            await asyncio.to_thread(server.stop)
        raise


def bus_authority(settings: Settings) -> tuple[Path, Path]:
    """The embedded bus's authority (created once under the state directory) and a worker
    credential for this namespace: the server configuration and the worker's .creds file."""
    authority = settings.state_dir / "nats-auth"
    creds.init(authority, settings.namespace)
    worker_creds = creds.worker(
        authority, settings.namespace, authority / creds.WORKER_CREDS, overwrite=True
    )
    return authority / creds.AUTH_CONF, worker_creds

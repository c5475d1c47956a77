"""The one services object of a worker process: built once by the composition root
(consumers/run.py) and read by ``Worker``, ``Deps``, ``RecallService`` and the
``Authenticator``, so that a test swaps a store, the index or the embedder in one place
(``worker.services.vectors = ...``: Worker, Deps, recall and commands hold this one object,
so all of them see the swap).

What needs the bus connection (the recall cache, the LLM extractor's client, metrics) is
made when the worker starts and stays in ``Deps``: it cannot exist before the connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memstream.pipeline.redact import Redacts
from memstream.schemas.settings import Settings
from memstream.storage.pgports import Clock, Store
from memstream.storage.ports import Embedder, VectorIndex

if TYPE_CHECKING:
    from memstream.consumers.helper import Helper


@dataclass
class Services:
    settings: Settings
    store: Store  # the record of truth: PgStore, or MemoryStore in application tests
    vectors: VectorIndex
    embedder: Embedder
    redactor: Redacts
    # the process that extracts and redacts batches of turns (consumers/helper.py); None: here
    helper: Helper | None = None

    @property
    def clock(self) -> Clock:
        """The store's clock: every timestamp a worker writes or compares comes from it."""
        return self.store.clock


class ReadsServices:
    """What holders of the services object read through it (``Worker``, ``Deps``,
    ``RecallService``): nothing is copied, so swapping a field of ``services`` reaches every
    holder. Each holder adds the store under the narrow port it uses."""

    services: Services

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def vectors(self) -> VectorIndex:
        return self.services.vectors

    @property
    def embedder(self) -> Embedder:
        return self.services.embedder

    @property
    def redactor(self) -> Redacts:
        return self.services.redactor

    @property
    def clock(self) -> Clock:
        return self.services.clock

"""The record-of-truth contract's fixture: each test runs once against ``PgStore`` on a real
PostgreSQL (its own schema) and once against the in-memory ``MemoryStore``, both on the
same controllable clock."""

from __future__ import annotations

import pytest
from storerows import Rows

from memstream.storage.memory import MemoryStore
from memstream.storage.pgports import Store
from memstream.storage.postgres import PgStore


def both(pg: PgStore, memory: MemoryStore) -> list[Store]:
    """Both adapters as ``Store``: mypy checks here that each implements every port."""
    return [pg, memory]


@pytest.fixture(params=["postgres", "memory"])
def store(request: pytest.FixtureRequest, clock) -> Store:
    if request.param == "memory":
        return MemoryStore(clock)
    pg: PgStore = request.getfixturevalue("pg")
    return pg


@pytest.fixture
def rows(clock) -> Rows:
    return Rows(clock)

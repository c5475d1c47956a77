"""The contracts' fixtures. The record of truth: each test runs once against ``PgStore`` on a
real PostgreSQL (its own schema) and once against the in-memory ``MemoryStore``, both on the
same controllable clock. The VectorIndex (test_vector_index_*): each test that asks for
``index`` or ``make_index`` runs once per adapter (test_recall_paging.py's own ``index``
fixture overrides this one there)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from indexpoints import DIM, Factory, edge_factory, local_factory
from storerows import Rows

from memstream.storage.memory import MemoryStore
from memstream.storage.pgports import Store
from memstream.storage.ports import VectorIndex
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


@pytest.fixture(params=["edge", "server-local"])
def kind(request: pytest.FixtureRequest) -> str:
    """Which adapter a test runs against."""
    return str(request.param)


@pytest.fixture
def make_index(kind: str, tmp_path: Path) -> Factory:
    """Makes instances of one adapter, all over the same storage in a temp dir."""
    factory = edge_factory if kind == "edge" else local_factory
    return factory(tmp_path)


@pytest.fixture
async def index(make_index: Factory) -> AsyncIterator[VectorIndex]:
    idx = make_index()
    await idx.ensure(DIM)
    yield idx
    await idx.close()

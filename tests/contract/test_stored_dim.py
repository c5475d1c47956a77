"""What ``memstream doctor`` reads of an index's shape: the dense size it was created with,
on both adapters (Qdrant Edge from its files, a Qdrant collection through qdrant-client)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstream.storage.qdrant_edge import EdgeVectorIndex, stored_dim
from memstream.storage.qdrant_server import ServerVectorIndex


async def test_edge_shard_dimension_is_read_without_opening_it(tmp_path: Path) -> None:
    """None before the shard exists; its size after, read while the shard is open."""
    path = tmp_path / "shard"
    assert stored_dim(path) is None
    index = EdgeVectorIndex(path)
    await index.ensure(8)
    try:
        assert stored_dim(path) == 8
    finally:
        await index.close()


@pytest.mark.filterwarnings("ignore:Payload indexes have no effect in the local Qdrant:UserWarning")
async def test_server_collection_dimension() -> None:
    """None before the collection exists; its dense size after ``ensure``."""
    index = ServerVectorIndex(location=":memory:", collection="shape")
    try:
        assert await index.stored_dim() is None
        await index.ensure(8)
        assert await index.stored_dim() == 8
    finally:
        await index.close()

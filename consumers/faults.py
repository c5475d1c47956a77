"""Fault injection for ``memstream bench faults``: the vector index taken away and back.

Qdrant Edge runs inside the worker, so no other process can make it unreachable. What takes
it away in production is its disk: a full disk was tried (the shard on a small tmpfs, filled
by a balloon file) and the worker died of SIGBUS on its next write to a memory-mapped segment,
the same outcome as the worker kills the bench already makes. The outage path the worker has
for the index (``StorageUnavailable``: memories kept in Postgres unindexed, dedupe exact only,
recall degraded to keywords, the reconciler indexing what waited) is the one a Qdrant server
adapter takes when its server is down; this switch drives that path from outside the process,
by a file, and is off unless ``fault_vector_offline_file`` is set.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from memstream.schemas.errors import StorageUnavailable


class OfflineSwitch:
    """A vector index that answers every call as unavailable while ``flag`` exists."""

    def __init__(self, inner: Any, flag: Path) -> None:
        self.inner, self.flag = inner, flag

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("inner", "flag"):
            object.__setattr__(self, name, value)
        else:  # a callback set on the index (``on_optimized``) is the inner index's
            setattr(self.inner, name, value)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name == "close" or not inspect.iscoroutinefunction(attr):
            return attr

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.flag.exists():
                raise StorageUnavailable("the vector index is offline (fault switch)")
            return await attr(*args, **kwargs)

        return guarded

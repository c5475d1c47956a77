"""The agent SDK: publish turns, recall memories (async ``MemoryClient``, sync ``SyncMemoryClient``)."""

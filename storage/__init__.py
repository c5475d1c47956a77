"""Storage adapters (Postgres, Qdrant, embeddings) behind the Protocols in ``ports``."""

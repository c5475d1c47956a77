"""The Postgres adapter, one module per group of statements: ``PgStore``
(storage/postgres.py) is these groups put together over one pool."""

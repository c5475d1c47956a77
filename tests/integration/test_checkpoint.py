"""``PgStore.checkpoint``: True where the role may CHECKPOINT, False (not an error) where it
may not, against a real PostgreSQL."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration


def as_role(dsn: str, role: str, password: str) -> str:
    """``dsn`` with another user and password (ignored by servers that trust loopback)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}"))


async def test_checkpoint_says_false_for_a_role_without_the_right(
    database_url: str, pg: PgStore
) -> None:
    """checkpoint() is True for a role allowed to checkpoint and False, without breaking the
    pool, for a login role without the right."""
    assert await pg.checkpoint() is True  # the test servers' own role may
    role = f"ms_nocp_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(database_url)
    try:
        password = uuid.uuid4().hex
        await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER PASSWORD '{password}'")
        await admin.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
        db = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'GRANT CREATE ON DATABASE "{db}" TO {role}')  # for the migrations
        plain = await PgStore.connect(as_role(database_url, role, password), schema=role)
        try:
            assert await plain.checkpoint() is False
            assert await plain.exists("t", str(uuid.uuid4())) is False  # the pool still works
        finally:
            await plain.close()
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {role} CASCADE")
        await admin.execute(f"DROP OWNED BY {role} CASCADE")  # and its grants
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()

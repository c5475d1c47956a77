"""`memstream keys create --user/--agent` as a process, on a database of its own."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from memstream.storage.postgres import PgStore

pytestmark = pytest.mark.integration

MEMSTREAM = str(Path(sys.executable).parent / "memstream")


async def test_keys_create_binds_and_prints_the_key_last(database_url, tmp_path) -> None:
    """The key is the last line, alone; only its hash is stored, bound to tenant, user and
    agent; a key without --user/--agent is tenant-wide."""
    name = f"keys_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(database_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = database_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")},
            "MEMSTREAM_DATABASE_URL": dsn,
            "MEMSTREAM_STATE_DIR": str(tmp_path),
        }

        async def create(*args: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                MEMSTREAM,
                "keys",
                "create",
                "--tenant",
                "acme",
                *args,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            lines = out.decode().strip().splitlines()
            assert lines[-1].startswith("msk_") and " " not in lines[-1]
            assert lines[-1] not in "\n".join(lines[:-1])  # shown once
            return lines[-1]

        bound = await create("--user", "alice", "--agent", "scout")
        wide = await create()
        pg = await PgStore.connect(dsn)
        try:
            assert await pg.identity_of_key(bound) == ("acme", "alice", "scout")
            assert await pg.identity_of_key(wide) == ("acme", None, None)
            stored = [r["key_hash"] for r in await pg._fetch("SELECT key_hash FROM api_keys")]
            assert bound not in stored and wide not in stored and len(stored) == 2
        finally:
            await pg.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()

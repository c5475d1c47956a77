"""``memstream keys create|revoke``: tenant credentials (only their hashes are stored)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from memstream.schemas.settings import Settings
from memstream.schemas.stack import read_stack
from memstream.storage.postgres import PgStore


def database_url(settings: Settings) -> str:
    """MEMSTREAM_DATABASE_URL, else the embedded database of a running ``memstream dev``."""
    if settings.database_url:
        return settings.database_url.get_secret_value()
    if url := read_stack(settings.state_dir).get("database_url"):
        return url
    raise SystemExit("memstream: set MEMSTREAM_DATABASE_URL or start `memstream dev`")


async def _run(a: argparse.Namespace) -> int:
    pg = await PgStore.connect(database_url(Settings()))
    try:
        if a.action == "create":
            key = await pg.create_api_key(a.tenant, a.name)
            print(f"api key for tenant {a.tenant!r} (shown once, store it now):\n{key}")
            return 0
        if await pg.revoke_api_key(a.key):
            print("revoked")
            return 0
        print("memstream: no such live key", file=sys.stderr)
        return 1
    finally:
        await pg.close()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="create or revoke tenant API keys")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a new key for a tenant")
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    revoke = actions.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key")
    keys.set_defaults(func=lambda a: asyncio.run(_run(a)))

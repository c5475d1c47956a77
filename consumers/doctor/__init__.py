"""``memstream doctor``: check a deployment and say what to do about each problem.

Checks, in order (a check whose server is unreachable is reported once, as that server):

- ``nats``: connects with the configured credentials; JetStream answers;
- ``streams`` / ``consumers``: every stream and stage consumer exists with the configuration
  ``consumers/topology.py`` defines (an existing durable is bound, not updated, by clients);
- ``dead_letters``: nothing waits in the dead-letter stream;
- ``postgres``: connects; ``migrations``: every packaged migration is applied, none unknown;
- ``clock``: Postgres ``now()`` within ``MAX_SKEW_S`` of this host's clock (expiry, TTLs and
  fact validity compare the two);
- ``redaction_key``: set, not a published example, not the state directory's development key;
- ``index``: answers (a Qdrant server directly; Qdrant Edge through the worker that owns the
  shard, ``<ns>.ops.stats``); ``embedding``: the model's dimension is the collection's;
  ``index_count``: the index holds one point per live indexed memory in Postgres.

Output never holds a DSN, a key or a credential: URLs are shown without user info, errors by
their type. Exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import asdict
from pathlib import Path

from memstream.consumers.doctor.bus import check_bus, worker_stats
from memstream.consumers.doctor.findings import Finding
from memstream.consumers.doctor.stores import check_index, check_postgres, check_redaction_key
from memstream.schemas.settings import Settings

__all__ = ["Finding", "diagnose", "doctor", "register", "render"]


async def diagnose(
    settings: Settings,
    nats_url: str,
    database_url: str | None,
    schema: str = "public",
    dim: int | None = None,
) -> list[Finding]:
    """Every check; ``dim``: the embedding model's dimension (loaded from settings if None)."""
    bus, nc = await check_bus(settings, nats_url)
    try:
        pg, report = await check_postgres(database_url, schema)
        if dim is None:
            from memstream.storage.embedding import make_embedder

            dim = make_embedder(settings.embedding_model, settings.embedding_path).dim
        index = await check_index(settings, nc, report, dim)
        key = check_redaction_key(settings, await worker_stats(nc, settings))
    finally:
        if nc is not None:
            await nc.close()
    return [*bus, *pg, key, *index]


def render(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{'ok  ' if f.ok else 'FAIL'}  {f.check:<14} {f.detail}")
        if not f.ok:
            lines.append(f"      {'':<14} fix: {f.fix}")
    failed = sum(not f.ok for f in findings)
    lines.append("all checks passed" if not failed else f"{failed} check(s) failed")
    return "\n".join(lines)


async def doctor(
    settings: Settings,
    nats_url: str,
    database_url: str | None,
    schema: str = "public",
    as_json: bool = False,
    dim: int | None = None,
) -> int:
    """Run every check, print the report; 0 when all passed, else 1."""
    findings = await diagnose(settings, nats_url, database_url, schema, dim)
    print(json.dumps([asdict(f) for f in findings]) if as_json else render(findings))
    return 0 if all(f.ok for f in findings) else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("doctor", help="check NATS, Postgres, the index and their configuration")
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--json", action="store_true")

    def run(a: argparse.Namespace) -> int:
        from memstream.producers.client import discover_nats_url
        from memstream.schemas.stack import read_stack

        settings = Settings()
        if a.state_dir:
            settings = settings.model_copy(update={"state_dir": a.state_dir})
        nats_url = settings.nats_url or discover_nats_url(settings.state_dir)
        dsn = (
            settings.database_url.get_secret_value()
            if settings.database_url
            else read_stack(settings.state_dir).get("database_url")
        )
        return asyncio.run(doctor(settings, nats_url, dsn, as_json=a.json))

    p.set_defaults(func=run)

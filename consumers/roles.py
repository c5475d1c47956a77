"""What one worker process runs (``memstream worker --stages``), and the rule that keeps a
Qdrant Edge shard in one process.

| role    | runs                                         | needs                          |
|---------|----------------------------------------------|--------------------------------|
| extract | the extract stage consumer                   | NATS, Postgres (memory off)    |
| redact  | the redact stage consumer                    | NATS, the redaction key        |
| dedupe  | the dedupe stage consumer                    | NATS, Postgres, vector index   |
| store   | the store stage consumer, index maintenance  | NATS, Postgres, vector index   |
| recall  | the recall and command responders            | NATS, Postgres, vector index   |

Every process also answers ``<ns>.ops.stats`` and ``<ns>.ops.redact`` and serves /metrics
and /healthz. Extra processes of a stage bind the same durable pull consumer, so JetStream
shares the stage's messages among them.

Qdrant Edge runs inside the process that opens its shard, and the engine locks the shard
against a second process. So without a Qdrant server the roles that touch the index (dedupe,
store, recall) go together, in the one process that owns the shard; a set holding some of
them but not all is refused before anything starts, and a second owner is refused by the
shard's lock when it opens it. With a Qdrant server every role may run in many processes.
"""

from __future__ import annotations

from collections.abc import Collection

from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import ROLES, Role, Settings

# the roles that read or write the vector index
INDEX_ROLES: frozenset[Role] = frozenset({"dedupe", "store", "recall"})


def parse(text: str) -> tuple[Role, ...]:
    """``extract,redact`` -> the roles, in pipeline order; ``ConfigurationError`` names the
    roles there are for an empty list or an unknown name."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = sorted({n for n in names if n not in ROLES})
    if not names or unknown:
        what = f"unknown {', '.join(repr(n) for n in unknown)}" if unknown else "no role named"
        raise ConfigurationError(
            f"--stages takes a comma-separated subset of {','.join(ROLES)} ({what})"
        )
    return tuple(r for r in ROLES if r in names)


def holds_index(stages: Collection[str]) -> bool:
    """Whether a process running ``stages`` opens the vector index."""
    return not INDEX_ROLES.isdisjoint(stages)


def check(settings: Settings) -> None:
    """Refuse (``ConfigurationError``) a choice of roles that cannot work: a subset that would
    start a stack of its own instead of joining the running one, or, with Qdrant Edge, one
    that splits the shard's roles (their other half would need the shard too)."""
    chosen = [r for r in ROLES if r in settings.stages]
    if not chosen:
        raise ConfigurationError(f"MEMSTREAM_STAGES names no role (from {','.join(ROLES)})")
    if len(chosen) == len(ROLES):
        return
    if not settings.nats_url or not settings.database_url:
        raise ConfigurationError(
            f"a worker with --stages {','.join(chosen)} joins a running stack: set "
            "MEMSTREAM_NATS_URL and MEMSTREAM_DATABASE_URL to its servers (without them it "
            "would start a NATS and a PostgreSQL of its own that nothing publishes to)"
        )
    if settings.qdrant_url:
        return
    shard = INDEX_ROLES.intersection(chosen)
    if shard and shard != INDEX_ROLES:
        missing = [r for r in ROLES if r in INDEX_ROLES - shard]
        raise ConfigurationError(
            f"--stages {','.join(chosen)} splits the Qdrant Edge shard's roles: without "
            "MEMSTREAM_QDRANT_URL one process owns the shard and runs dedupe, store and recall "
            f"together, and this one would leave out {','.join(missing)}. Run extra processes "
            "with --stages extract,redact, or set MEMSTREAM_QDRANT_URL to a Qdrant server to "
            "run every role in many processes"
        )

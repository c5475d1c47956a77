"""Error codes and the error reply every responder sends.

The exception tree (workers)::

    MemstreamError
    +-- ConfigurationError      bad settings: crash at start-up
    +-- NotFound                not in the caller's scope: a ``not_found`` reply
    +-- PermanentError          this message can never succeed: dead-letter it with the reason
    |   +-- InvalidMessage      does not decode or validate
    |   +-- DataRejected        a store refused the values (Postgres SQLSTATE class 22 or 54)
    +-- TransientError          may succeed later: nack with a delay
        +-- StorageUnavailable  Postgres or Qdrant did not answer
        |   +-- StorageConflict Postgres cancelled a statement to break a deadlock
        +-- EmbedderFailed      the embedding model failed (recall degrades to keywords)

Replies on request-reply subjects never carry a traceback, a driver message or
a secret: only a code from ``ErrorCode`` and a sanitized sentence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError


class ErrorCode(StrEnum):
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    INTERNAL = "internal"


class ErrorInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    code: ErrorCode
    message: str


class ErrorReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    ok: Literal[False] = False
    error: ErrorInfo


def describe(exc: ValidationError, limit: int = 5) -> str:
    """Field paths and messages of a validation error, never the input values (they may hold
    secrets): what every bad_request reply and dead-letter reason says."""
    return describe_errors(exc.errors(), limit)


def describe_errors(
    errors: Iterable[Mapping[str, Any]], limit: int = 5, envelope: str | None = None
) -> str:
    """``describe`` over pydantic-shaped error dicts (``loc``, ``msg``), as frameworks hand
    them on (FastAPI's request errors). ``envelope``: a leading ``loc`` element that names
    where the input came from, not a field (FastAPI's ``body``), and is left out."""
    out = []
    for e in list(errors)[:limit]:
        loc = list(e.get("loc", ()))
        if envelope is not None and loc[:1] == [envelope]:
            loc = loc[1:]
        path = ".".join(_named(part) for part in loc)
        out.append(f"{path or '<root>'}: {e.get('msg', 'invalid')}")
    return "; ".join(out) or "invalid input"


# A path element the caller sent (a map's key, an unknown field) is input too: one that
# could hold a secret (an API key sent as a field name is 47 characters) is not repeated
_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")


def _named(part: Any) -> str:
    if isinstance(part, int) or _NAME.fullmatch(str(part)):
        return str(part)
    return "<a name given>"


class MemstreamError(Exception):
    """Base of every memstream worker error."""


class ConfigurationError(MemstreamError):
    """Settings are wrong; raised at start-up."""


class NotFound(MemstreamError):
    """The memory (or fact) does not exist in the caller's scope."""


class PermanentError(MemstreamError):
    """Retrying cannot help: the message goes to ``mem.dlq.<stage>`` with this reason."""


class InvalidMessage(PermanentError):
    """The payload does not decode or validate."""


class DataRejected(PermanentError):
    """A store refused the data itself (an invalid or oversized value): retrying the same
    message fails the same way, so a stage dead-letters it at once and a command answers
    ``bad_request``."""


class TransientError(MemstreamError):
    """May succeed later: the message is nacked with a delay."""


class StorageUnavailable(TransientError):
    """A store (Postgres, Qdrant) did not answer."""


class StorageConflict(StorageUnavailable):
    """Postgres cancelled a statement to break a deadlock or a serialization conflict: no
    outage, and retrying succeeds; named apart so that a log or a stage's last error says
    which it was."""


class EmbedderFailed(TransientError):
    """The embedding model raised on a text."""

"""The SDK's errors (``memstream.producers.client`` re-exports them)::

    MemoryClientError
    +-- PublishError       the turn was not stored (no PubAck, bad event)
    +-- ServiceError       .code in {bad_request, not_found, unavailable, timeout, internal}
        +-- RecallError    recall failed
        +-- CommandError   a management command failed

Every message is safe to log: no server address, credentials or query text in it.
"""

from __future__ import annotations

from pydantic import ValidationError

from memstream.schemas.errors import ErrorCode, describe


class MemoryClientError(Exception):
    """Base of the SDK's errors."""


class PublishError(MemoryClientError):
    """The turn was not durably stored."""


class ServiceError(MemoryClientError):
    """The service answered with an error (or not at all); ``code`` says why, the message
    is safe to log."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        self.code = ErrorCode(code) if code in ErrorCode._value2member_map_ else ErrorCode.INTERNAL
        self.message = message
        super().__init__(f"{self.code.value}: {message}")


class RecallError(ServiceError):
    """Recall failed."""


class CommandError(ServiceError):
    """A management command (remember, forget, ...) failed."""


def field_errors(exc: Exception) -> str:
    """What was wrong with a request's fields, without their values."""
    if isinstance(exc, ValidationError):
        return describe(exc)
    return "invalid argument"

"""One error shape for every response that is not a success: ``{"code", "message"}``.

``code`` is machine-readable; ``message`` is a sanitized sentence: it never holds a key, a
request body, a server address or a traceback. Validation errors name the fields and the
rule they broke, never the values sent (a value may be a key).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from memstream.gateway.logs import log
from memstream.producers.client import MemoryClientError, ServiceError
from memstream.schemas.errors import ErrorCode, describe, describe_errors

# the SDK's service codes -> HTTP status
STATUS = {
    ErrorCode.BAD_REQUEST: 422,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.TIMEOUT: 503,
    ErrorCode.INTERNAL: 500,
}


# a turn travels as one NATS message (1 MB by default): a larger body cannot be stored anyway
MAX_BODY_BYTES = 8 * 1024 * 1024


class ErrorBody(BaseModel):
    """Every error response."""

    code: str
    message: str


class ApiError(Exception):
    """Raise anywhere in a route: becomes ``status`` with ``{"code", "message"}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def unauthorized(message: str = "a valid key is required") -> ApiError:
    return ApiError(401, "unauthorized", message)


def forbidden(message: str) -> ApiError:
    return ApiError(403, "forbidden", message)


def not_found(message: str = "not found") -> ApiError:
    return ApiError(404, "not_found", message)


def error_response(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse(
        ErrorBody(code=code, message=message).model_dump(), status_code=status, headers=headers
    )


def field_errors(errors: Any) -> str:
    """``loc: msg`` per error (``schemas.errors.describe_errors``), at most five; never the
    input values. The request body is the root: its fields are named without ``body.``."""
    return describe_errors(errors, envelope="body")


def from_service(exc: MemoryClientError) -> ApiError:
    """An SDK error as an HTTP error (the SDK's messages are sanitized already)."""
    if isinstance(exc, ServiceError):
        status = STATUS.get(exc.code, 500)
        if exc.code in (ErrorCode.UNAVAILABLE, ErrorCode.TIMEOUT):
            return ApiError(
                status, "unavailable", f"the memory pipeline did not answer ({exc.code.value})"
            )
        if exc.code is ErrorCode.UNAUTHORIZED:
            return unauthorized("the key is not valid for this request")
        return ApiError(status, exc.code.value, exc.message)
    return ApiError(503, "unavailable", "the memory pipeline cannot be reached")


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the JSON shape."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else {}
        return error_response(exc.status, exc.code, exc.message, **headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "validation_error", field_errors(exc.errors()))

    @app.exception_handler(ValidationError)
    async def _wire(_: Request, exc: ValidationError) -> JSONResponse:
        # a request the route accepted but the wire model refused: the client's input is at
        # fault, so a 422 naming the fields (never their values), not a 500
        return error_response(422, "validation_error", describe(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        code = codes.get(exc.status_code, "http_error")
        message = {404: "no such route", 405: "method not allowed on this route"}.get(
            exc.status_code, "request refused"
        )
        return error_response(exc.status_code, code, message)

    @app.exception_handler(MemoryClientError)
    async def _sdk(_: Request, exc: MemoryClientError) -> JSONResponse:
        err = from_service(exc)
        return error_response(err.status, err.code, err.message)

    @app.middleware("http")
    async def _internal(request: Request, call_next: Any) -> Any:
        # the last resort: a JSON 500 with a code, no traceback to the client or the log
        # (a traceback's messages may quote request values)
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > MAX_BODY_BYTES:
            return error_response(413, "too_large", "the request body is too large")
        raw = (request.scope.get("raw_path") or b"") + b"?" + request.scope.get("query_string", b"")
        if b"%00" in raw or b"\x00" in raw:
            return error_response(422, "validation_error", "text must not contain NUL characters")
        try:
            return await call_next(request)
        except Exception as exc:  # noqa: BLE001 - the gateway's one catch-all
            log.error(
                "gateway.internal_error route=%s error=%s", request.url.path, type(exc).__name__
            )
            return error_response(500, "internal", "the gateway failed on this request")

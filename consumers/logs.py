"""structlog, configured once: JSON when stderr is not a TTY, console when it is.

Tracebacks never carry local variables (they may hold message bodies): as data in JSON, as
plain text on the console."""

from __future__ import annotations

import logging
import sys

import structlog
import structlog.tracebacks


def configure(level: str = "INFO") -> None:
    tty = sys.stderr.isatty()
    tail: list[structlog.typing.Processor] = (
        [structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)]
        if tty
        else [
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            structlog.processors.JSONRenderer(),
        ]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *tail,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    if not any(isinstance(h, _Forward) for h in root.handlers):
        root.addHandler(_Forward(logging.WARNING))


class _Forward(logging.Handler):
    """Libraries log through the standard library (asyncpg's pool, for one, while Postgres is
    away): without a handler Python prints each record and its traceback to stderr, outside
    the JSON log. Here each becomes one structured line: the library's logger and the
    exception's type, not its text (a library's message may quote a connection string)."""

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        log.log(
            record.levelno,
            "library.log",
            logger=record.name,
            error=type(exc).__name__ if exc is not None else None,
        )


log = structlog.get_logger("memstream")

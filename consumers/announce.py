"""What ``memstream dev`` prints once the stack is up: where each part is, and what to try
first. Nothing printed here carries a credential."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memstream.producers.connection import display_url
from memstream.schemas.settings import Settings

if TYPE_CHECKING:
    from memstream.consumers.run import Running


def announcement(settings: Settings, up: Running) -> str:
    assert up.stack is not None and up.worker is not None
    stack, gateway = up.stack, up.gateway
    ops_url = (
        f"http://{settings.ops_host}:{up.ops.sockets[0].getsockname()[1]}/metrics"
        if up.ops
        else "disabled"
    )
    where = "embedded" if stack.embedded else "configured"
    qdrant = settings.qdrant_url or f"Qdrant Edge at {settings.state_dir / 'qdrant'}"
    return (
        f"memstream is running ({where} stack, state in {settings.state_dir.resolve()})\n"
        f"  NATS      {display_url(stack.nats_url)}   (recall: {up.worker.deps.subjects.recall})\n"
        f"  Postgres  {redact_dsn(stack.database_url)}\n"
        f"  Qdrant    {qdrant}\n"
        f"  metrics   {ops_url}\n"
        f"  gateway   {gateway.url if gateway else 'disabled'}"
        f"{'   (API docs: ' + gateway.url + '/docs)' if gateway else ''}\n"
        f"  console   {_console_line(up.console)}\n"
        + (_bus_auth_hint(settings) if settings.embedded_bus_auth else _try_hint())
        + "Ctrl-C stops everything."
    )


def _console_line(console: Any) -> str:
    if console is None:
        return "disabled (set MEMSTREAM_CONSOLE_TOKEN)"
    where = f"token in {console.token_file}" if console.token_file else "MEMSTREAM_CONSOLE_TOKEN"
    return f"{console.url}   (log in with the {where})"


def _try_hint() -> str:
    return (
        "  try:      memstream publish --user alice 'I prefer green tea'\n"
        "            memstream recall --user alice 'what tea?'\n"
    )


def _bus_auth_hint(settings: Settings) -> str:
    authority = settings.state_dir / "nats-auth"
    return (
        f"  bus auth  on (operator mode; authority in {authority})\n"
        f"  try:      memstream creds create --dir {authority} --tenant acme --out acme.creds\n"
        "            memstream keys create --tenant acme\n"
        "            MEMSTREAM_API_KEY=<key> memstream publish --tenant acme --nats-creds "
        "acme.creds --user alice 'I prefer green tea'\n"
    )


def redact_dsn(dsn: str) -> str:
    """Hide the password of a DSN for display."""
    if "@" in dsn and ":" in dsn.split("@", 1)[0].split("//", 1)[-1]:
        scheme, rest = dsn.split("//", 1)
        creds, host = rest.split("@", 1)
        return f"{scheme}//{creds.split(':', 1)[0]}:***@{host}"
    return dsn

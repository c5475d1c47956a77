"""NATS connection options of the worker side, from ``Settings`` (credentials apart from the
URL; see producers/connection.py for the variables)."""

from __future__ import annotations

from typing import Any

from faststream.nats import NatsCredentials, NatsNKey, NatsToken, NatsUserPassword
from faststream.security import BaseSecurity

from memstream.producers.connection import NatsAuth
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings


def nats_auth(settings: Settings) -> NatsAuth:
    try:
        return NatsAuth(
            user=settings.nats_user,
            password=settings.nats_password,
            token=settings.nats_token,
            creds=settings.nats_creds,
            nkey_seed=settings.nats_nkey_seed,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def api_keys_required(settings: Settings) -> bool:
    """Whether recall and commands must carry an API key of their tenant.

    Recall and commands share ``mem.recall`` / ``mem.cmd.*`` across tenants, and NATS does not
    tell a responder who sent a request: the body's tenant is only a claim. A worker that
    authenticates to NATS runs on a bus with per-tenant credentials (docs/security.md), and
    there a tenant must not be able to act as another by writing its name: so credentials
    on the bus turn API keys on, whatever ``MEMSTREAM_REQUIRE_API_KEY`` says."""
    return bool(settings.require_api_key or nats_auth(settings).configured)


def broker_options(settings: Settings) -> dict[str, Any]:
    """The same for FastStream's ``NatsBroker``, which takes credentials as ``security=``."""
    auth = nats_auth(settings)
    options = auth.connect_options()
    security: BaseSecurity | None = None
    if auth.method == "creds":
        security = NatsCredentials(options.pop("user_credentials"))
    elif auth.method == "nkey":
        security = NatsNKey.from_file(options.pop("nkeys_seed"))
    elif auth.method == "password":
        security = NatsUserPassword(options.pop("user"), options.pop("password"))
    elif auth.method == "token":
        security = NatsToken(options.pop("token"))
    return {**options, "security": security}


def nats_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect`` and ``NatsBroker``: credentials, inbox prefix."""
    options: dict[str, Any] = nats_auth(settings).connect_options()
    return options

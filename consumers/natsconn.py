"""NATS connection options of the worker side, from ``Settings`` (credentials apart from the
URL; see producers/connection.py for the variables)."""

from __future__ import annotations

from typing import Any

from memstream.producers.connection import NatsAuth
from memstream.schemas.settings import Settings


def nats_auth(settings: Settings) -> NatsAuth:
    return NatsAuth(
        user=settings.nats_user,
        password=settings.nats_password,
        token=settings.nats_token,
        creds=settings.nats_creds,
        nkey_seed=settings.nats_nkey_seed,
    )


def api_keys_required(settings: Settings) -> bool:
    """Whether recall and commands must carry an API key of their tenant.

    Recall and commands share ``mem.recall`` / ``mem.cmd.*`` across tenants, and NATS does not
    tell a responder who sent a request: the body's tenant is only a claim. A worker that
    authenticates to NATS runs on a bus with per-tenant credentials (docs/security.md), and
    there a tenant must not be able to act as another by writing its name: so credentials
    on the bus turn API keys on, whatever ``MEMSTREAM_REQUIRE_API_KEY`` says."""
    return bool(settings.require_api_key or nats_auth(settings).configured)


def nats_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``nats.connect`` and ``NatsBroker``: credentials, inbox prefix."""
    options: dict[str, Any] = nats_auth(settings).connect_options()
    return options

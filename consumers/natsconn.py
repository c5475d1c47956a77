"""The worker side's NATS connections: their options from ``Settings`` (credentials apart
from the URL; see producers/connection.py for the variables), reconnecting forever, and the
broker that stops the batched stage loops with it."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

import nats
from faststream.nats import (
    NatsBroker,
    NatsCredentials,
    NatsNKey,
    NatsToken,
    NatsUserPassword,
)
from faststream.security import BaseSecurity

from memstream.consumers.logs import log
from memstream.producers.connection import NatsAuth, let_go
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings

if TYPE_CHECKING:
    from memstream.consumers.batching import PullLoops


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


def reconnect_forever(closed: Any) -> dict[str, Any]:
    """nats-py options shared by the worker's connections: reconnect forever (the default
    gives up after 60 attempts x 2 s and leaves a worker that does nothing). nats-py has no
    jitter of its own, so each process draws its wait from 1-2 s: a fleet restarted with its
    server does not reconnect in step. ``closed`` runs if the client gives up anyway."""
    return {
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": random.uniform(1.0, 2.0),  # jitter, not a secret
        "closed_cb": closed,
        "error_cb": _connection_error,
    }


# How long a subscription that left its queue group still takes the messages routed to it.
# The server routes a message and processes a member's UNSUB on different goroutines: one
# it routed to the member just before the UNSUB can reach the client after the PONG that
# ends a plain ``drain``, which has by then forgotten the subscription and drops it, and a
# request is left unanswered (nats-io/nats.go#898): 28-30 in 8 s of hand-overs under a flood
# of requests (tests/integration/test_queue_leave.py). Those late ones came up to 4 ms after
# the PONG (8 in 433 recall hand-overs); the grace leaves a wide margin for a loaded machine,
# and costs only the leaving member's wait.
LEAVE_GRACE_S = 0.25


async def leave_queue(nc: Any, sub: Any, grace_s: float = LEAVE_GRACE_S) -> None:
    """Take ``sub`` out of its queue group and hand its callback every message the server
    routed to it, late ones too (see ``LEAVE_GRACE_S``): UNSUB, then keep the subscription
    in the client for ``grace_s``, then ``drain``. nats-py has no public call that sends
    UNSUB and keeps the subscription: ``_send_unsubscribe`` is its own, used here alone."""
    await nc._send_unsubscribe(sub._id)
    await nc.flush()
    await asyncio.sleep(grace_s)
    await sub.drain()  # its UNSUB again (the server ignores an unknown one), then the rest


async def _connection_error(exc: Exception) -> None:
    """One structured line per connection error (nats-py's default prints a traceback to
    stderr for every failed reconnect attempt, outside the JSON log)."""
    log.warning("nats.connection_error", error=type(exc).__name__)


class WorkerBroker(NatsBroker):
    """faststream's broker whose ``stop`` also stops the batched stage loops (plain nats-py,
    consumers/batching.py), so that stopping the broker stops every stage as before."""

    pulls: PullLoops | None = None

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        if self.pulls is not None:
            await self.pulls.stop()
        try:
            await super().stop(*args, **kwargs)
        except nats.errors.ConnectionReconnectingError:
            # NATS away: faststream's drain of the connection is refused, its subscribers
            # are stopped already (an unsubscribe needs no server); close instead
            if self._connection is not None:
                await let_go(self._connection)
                self._connection = None
            self.config.disconnect()

"""How a memstream process authenticates to NATS, given apart from the URL.

A URL is printed, logged and written to ``stack.json``; credentials must not be. They come
from their own variables (or arguments), and every URL is shown through :func:`display_url`,
which drops any ``user:password@`` part.

| variable                     | nats-py option     | what                                   |
|------------------------------|--------------------|----------------------------------------|
| MEMSTREAM_NATS_CREDS         | user_credentials   | a ``.creds`` file (user JWT + seed)    |
| MEMSTREAM_NATS_NKEY_SEED     | nkeys_seed         | a file holding an NKey seed            |
| MEMSTREAM_NATS_USER          | user               | user name (with the password)          |
| MEMSTREAM_NATS_PASSWORD      | password           | password                               |
| MEMSTREAM_NATS_TOKEN         | token              | an authorization token                 |
| MEMSTREAM_NATS_INBOX_PREFIX  | inbox_prefix       | reply subjects (default: see below)    |

A ``.creds`` file issued by ``memstream creds create`` may subscribe only to its own inbox
prefix (``_INBOX.<tenant>...``); the client reads that prefix from the JWT's permissions, so
replies to recall and PubAcks arrive where the credential may listen.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import ConnectionClosedError, ConnectionReconnectingError, NoRespondersError
from pydantic import SecretStr

__all__ = ["NatsAuth", "creds_inbox_prefix", "display_url", "servers"]

ENV = "MEMSTREAM_NATS_"


def display_url(url: str) -> str:
    """``url`` (or a comma-separated list of URLs) without user, password or token."""
    return ",".join(_strip_userinfo(u.strip()) for u in url.split(","))


def servers(url: str) -> list[str]:
    """The server URLs of ``url``, which may name several, comma-separated (the seed nodes of
    a cluster: ``nats://n1:4222,nats://n2:4222,nats://n3:4222``). nats-py takes a list; given
    the string whole, it would read one malformed URL."""
    return [u.strip() for u in url.split(",") if u.strip()]


def _strip_userinfo(url: str) -> str:
    if "@" not in url:
        return url
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:  # unparseable: keep only what follows the last @
        return "nats://" + url.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def creds_inbox_prefix(path: str | os.PathLike[str]) -> str | None:
    """The inbox prefix a ``.creds`` file's user JWT may subscribe to (``X`` of an allowed
    ``X.>`` that starts with ``_INBOX``), or None if it names none. The JWT is only read
    here, not verified: the server verifies it."""
    try:
        lines = Path(path).read_text().splitlines()
        jwt = lines[lines.index(next(ln for ln in lines if "BEGIN NATS USER JWT" in ln)) + 1]
        payload = jwt.strip().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        allowed = claims["nats"]["sub"]["allow"]
    except (OSError, ValueError, IndexError, KeyError, TypeError, StopIteration):
        return None
    for subject in allowed:
        if isinstance(subject, str) and subject.startswith("_INBOX") and subject.endswith(".>"):
            return subject[: -len(".>")]
    return None


@dataclass(frozen=True)
class NatsAuth:
    """NATS credentials and inbox prefix; ``repr`` never shows a secret."""

    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    creds: Path | None = None
    nkey_seed: Path | None = None
    inbox_prefix: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsAuth:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            return env.get(ENV + name) or None

        password, token = get("PASSWORD"), get("TOKEN")
        creds, seed = get("CREDS"), get("NKEY_SEED")
        return cls(
            user=get("USER"),
            password=SecretStr(password) if password else None,
            token=SecretStr(token) if token else None,
            creds=Path(creds) if creds else None,
            nkey_seed=Path(seed) if seed else None,
            inbox_prefix=get("INBOX_PREFIX"),
        )

    def __post_init__(self) -> None:
        given = [
            name
            for name, value in (
                ("CREDS", self.creds),
                ("NKEY_SEED", self.nkey_seed),
                ("USER/PASSWORD", self.user or self.password),
                ("TOKEN", self.token),
            )
            if value
        ]
        if len(given) > 1:  # the server checks one; which one would be a guess
            names = ", ".join(f"{ENV}{g}" for g in given)
            raise ValueError(f"give one NATS credential, not several: {names}")

    @property
    def method(self) -> str | None:
        """``creds``, ``nkey``, ``password``, ``token`` or None."""
        if self.creds:
            return "creds"
        if self.nkey_seed:
            return "nkey"
        if self.user or self.password:
            return "password"
        return "token" if self.token else None

    @property
    def configured(self) -> bool:
        """True when any credential is given (the bus is expected to check them)."""
        return bool(self.user or self.password or self.token or self.creds or self.nkey_seed)

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (and FastStream's ``NatsBroker``)."""
        opts: dict[str, Any] = {}
        if self.user or self.password:
            opts["user"] = self.user or ""
            opts["password"] = self.password.get_secret_value() if self.password else ""
        if self.token:
            opts["token"] = self.token.get_secret_value()
        if self.creds:
            opts["user_credentials"] = str(self.creds)
        if self.nkey_seed:
            opts["nkeys_seed"] = str(self.nkey_seed)
        inbox = self.inbox_prefix or (creds_inbox_prefix(self.creds) if self.creds else None)
        if inbox:
            opts["inbox_prefix"] = inbox
        return opts


# A request that meets "no responders" is sent once more after this pause. While responders
# hand over (one joins the queue group, then another leaves it: the recall hand-over around an
# optimize, a rolling restart), nats-server can route a request with a view of the group from
# before the join and find nobody: 5-21 in 378 hand-overs under a flood of requests
# (tests/integration/test_queue_leave.py). Nobody received it, so sending it again is safe,
# even for a command that writes.
NO_RESPONDERS_RETRY_S = 0.05


async def request(nc: Client, subject: str, payload: bytes, wait_s: float) -> Msg:
    """``nc.request`` with a timeout of ``wait_s``, asked once more ``NO_RESPONDERS_RETRY_S``
    after a "no responders" if ``wait_s`` leaves time for it; raises what ``nc.request``
    raises."""
    started = time.monotonic()
    try:
        return await nc.request(subject, payload, timeout=wait_s)
    except NoRespondersError:
        left = wait_s - (time.monotonic() - started) - NO_RESPONDERS_RETRY_S
        if left <= 0:
            raise
    await asyncio.sleep(NO_RESPONDERS_RETRY_S)
    return await nc.request(subject, payload, timeout=left)


async def let_go(nc: Client) -> None:
    """Drain ``nc``, or close it while the server is away. A drain needs the server (nats-py
    refuses one while it reconnects, and a subscription's drain waits for an answer that
    cannot come), and whoever closes a connection, an agent leaving ``async with`` or a
    worker told to stop, must not fail or wait for NATS to come back. Closing instead loses
    nothing acknowledged: what a worker pulled and did not ack, the server delivers again
    after its ack deadline, and a request not answered times out at its caller."""
    if nc.is_closed:
        return
    if nc.is_connected:
        try:
            await nc.drain()
            return
        except (ConnectionReconnectingError, ConnectionClosedError):  # away since the check
            pass
    # What was published while it reconnects waits in the client's buffer, to be sent on
    # reconnecting; nats-py 2.16's close writes it to the socket it lost, which uvloop
    # refuses (RuntimeError: the handler is closed) halfway through the close. Closing, it
    # could never be sent: dropped here, the close goes through.
    if getattr(nc, "_pending_data_size", 0):
        nc._pending, nc._pending_data_size = [], 0
    try:
        await nc.close()
    except RuntimeError:
        pass  # as above, should another nats-py write to the lost socket: closed already
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the caller's own cancellation
        # nats-py 2.16, closing while it reconnects: the wait for the socket its cancelled
        # reconnect was opening ends cancelled. The client is closed all the same (its
        # status is set first); only its disconnect and close callbacks are skipped

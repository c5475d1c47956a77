"""Tenancy on the bus: NATS decentralized auth (operator, account and user JWTs signed with
NKeys), minted here so that issuing a tenant's credential needs no server reload.

Trust chain::

    operator (O...)        signs   account JWTs; named in the server config (auth.conf)
    +-- SYS account         the server's system account
    +-- memstream account   JetStream on; every stream lives here
        +-- worker user     what the worker needs (streams, consumers, KV, responses)
        +-- tenant users    one per credential issued: publish own turns, request recall and
                            commands, receive replies on an own inbox prefix; nothing else

The server verifies each user JWT's signature against the account key it preloaded, so a new
credential works at once. Tenants share one account (the streams are shared) and are kept
apart by each user's publish/subscribe allow lists, which the server enforces.

A JWT is ``base64url(header).base64url(claims).base64url(ed25519 signature)``, header
``{"typ":"JWT","alg":"ed25519-nkey"}``; the claims follow the NATS JWT v2 schema.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

import nkeys

from memstream.schemas.subjects import Subjects, token

JWT_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
UNLIMITED = -1
INBOX = "_INBOX"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def new_seed(prefix: int) -> bytes:
    """A new random NKey seed for an operator, account or user (``nkeys.PREFIX_BYTE_*``)."""
    return bytes(nkeys.encode_seed(os.urandom(32), prefix))


def public_key(seed: bytes) -> str:
    kp = nkeys.from_seed(bytearray(seed))
    try:
        return str(kp.public_key.decode())
    finally:
        kp.wipe()


def _jti(claims: dict[str, Any]) -> str:
    """The claims' id as the Go library computes it: base32 of a SHA-512/256 of the claims."""
    try:
        h = hashlib.new("sha512_256")
    except ValueError:  # an OpenSSL without it: any unique id is valid for the server
        h = hashlib.sha256()
    h.update(json.dumps(claims, separators=(",", ":")).encode())
    return base64.b32encode(h.digest()).decode().rstrip("=")


def encode_jwt(
    signer_seed: bytes,
    subject: str,
    name: str,
    nats: dict[str, Any],
    expires_at: int | None = None,
) -> str:
    """A NATS JWT about ``subject`` (a public key), signed by ``signer_seed``."""
    kp = nkeys.from_seed(bytearray(signer_seed))
    try:
        claims: dict[str, Any] = {
            "iat": int(time.time()),
            "iss": kp.public_key.decode(),
            "name": name,
            "sub": subject,
        }
        if expires_at is not None:
            claims["exp"] = expires_at
        claims["nats"] = nats
        claims = {"jti": _jti(claims), **claims}
        signing_input = (
            _b64(json.dumps(JWT_HEADER, separators=(",", ":")).encode())
            + "."
            + _b64(json.dumps(claims, separators=(",", ":")).encode())
        )
        signature = kp.sign(signing_input.encode())
    finally:
        kp.wipe()
    return f"{signing_input}.{_b64(signature)}"


def decode_claims(jwt: str) -> dict[str, Any]:
    """The claims of a JWT (not verified: the server verifies)."""
    payload = jwt.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


def operator_jwt(operator_seed: bytes, system_account: str, name: str = "memstream") -> str:
    nats = {"type": "operator", "version": 2, "system_account": system_account}
    return encode_jwt(operator_seed, public_key(operator_seed), name, nats)


def account_jwt(operator_seed: bytes, account: str, name: str, jetstream: bool) -> str:
    limits: dict[str, Any] = {
        "subs": UNLIMITED,
        "data": UNLIMITED,
        "payload": UNLIMITED,
        "imports": UNLIMITED,
        "exports": UNLIMITED,
        "wildcards": True,
        "conn": UNLIMITED,
        "leaf": UNLIMITED,
    }
    if jetstream:
        limits.update(
            mem_storage=UNLIMITED, disk_storage=UNLIMITED, streams=UNLIMITED, consumer=UNLIMITED
        )
    nats = {
        "limits": limits,
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account",
        "version": 2,
    }
    return encode_jwt(operator_seed, account, name, nats)


@dataclass(frozen=True)
class Permissions:
    """A user's allow lists: every subject not listed is denied by the server."""

    pub: tuple[str, ...]
    sub: tuple[str, ...]
    inbox_prefix: str = INBOX

    def claims(self) -> dict[str, Any]:
        return {"pub": {"allow": list(self.pub)}, "sub": {"allow": list(self.sub)}}


def tenant_inbox(tenant: str, owner: str | None = None) -> str:
    """The inbox prefix of a tenant's (or one owner's) credential: one subject token per id,
    encoded like subject tokens, so no tenant's prefix covers another's."""
    base = f"{INBOX}.{token(tenant)}"
    return base if owner is None else f"{base}.{token(owner)}"


def agent_permissions(namespace: str, tenant: str, owner: str | None = None) -> Permissions:
    """An agent of ``tenant`` (optionally one owner, the user or else the agent of its turns):
    publish its own turns (a JetStream publish is a plain publish whose PubAck comes back on
    the reply inbox: no ``$JS.API`` needed), request recall and commands, and receive replies
    on its own inbox prefix. No stream, stage, DLQ, event, KV or JetStream API subject."""
    s = Subjects(namespace)
    turns = s.turns_filter(tenant, owner)
    inbox = tenant_inbox(tenant, owner)
    return Permissions(pub=(turns, s.recall, s.cmd("*")), sub=(f"{inbox}.>",), inbox_prefix=inbox)


def worker_permissions(namespace: str) -> Permissions:
    """The worker: its namespace's subjects, the JetStream API (streams, consumers, acks, flow
    control), the recall cache bucket, and replies to any inbox (it answers every tenant)."""
    s = Subjects(namespace)
    kv = f"$KV.{s.stream('recall_cache')}.>"
    return Permissions(
        pub=(f"{s.prefix}.>", "$JS.API.>", "$JS.ACK.>", "$JS.FC.>", kv, f"{INBOX}.>"),
        sub=(s.recall, s.cmd("*"), f"{INBOX}.>"),
    )


def user_jwt(
    account_seed: bytes,
    user: str,
    name: str,
    permissions: Permissions,
    expires_at: int | None = None,
) -> str:
    nats = {
        **permissions.claims(),
        "subs": UNLIMITED,
        "data": UNLIMITED,
        "payload": UNLIMITED,
        "type": "user",
        "version": 2,
    }
    return encode_jwt(account_seed, user, name, nats, expires_at)


def creds_text(jwt: str, seed: bytes) -> str:
    """A ``.creds`` file as nats-py and the nats CLI read it."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


def server_config(operator: str, system_account: str, accounts: dict[str, str]) -> str:
    """The ``auth.conf`` a nats-server includes: trust the operator, preload the accounts
    (a memory resolver: account JWTs change only with this file and a reload; user JWTs
    never need either)."""
    preload = "\n".join(f"  {pub}: {jwt}" for pub, jwt in accounts.items())
    return (
        "# Generated by `memstream creds init`: operator mode (decentralized JWT auth).\n"
        "# Public keys and signed JWTs only; the seeds stay beside it in *.nk files.\n"
        f"operator: {operator}\n"
        f"system_account: {system_account}\n"
        "resolver: MEMORY\n"
        f"resolver_preload: {{\n{preload}\n}}\n"
    )

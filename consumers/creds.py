"""``memstream creds init|create|worker``: the bus's trust chain and its credentials
(consumers/busauth.py mints them; docs/security.md explains the model).

The authority directory (``--dir``, default ``<state dir>/nats-auth``) holds the operator,
system and account seeds (``*.nk``, mode 0600: whoever reads ``account.nk`` can issue
credentials) and ``auth.conf``, the server configuration part that deploy/nats/nats.conf
includes. Credentials are written to files (mode 0600), never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

import nkeys

from memstream.consumers import busauth
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import token

OPERATOR, SYSTEM, ACCOUNT = "operator.nk", "system.nk", "account.nk"
AUTH_CONF, WORKER_CREDS, REVOKED = "auth.conf", "worker.creds", "revoked.json"
OPERATOR_JWT = "operator.jwt"
ROUTES_CONF = "routes.conf"
ROUTE_USER = "route"
# the peers deploy/compose.yaml names; other hosts: pass --routes to nats-server (with the
# password, ``route_url``)
PEERS = ("nats-1", "nats-2", "nats-3")


def write_private(path: Path, text: str, overwrite: bool = False) -> None:
    """Write ``text`` readable by the owner only; the file never exists with wider rights."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (0 if overwrite else os.O_EXCL)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)  # an existing file keeps its mode through O_TRUNC: tighten it


def _seed(directory: Path, name: str, prefix: int) -> bytes:
    path = directory / name
    if not path.exists():
        write_private(path, busauth.new_seed(prefix).decode() + "\n")
    return path.read_bytes().strip()


def _read_seed(directory: Path, name: str) -> bytes:
    try:
        return (directory / name).read_bytes().strip()
    except OSError:
        raise ConfigurationError(
            f"no {name} in {directory}: run `memstream creds init --dir {directory}` first"
        ) from None


def init(directory: Path, namespace: str) -> list[Path]:
    """Create the operator, system and application account (keeping any that exist), write
    ``auth.conf`` and, if missing, the worker's credential. Idempotent."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    op = _seed(directory, OPERATOR, nkeys.PREFIX_BYTE_OPERATOR)
    sys_seed = _seed(directory, SYSTEM, nkeys.PREFIX_BYTE_ACCOUNT)
    acc = _seed(directory, ACCOUNT, nkeys.PREFIX_BYTE_ACCOUNT)
    sys_pub, acc_pub = busauth.public_key(sys_seed), busauth.public_key(acc)
    conf = busauth.server_config(
        _operator_jwt(directory, op, sys_pub),
        sys_pub,
        {
            sys_pub: busauth.account_jwt(op, sys_pub, "SYS", jetstream=False),
            acc_pub: busauth.account_jwt(
                op, acc_pub, "memstream", jetstream=True, revocations=_revoked(directory)
            ),
        },
    )
    # replaced in one step: a server reloading meanwhile reads the old file or the new one
    tmp = directory / f".{AUTH_CONF}.tmp"
    tmp.write_text(conf)
    tmp.replace(directory / AUTH_CONF)
    written = [directory / AUTH_CONF]
    if not (directory / ROUTES_CONF).exists():
        written.append(_routes(directory))
    if not (directory / WORKER_CREDS).exists():
        written.append(worker(directory, namespace, directory / WORKER_CREDS))
    return written


def _routes(directory: Path) -> Path:
    """``routes.conf``, included in the ``cluster`` block of deploy/nats/nats.conf: a node
    accepts a route only with this password, and dials its peers with it. Without it anyone
    who reaches the cluster port could join as a node and see every account's messages,
    whatever the credentials of the clients. Written once (mode 0600): every node of a
    cluster needs the same file."""
    password = secrets.token_hex(24)  # hex: safe inside a URL and a quoted string
    urls = "\n".join(f"  {route_url(password, f'{peer}:6222')}" for peer in PEERS)
    write_private(
        directory / ROUTES_CONF,
        "# written by `memstream creds init`: the cluster's route password (docs/security.md)\n"
        f'authorization {{\n  user: {ROUTE_USER}\n  password: "{password}"\n  timeout: 2\n}}\n'
        f"routes: [\n{urls}\n]\n",
    )
    return directory / ROUTES_CONF


def route_url(password: str, host_port: str) -> str:
    """A route to ``host:port`` that the peers' ``routes.conf`` accepts."""
    return f"nats://{ROUTE_USER}:{password}@{host_port}"


def route_password(directory: Path) -> str:
    """The route password of the authority in ``directory`` (for ``--routes`` URLs)."""
    for line in (directory / ROUTES_CONF).read_text().splitlines():
        name, _, value = line.strip().partition(":")
        if name == "password":
            return value.strip().strip('"')
    raise ConfigurationError(f"no route password in {directory / ROUTES_CONF}")


def _operator_jwt(directory: Path, op: bytes, sys_pub: str) -> str:
    """The operator JWT, minted once: nats-server refuses a configuration reload that changes
    the trusted operator, and a re-minted JWT differs (issue time, id) even with the same key."""
    path = directory / OPERATOR_JWT
    if path.exists():
        return path.read_text().strip()
    jwt: str = busauth.operator_jwt(op, sys_pub)
    path.write_text(jwt + "\n")
    return jwt


def _revoked(directory: Path) -> dict[str, int]:
    try:
        revoked: dict[str, int] = json.loads((directory / REVOKED).read_text())
    except FileNotFoundError:
        return {}
    return revoked


def revoke(directory: Path, namespace: str, creds_file: Path) -> str:
    """Revoke the user of ``creds_file`` (every JWT issued to that key until now) and rewrite
    auth.conf; the servers apply it on reload (``nats-server --signal reload``) and close
    that user's connections."""
    _read_seed(directory, ACCOUNT)  # an initialised authority, or a clear error
    try:
        user: str = busauth.creds_user(creds_file.read_text())
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise ConfigurationError(f"{creds_file} is not a readable .creds file") from exc
    revoked = _revoked(directory)
    revoked[user] = int(time.time()) + 1  # covers a JWT issued within this second
    (directory / REVOKED).write_text(json.dumps(revoked, indent=1, sort_keys=True))
    init(directory, namespace)
    return user


def issue(
    directory: Path,
    name: str,
    permissions: busauth.Permissions,
    out: Path,
    expires_at: int | None = None,
    overwrite: bool = False,
) -> Path:
    account = _read_seed(directory, ACCOUNT)
    user = busauth.new_seed(nkeys.PREFIX_BYTE_USER)
    jwt = busauth.user_jwt(account, busauth.public_key(user), name, permissions, expires_at)
    write_private(out, busauth.creds_text(jwt, user), overwrite)
    return out


def service(
    directory: Path, namespace: str, name: str, out: Path, overwrite: bool = False
) -> tuple[Path, busauth.Permissions]:
    """A credential for a front end serving every tenant (gateway, MCP server)."""
    perms = busauth.service_permissions(namespace, name)
    return issue(directory, f"service {name}", perms, out, None, overwrite), perms


def worker(directory: Path, namespace: str, out: Path, overwrite: bool = False) -> Path:
    perms = busauth.worker_permissions(namespace)
    return issue(directory, f"memstream worker ({namespace})", perms, out, None, overwrite)


def tenant(
    directory: Path,
    namespace: str,
    tenant_id: str,
    out: Path,
    user: str | None = None,
    agent: str | None = None,
    expires_at: int | None = None,
    overwrite: bool = False,
) -> tuple[Path, busauth.Permissions]:
    """An agent credential of ``tenant_id``; with ``user``/``agent``, only that owner's turns
    (the owner of a turn subject is its user, else its agent)."""
    owner = user or agent
    perms = busauth.agent_permissions(namespace, tenant_id, owner)
    who = " ".join(f"{k} {v}" for k, v in (("user", user), ("agent", agent)) if v)
    name = f"tenant {tenant_id}" + (f" {who}" if who else "")
    return issue(directory, name, perms, out, expires_at, overwrite), perms


def _default_out(directory: Path, tenant_id: str, owner: str | None) -> Path:
    stem = token(tenant_id) + (f".{token(owner)}" if owner else "")
    return directory / "creds" / f"{stem}.creds"


def _run(a: argparse.Namespace) -> int:
    settings = Settings()
    directory: Path = a.dir or settings.state_dir / "nats-auth"
    namespace = a.namespace or settings.namespace
    try:
        if a.action == "init":
            for path in init(directory, namespace):
                print(f"wrote {path}")
            print(
                f"include {directory / AUTH_CONF} in the nats-server configuration "
                f"(deploy/nats/nats.conf); run workers with MEMSTREAM_NATS_CREDS="
                f"{directory / WORKER_CREDS}"
            )
            return 0
        days = getattr(a, "expires_days", None)
        expires = int(time.time() + days * 86400) if days else None
        if a.action == "revoke":
            user = revoke(directory, namespace, a.creds)
            print(
                f"revoked user {user}; {directory / AUTH_CONF} rewritten: reload every "
                "nats-server (nats-server --signal reload) to apply it"
            )
            return 0
        if a.action == "worker":
            out = worker(directory, namespace, a.out or directory / WORKER_CREDS, a.force)
            print(f"wrote {out} (worker credential; keep it secret)")
            return 0
        if a.action == "service":
            out, perms = service(
                directory,
                namespace,
                a.name,
                a.out or directory / "creds" / f"service.{token(a.name)}.creds",
                a.force,
            )
            print(f"wrote {out} (keep it secret: it may publish any tenant's turns)")
            print(f"  may publish: {', '.join(perms.pub)}")
            print(f"  replies on:  {perms.inbox_prefix}.>")
            return 0
        owner = a.user or a.agent
        out, perms = tenant(
            directory,
            namespace,
            a.tenant,
            a.out or _default_out(directory, a.tenant, owner),
            a.user,
            a.agent,
            expires,
            a.force,
        )
    except ConfigurationError as exc:
        print(f"memstream: {exc}", file=sys.stderr)
        return 2
    except FileExistsError as exc:
        print(f"memstream: {exc.filename} exists (pass --force to replace it)", file=sys.stderr)
        return 2
    print(f"wrote {out} (keep it secret; give it to the agent as MEMSTREAM_NATS_CREDS)")
    print(f"  may publish: {', '.join(perms.pub)}")
    print(f"  replies on:  {perms.inbox_prefix}.> (the SDK reads this from the file)")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("creds", help="NATS operator/accounts and per-tenant bus credentials")
    actions = p.add_subparsers(dest="action", required=True)
    for name, help_text in (
        (
            "init",
            "create the operator and accounts; write auth.conf, routes.conf and worker.creds",
        ),
        ("create", "issue an agent credential of a tenant (a .creds file)"),
        ("worker", "issue another worker credential"),
        ("service", "issue a credential for a front end serving every tenant (gateway, MCP)"),
        ("revoke", "revoke the user of a .creds file (then reload the servers)"),
    ):
        a = actions.add_parser(name, help=help_text)
        a.add_argument("--dir", type=Path, default=None, help="default: <state dir>/nats-auth")
        a.add_argument("--namespace", default=None, help="default: MEMSTREAM_NAMESPACE or mem")
        if name == "revoke":
            a.add_argument("creds", type=Path, help="the .creds file to revoke")
        elif name != "init":
            a.add_argument("--out", type=Path, default=None)
            a.add_argument("--force", action="store_true", help="replace an existing file")
        if name == "service":
            a.add_argument("--name", required=True, help="e.g. gateway")
        if name == "create":
            a.add_argument("--tenant", required=True)
            a.add_argument("--user", default=None, help="only this user's turns")
            a.add_argument("--agent", default=None, help="only this agent's turns (no --user)")
            a.add_argument("--expires-days", type=float, default=None)
    p.set_defaults(func=_run)

"""``memstream creds init|create|worker``: the bus's trust chain and its credentials
(consumers/busauth.py mints them; docs/security.md explains the model).

The authority directory (``--dir``, default ``<state dir>/nats-auth``) holds the operator,
system and account seeds (``*.nk``, mode 0600: whoever reads ``account.nk`` can issue
credentials) and ``auth.conf``, the server configuration part that deploy/nats/nats.conf
includes. Credentials are written to files (mode 0600), never printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nkeys

from memstream.consumers import busauth
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings
from memstream.schemas.subjects import token

OPERATOR, SYSTEM, ACCOUNT = "operator.nk", "system.nk", "account.nk"
AUTH_CONF, WORKER_CREDS = "auth.conf", "worker.creds"


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
        busauth.operator_jwt(op, sys_pub),
        sys_pub,
        {
            sys_pub: busauth.account_jwt(op, sys_pub, "SYS", jetstream=False),
            acc_pub: busauth.account_jwt(op, acc_pub, "memstream", jetstream=True),
        },
    )
    (directory / AUTH_CONF).write_text(conf)
    written = [directory / AUTH_CONF]
    if not (directory / WORKER_CREDS).exists():
        written.append(worker(directory, namespace, directory / WORKER_CREDS))
    return written


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
        if a.action == "worker":
            out = worker(directory, namespace, a.out or directory / WORKER_CREDS, a.force)
            print(f"wrote {out} (worker credential; keep it secret)")
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
        ("init", "create the operator and accounts; write auth.conf and worker.creds"),
        ("create", "issue an agent credential of a tenant (a .creds file)"),
        ("worker", "issue another worker credential"),
    ):
        a = actions.add_parser(name, help=help_text)
        a.add_argument("--dir", type=Path, default=None, help="default: <state dir>/nats-auth")
        a.add_argument("--namespace", default=None, help="default: MEMSTREAM_NAMESPACE or mem")
        if name != "init":
            a.add_argument("--out", type=Path, default=None)
            a.add_argument("--force", action="store_true", help="replace an existing file")
        if name == "create":
            a.add_argument("--tenant", required=True)
            a.add_argument("--user", default=None, help="only this user's turns")
            a.add_argument("--agent", default=None, help="only this agent's turns (no --user)")
            a.add_argument("--expires-days", type=float, default=None)
    p.set_defaults(func=_run)

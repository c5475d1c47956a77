"""deploy/nats/nats.conf is a configuration nats-server (from the wheel) accepts once
`memstream creds init` has written the auth.conf and routes.conf it includes, and refuses
without them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from memstream.consumers import creds
from memstream.consumers.embedded import nats_server_binary

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats.conf"


def _check(conf: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30
    )


def test_shipped_nats_conf_runs_in_operator_mode(tmp_path: Path) -> None:
    """With auth.conf and routes.conf beside it the shipped file is valid, it is operator
    mode, and its cluster takes routes only with a password."""
    conf = tmp_path / "nats.conf"
    shutil.copy(DEPLOY, conf)
    refused = _check(conf)
    assert refused.returncode != 0 and "routes.conf" in refused.stdout + refused.stderr
    creds.init(tmp_path, "mem")
    done = _check(conf)
    assert done.returncode == 0, done.stdout + done.stderr
    auth = (tmp_path / creds.AUTH_CONF).read_text()
    assert "operator: eyJ" in auth and "resolver: MEMORY" in auth
    seeds = [(tmp_path / n).read_text().strip() for n in (creds.OPERATOR, creds.ACCOUNT)]
    assert not [s for s in seeds if s in auth]  # public keys and JWTs only: no seed
    routes = tmp_path / creds.ROUTES_CONF
    password = creds.route_password(tmp_path)
    assert len(password) == 48 and (routes.stat().st_mode & 0o777) == 0o600
    assert f'password: "{password}"' in routes.read_text()
    creds.init(tmp_path, "mem")  # again: every node keeps the password it was given
    assert creds.route_password(tmp_path) == password

"""NATS credentials travel apart from the URL: read from their own variables, handed to
nats-py, hidden from every repr and every displayed URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from memstream.consumers.natsconn import api_keys_required, nats_options
from memstream.producers.connection import NatsAuth, display_url
from memstream.schemas.settings import Settings


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://memstream:hunter2@10.0.0.5:4222", "nats://10.0.0.5:4222"),
        ("nats://s3cr3ttoken@nats.example:4222", "nats://nats.example:4222"),
        ("tls://u:p%40ss@[::1]:4443", "tls://[::1]:4443"),
        ("nats://a:hunter2@h1:4222,nats://a:hunter2@h2:4222", "nats://h1:4222,nats://h2:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("u:hunter2@h3:4222", "nats://h3:4222"),
    ],
)
def test_display_url_drops_user_password_and_token(url: str, shown: str) -> None:
    """Whatever form the credentials take in a URL, the displayed URL holds none of them."""
    assert display_url(url) == shown


def test_credentials_come_from_their_own_variables(tmp_path: Path) -> None:
    """MEMSTREAM_NATS_* map onto nats-py's options; the repr never shows a secret."""
    env = {
        "MEMSTREAM_NATS_USER": "agent",
        "MEMSTREAM_NATS_PASSWORD": "hunter2-password",
        "MEMSTREAM_NATS_TOKEN": "hunter2-token",
        "MEMSTREAM_NATS_CREDS": str(tmp_path / "a.creds"),
        "MEMSTREAM_NATS_NKEY_SEED": str(tmp_path / "seed.nk"),
        "MEMSTREAM_NATS_INBOX_PREFIX": "_INBOX.acme",
    }
    auth = NatsAuth.from_env(env)
    assert auth.configured and "hunter2" not in repr(auth)
    assert auth.connect_options() == {
        "user": "agent",
        "password": "hunter2-password",
        "token": "hunter2-token",
        "user_credentials": str(tmp_path / "a.creds"),
        "nkeys_seed": str(tmp_path / "seed.nk"),
        "inbox_prefix": "_INBOX.acme",
    }
    empty = NatsAuth.from_env({})
    assert not empty.configured and empty.connect_options() == {}


def test_worker_settings_carry_credentials_as_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker reads the same variables; password and token are SecretStr in Settings."""
    monkeypatch.setenv("MEMSTREAM_NATS_USER", "worker")
    monkeypatch.setenv("MEMSTREAM_NATS_PASSWORD", "hunter2-password")
    s = Settings()
    assert isinstance(s.nats_password, SecretStr) and "hunter2" not in repr(s)
    assert nats_options(s) == {"user": "worker", "password": "hunter2-password"}


def test_credentials_on_the_bus_turn_api_keys_on() -> None:
    """A worker that authenticates to NATS requires API keys on recall and commands."""
    assert not api_keys_required(Settings(require_api_key=False))
    assert api_keys_required(Settings(require_api_key=True))
    assert api_keys_required(Settings(require_api_key=False, nats_creds=Path("w.creds")))
    assert api_keys_required(
        Settings(require_api_key=False, nats_user="w", nats_password=SecretStr("x"))
    )
    assert api_keys_required(Settings(require_api_key=False, nats_token=SecretStr("t")))

"""NATS credentials travel apart from the URL: read from their own variables, handed to
nats-py, hidden from every repr and every displayed URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from faststream.nats import NatsCredentials, NatsNKey, NatsToken, NatsUserPassword
from pydantic import SecretStr

from memstream.consumers.natsconn import api_keys_required, broker_options, nats_options
from memstream.producers.connection import NatsAuth, display_url
from memstream.schemas.errors import ConfigurationError
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


@pytest.mark.parametrize(
    ("env", "options"),
    [
        (
            {"USER": "agent", "PASSWORD": "hunter2-password"},
            {"user": "agent", "password": "hunter2-password"},
        ),
        ({"TOKEN": "hunter2-token"}, {"token": "hunter2-token"}),
        ({"CREDS": "/run/a.creds"}, {"user_credentials": "/run/a.creds"}),
        ({"NKEY_SEED": "/run/seed.nk"}, {"nkeys_seed": "/run/seed.nk"}),
        (
            {"TOKEN": "hunter2-token", "INBOX_PREFIX": "_INBOX.acme"},
            {"token": "hunter2-token", "inbox_prefix": "_INBOX.acme"},
        ),
    ],
)
def test_credentials_come_from_their_own_variables(
    env: dict[str, str], options: dict[str, str]
) -> None:
    """MEMSTREAM_NATS_* map onto nats-py's options; the repr never shows a secret."""
    auth = NatsAuth.from_env({f"MEMSTREAM_NATS_{k}": v for k, v in env.items()})
    assert auth.configured and "hunter2" not in repr(auth)
    assert auth.connect_options() == options
    empty = NatsAuth.from_env({})
    assert not empty.configured and empty.connect_options() == {}


def test_one_credential_at_a_time() -> None:
    """Two methods at once is a configuration error naming both variables, not their values."""
    with pytest.raises(ValueError, match="MEMSTREAM_NATS_CREDS, MEMSTREAM_NATS_TOKEN") as err:
        NatsAuth.from_env({"MEMSTREAM_NATS_CREDS": "a.creds", "MEMSTREAM_NATS_TOKEN": "hunter2"})
    assert "hunter2" not in str(err.value)
    with pytest.raises(ConfigurationError):
        nats_options(Settings(nats_creds=Path("a.creds"), nats_token=SecretStr("hunter2")))


@pytest.mark.parametrize(
    ("settings", "kind"),
    [
        (Settings(nats_creds=Path("w.creds")), NatsCredentials),
        (Settings(nats_nkey_seed=Path("w.nk")), NatsNKey),
        (Settings(nats_user="w", nats_password=SecretStr("hunter2")), NatsUserPassword),
        (Settings(nats_token=SecretStr("hunter2")), NatsToken),
    ],
)
def test_the_broker_gets_the_same_credential_as_security(settings: Settings, kind: type) -> None:
    """FastStream's broker takes credentials as ``security=``: each method maps onto its class."""
    options = broker_options(settings)
    assert isinstance(options.pop("security"), kind) and options == {}


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


def test_the_sdk_takes_a_creds_file_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An explicit ``nats_creds`` replaces the env's credential; two in the env are refused
    with the SDK's own error, naming the variables only."""
    from memstream.producers.client import MemoryClient, MemoryClientError

    monkeypatch.setenv("MEMSTREAM_NATS_TOKEN", "hunter2-token")
    client = MemoryClient("t", nats_url="nats://127.0.0.1:1", nats_creds=tmp_path / "a.creds")
    assert client._connect_options == {"user_credentials": str(tmp_path / "a.creds")}
    monkeypatch.setenv("MEMSTREAM_NATS_USER", "u")
    with pytest.raises(MemoryClientError, match="MEMSTREAM_NATS_USER/PASSWORD") as err:
        MemoryClient("t", nats_url="nats://127.0.0.1:1")
    assert "hunter2" not in str(err.value)

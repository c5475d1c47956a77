"""The redaction key: `memstream worker` refuses to run with no key or a public one, and the
development key is random per state directory, private, and stable across restarts."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import SecretStr

from memstream.consumers.redaction_key import DEV_KEY_FILE, dev_key, redaction_key
from memstream.schemas.errors import ConfigurationError
from memstream.schemas.settings import Settings


def test_settings_have_no_default_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public development value is gone from the defaults."""
    monkeypatch.delenv("MEMSTREAM_REDACTION_KEY", raising=False)
    assert Settings().redaction_key is None
    with pytest.raises(ConfigurationError, match="MEMSTREAM_REDACTION_KEY is not set"):
        redaction_key(Settings(redaction_key=None), dev=False)


def test_configured_key_wins_in_every_mode(tmp_path: Path) -> None:
    """A configured key is used as is, in development mode too (no key file is made)."""
    s = Settings(redaction_key=SecretStr("x" * 32), state_dir=tmp_path)
    assert redaction_key(s, dev=True) == b"x" * 32 == redaction_key(s, dev=False)
    assert not (tmp_path / DEV_KEY_FILE).exists()


def test_dev_key_is_private_random_and_stable(tmp_path: Path) -> None:
    """Created once with mode 0600, reused on restart, different per state directory."""
    first = redaction_key(Settings(state_dir=tmp_path / "a", redaction_key=None), dev=True)
    again = dev_key(tmp_path / "a")
    other = dev_key(tmp_path / "b")
    assert first == again != other and len(first) == 64
    mode = stat.S_IMODE((tmp_path / "a" / DEV_KEY_FILE).stat().st_mode)
    assert mode == 0o600
    assert [p.name for p in (tmp_path / "a").iterdir()] == [DEV_KEY_FILE]  # no temp left


def test_dev_key_readable_by_others_is_tightened(tmp_path: Path) -> None:
    """A key file someone opened up is put back to 0600 and keeps its value."""
    key = dev_key(tmp_path)
    (tmp_path / DEV_KEY_FILE).chmod(0o644)
    assert dev_key(tmp_path) == key
    assert stat.S_IMODE((tmp_path / DEV_KEY_FILE).stat().st_mode) == 0o600

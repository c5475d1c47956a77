"""The key of the redaction placeholders.

Placeholders are a short keyed hash of the redacted value, so whoever knows the key can
recover a phone or card number by trying every candidate. A production worker therefore
needs its own secret key (``MEMSTREAM_REDACTION_KEY``); development gets a random key kept
per state directory (file mode 0600), created once and reused on restart, so placeholders
stay stable across restarts of one ``memstream dev``. The key itself is never printed or
logged: errors name the variable, never a value.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from pydantic import ValidationError

from memstream.pipeline.redact import RedactionPolicy, Redactor, TenantRedactors
from memstream.schemas.errors import ConfigurationError, describe
from memstream.schemas.settings import Settings

DEV_KEY_FILE = "redaction.key"
MIN_KEY_CHARS = 16
# Values published in this project's history and examples: anyone can try them.
PUBLIC_KEYS = frozenset({"memstream-dev-redaction-key", "change-me"})


def configured_key(settings: Settings) -> bytes | None:
    """``MEMSTREAM_REDACTION_KEY`` if set; refuses a key that is short or public."""
    if settings.redaction_key is None:
        return None
    key: str = settings.redaction_key.get_secret_value()
    if key in PUBLIC_KEYS:
        raise ConfigurationError(
            "MEMSTREAM_REDACTION_KEY is a published example value: set a random secret "
            "(for example `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    if len(key) < MIN_KEY_CHARS:
        raise ConfigurationError(
            f"MEMSTREAM_REDACTION_KEY is shorter than {MIN_KEY_CHARS} characters: set a random "
            "secret (for example `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return key.encode()


def dev_key(state_dir: Path) -> bytes:
    """The state directory's development key: created once (random, mode 0600), then reused.

    Created under a temporary name and linked into place, so two processes starting at once
    agree on one key and neither reads a half-written file."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / DEV_KEY_FILE
    if not path.exists():
        tmp = state_dir / f".{DEV_KEY_FILE}.{secrets.token_hex(8)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            with contextlib.suppress(FileExistsError):  # another process won: use its key
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    if path.stat().st_mode & 0o077:  # readable by others: the key may have leaked; tighten
        path.chmod(0o600)
    key = path.read_text().strip()
    if len(key) < MIN_KEY_CHARS:
        raise ConfigurationError(f"{path} holds no usable key: delete it to make a new one")
    return key.encode()


def redaction_key(settings: Settings, *, dev: bool) -> bytes:
    """The configured key; else, in development mode only, the state directory's key.

    Outside development mode a missing key is a configuration error: the worker must not
    run with a key that anyone can know."""
    key = configured_key(settings)
    if key is not None:
        return key
    if dev:
        return dev_key(settings.state_dir)
    raise ConfigurationError(
        "MEMSTREAM_REDACTION_KEY is not set: `memstream worker` needs a secret key for the "
        "redaction placeholders (at least 16 random characters, the same on every worker). "
        "For development only, pass --dev-redaction-key to use a random key kept in the "
        "state directory."
    )


def make_redactor(s: Settings, key: bytes) -> TenantRedactors:
    """The redaction ``key`` and the tenants' policies (MEMSTREAM_REDACTION_POLICIES); an invalid
    policy stops the start with the tenant and the field, never the values."""
    policies: dict[str, RedactionPolicy] = {}
    for tenant, fields in s.redaction_policies.items():
        try:
            policies[tenant] = RedactionPolicy.model_validate(fields)
        except ValidationError as exc:
            where = describe(exc)
            raise ConfigurationError(
                f"MEMSTREAM_REDACTION_POLICIES: tenant {tenant!r}: {where}"
            ) from None
    by_tenant: dict[str, Redactor] = {}
    for tenant, policy in policies.items():
        try:
            by_tenant[tenant] = Redactor(key, policy)
        except Exception as exc:  # noqa: BLE001 - re2.error or ValueError: named, never echoed
            raise ConfigurationError(
                f"MEMSTREAM_REDACTION_POLICIES: tenant {tenant!r}: a deny pattern does not "
                f"compile ({type(exc).__name__})"
            ) from None
    return TenantRedactors(Redactor(key), by_tenant)

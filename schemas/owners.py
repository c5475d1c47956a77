"""Who a stored message body belongs to, read from the body alone.

A turn event names its owner at the top level (``tenant``, ``user``, ``agent``, ``session``);
a stage's candidate nests them under ``owner``. Dead letters hold either kind, and may hold
bytes that do not decode at all: such a body belongs to nobody, so an owner's listing or
erasure never shows or removes it by accident.
"""

from __future__ import annotations

import json
from typing import Any


def _decoded(body: bytes) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The body's object and the part of it that names the owner; None when it is not a
    JSON object."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    nested = data.get("owner")
    return data, nested if isinstance(nested, dict) else data


def tenant_of(body: bytes) -> str | None:
    """The tenant a body (a turn or a candidate) belongs to, if it decodes and names one."""
    decoded = _decoded(body)
    tenant = decoded[1].get("tenant") if decoded else None
    return tenant if isinstance(tenant, str) and tenant else None


def belongs_to(
    body: bytes, tenant: str, user: str | None, agent: str | None, session: str | None
) -> bool:
    """Whether a body is exactly this owner's: same tenant, same user and same agent, an unset
    one matching only an unset one (and, when given, the same session)."""
    decoded = _decoded(body)
    if decoded is None:
        return False
    data, owner = decoded
    if owner.get("tenant") != tenant:
        return False
    if owner.get("user") != user or owner.get("agent") != agent:
        return False
    return session is None or data.get("session") == session

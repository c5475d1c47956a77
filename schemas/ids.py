"""Identifier types and the deterministic id functions every stage shares.

Ids are deterministic so that every write is idempotent: replaying a message
computes the same ids and the same rows.
"""

from __future__ import annotations

import hashlib
import unicodedata
import uuid
from typing import NewType

TenantId = NewType("TenantId", str)
EventId = NewType("EventId", str)
MemoryId = NewType("MemoryId", str)

_NAMESPACE = uuid.UUID("5b1f6f2e-8a2c-4d5e-9c1a-6d0f3e2b7a41")


def normalise_content(text: str) -> str:
    """Fold case, Unicode form and white space so trivial variants hash alike."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split())


def content_hash(text: str) -> str:
    """sha256 of the normalised content, hex."""
    return hashlib.sha256(normalise_content(text).encode("utf-8")).hexdigest()


def memory_id(tenant: str, owner_key: str, kind: str, chash: str) -> MemoryId:
    """One memory per (tenant, owner scope, type, normalised content): the exact-dedupe key."""
    return MemoryId(str(uuid.uuid5(_NAMESPACE, f"{tenant}\x1f{owner_key}\x1f{kind}\x1f{chash}")))


def derived_id(*parts: str) -> str:
    """A stable uuid for anything derived from other ids (candidates, audit rows)."""
    return str(uuid.uuid5(_NAMESPACE, "\x1f".join(parts)))

"""Identifier types and the deterministic id functions every stage shares.

Ids are deterministic so that every write is idempotent: replaying a message
computes the same ids and the same rows.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
import uuid
from typing import NewType

MemoryId = NewType("MemoryId", str)

_NAMESPACE = uuid.UUID("5b1f6f2e-8a2c-4d5e-9c1a-6d0f3e2b7a41")


def normalise_content(text: str) -> str:
    """Fold case, Unicode form and white space so trivial variants hash alike."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split())


def content_hash(text: str) -> str:
    """sha256 of the normalised content, hex."""
    return hashlib.sha256(normalise_content(text).encode("utf-8")).hexdigest()


# Parts joined by a separator are ambiguous when a part contains it. Identifiers cannot
# (``schemas.events.Ident`` refuses control characters), so every id stored so far is in the
# joined form and stays what it was: dedupe keeps working across a deploy. Parts that do
# contain a separator (free text, or a direct caller) take an unambiguous JSON encoding in a
# namespace of its own, so the two forms never meet.
_SEPARATORS = ("\x1f", "\x1e")
_JSON_NAMESPACE = uuid.UUID("0d6b4c52-3f0e-4d8e-a1c7-9b2f5e8a6c13")


_NAMESPACE_BYTES = _NAMESPACE.bytes


def _uuid(parts: tuple[str, ...], joined: str) -> str:
    together = "".join(parts)
    if any(sep in together for sep in _SEPARATORS):
        return str(uuid.uuid5(_JSON_NAMESPACE, json.dumps(parts)))
    return _uuid5(_NAMESPACE_BYTES, joined)


def _uuid5(namespace: bytes, name: str) -> str:
    """``str(uuid.uuid5(UUID(bytes=namespace), name))``, the same string (RFC 4122's SHA-1
    name-based UUID), without the ``UUID`` object: every stage derives several ids a
    candidate, and the object and its ``str`` took 2/3 of each (5.9 against 2.1 us)."""
    digest = bytearray(hashlib.sha1(namespace + name.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    x = digest.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def owner_key(user: str | None, agent: str | None) -> str:
    """The owner's part of a memory id and of the memory-off table (legacy joined form)."""
    return f"{user or ''}\x1e{agent or ''}"


def memory_id(
    tenant: str, user: str | None, agent: str | None, kind: str, chash: str, reach: str = ""
) -> MemoryId:
    """One memory per (tenant, owner, type, normalised content, reach): the exact-dedupe key.
    ``reach`` says who reads the memory and how long it lives beyond the owner's own
    long-term memory (``pipeline.dedupe.reach``); empty for that default, whose ids stay the
    ones stored before it took part. Injective: distinct inputs give distinct ids (up to
    uuid5 collisions)."""
    joined = f"{tenant}\x1f{owner_key(user, agent)}\x1f{kind}\x1f{chash}"
    # None and "" are one owner part in the joined form; identifiers are never empty
    parts: tuple[str, ...] = (tenant, user or "", agent or "", kind, chash)
    if reach:
        joined, parts = f"{joined}\x1f{reach}", (*parts, reach)
    return MemoryId(_uuid(parts, joined))


def derived_id(*parts: str) -> str:
    """A stable uuid for anything derived from other ids (candidates, audit rows); injective
    over the parts."""
    return _uuid(parts, "\x1f".join(parts))

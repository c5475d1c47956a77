"""Secrets that are not personal data: private keys, JWTs, credentials in assignments and URLs.

Provider tokens with a known shape come from the gitleaks rules (``_gitleaks``); this module
covers what a rule list cannot: whole key blocks, base64-wrapped keys, and the values of
``password = ...``-style assignments in any common syntax (config, code, JSON, CLI flags, SQL).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator

from memstream.pipeline.redact._assign import _placeholder
from memstream.pipeline.redact._core import (
    P_CREDENTIAL,
    P_PRIVATE_KEY,
    P_TOKEN,
    Candidate,
    compile_re2,
    finditer,
)

# ---- private keys -----------------------------------------------------------------------------
_PEM_BEGIN = compile_re2(r"-----BEGIN[ A-Z0-9_\-]{0,100}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = compile_re2(r"-----END[ A-Z0-9_\-]{0,100}KEY(?: BLOCK)?-----")
_MAX_BLOCK = 1 << 16


def pem_blocks(text: str, lower: str) -> Iterator[Candidate]:
    """BEGIN ... PRIVATE KEY through the matching END line; without an END, to the end."""
    if "-----begin" not in lower:
        return
    pos = 0
    for m in finditer(_PEM_BEGIN, text):
        if m.start() < pos:
            continue
        end = _PEM_END.search(text, m.end(), min(len(text), m.end() + _MAX_BLOCK))
        pos = end.end() if end else min(len(text), m.end() + _MAX_BLOCK)
        yield Candidate(m.start(), pos, "PRIVATE_KEY", P_PRIVATE_KEY)


_B64_RUN = compile_re2(r"(?:[A-Za-z0-9+/]{32,}={0,2}(?:(?:\\[rn])+[ \t]*|\s+)?)+")
_B64_SKIP = compile_re2(r"\\[rn]|\s")


def encoded_keys(text: str, lower: str) -> Iterator[Candidate]:
    """Base64 runs that decode to a private key: DER (PKCS#1/#8, SEC1), PEM or a private JWK."""
    for m in finditer(_B64_RUN, text):
        raw = m.group()
        if len(raw) < 64:
            continue
        data = _B64_SKIP.sub("", raw[:_MAX_BLOCK])
        data = data[: len(data) // 4 * 4]
        try:
            blob = base64.b64decode(data)
        except (binascii.Error, ValueError):
            continue
        if _is_der_private_key(blob) or _has_key_marker(blob):
            yield Candidate(m.start(), m.start() + len(raw.rstrip()), "PRIVATE_KEY", P_PRIVATE_KEY)


def _is_der_private_key(blob: bytes) -> bool:
    # SEQUENCE { INTEGER 0|1 ... }: RSAPrivateKey, PrivateKeyInfo, ECPrivateKey
    if len(blob) < 8 or blob[0] != 0x30:
        return False
    n = blob[1]
    i = 2 + (n & 0x7F if n & 0x80 else 0)
    return blob[i : i + 3] in (b"\x02\x01\x00", b"\x02\x01\x01")


def _has_key_marker(blob: bytes) -> bool:
    if b"PRIVATE KEY" in blob:
        return True
    return b'"kty"' in blob and (b'"d"' in blob or b'"k"' in blob)


_JWK = compile_re2(
    r'"kty"\s*:\s*"[^"\n]{1,12}"|"(?:d|k|p|q|dp|dq|qi)"\s*:\s*"([A-Za-z0-9_\-]{16,})"'
)
_SEEDS = compile_re2(
    r"\b(?:S[UANCOXP][A-Z2-7]{56}|SWMKEY-1-[A-Za-z0-9+/]{43}|AGE-SECRET-KEY-1[0-9A-Z]{58})\b"
)


def key_material(text: str, lower: str) -> Iterator[Candidate]:
    """JWK private members (and the key-type marker), NATS nkey seeds, Docker swarm keys."""
    if '"' in text:
        for m in finditer(_JWK, text):
            s, e = m.span(1) if m.group(1) else m.span()
            yield Candidate(s, e, "PRIVATE_KEY", P_PRIVATE_KEY)
    for m in finditer(_SEEDS, text):
        yield Candidate(m.start(), m.end(), "PRIVATE_KEY", P_PRIVATE_KEY)


# ---- tokens ------------------------------------------------------------------------------------
_JWT = compile_re2(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{0,1000}")


def jwts(text: str, lower: str) -> Iterator[Candidate]:
    if "eyj" not in lower:
        return
    for m in finditer(_JWT, text):
        yield Candidate(m.start(), m.end(), "JWT", P_TOKEN)


# ---- credentials in URLs -----------------------------------------------------------------------
_URL_CRED = compile_re2(
    r"(?i)\b[a-z][a-z0-9+.\-]{1,20}://([^\s:/@\"'<>]{1,100}):([^\s@/\"'<>]{1,200})@[^\s/@]"
)


def url_credentials(text: str, lower: str) -> Iterator[Candidate]:
    if "://" not in text:
        return
    for m in finditer(_URL_CRED, text):
        value = m.group(2)
        if not _placeholder(value):
            yield Candidate(m.start(2), m.end(2), "PASSWORD", P_CREDENTIAL)

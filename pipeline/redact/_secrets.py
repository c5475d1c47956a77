"""Secrets that are not personal data: private keys, JWTs, credentials in assignments and URLs.

Provider tokens with a known shape come from the gitleaks rules (``_gitleaks``); this module
covers what a rule list cannot: whole key blocks, base64-wrapped keys, and the values of
``password = ...``-style assignments in any common syntax (config, code, JSON, CLI flags, SQL).
"""

from __future__ import annotations

import base64
import binascii
import re as stdlib_re
from collections.abc import Iterator
from functools import partial

from memstream.pipeline.redact._assign import _placeholder
from memstream.pipeline.redact._core import (
    DIGITS,
    LOWERS,
    P_CREDENTIAL,
    P_PRIVATE_KEY,
    P_TOKEN,
    UPPERS,
    Candidate,
    compile_re2,
    count_ascii,
    finditer,
    shannon_entropy,
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


def encoded_keys(text: str, lower: str) -> Iterator[Candidate]:
    """Base64 runs that decode to a private key: DER (PKCS#1/#8, SEC1), PEM or a private JWK."""
    for m in finditer(_B64_RUN, text):
        raw = m.group()
        if len(raw) < 64:
            continue
        # drop line breaks (real or escaped "\\n"/"\\r") and blanks between base64 lines
        data = "".join(raw[:_MAX_BLOCK].replace("\\r", " ").replace("\\n", " ").split())
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
        value = m.group(2) or ""  # a mandatory group of the pattern
        if not _placeholder(value):
            yield Candidate(m.start(2), m.end(2), "PASSWORD", P_CREDENTIAL)


# ---- random-looking tokens ---------------------------------------------------------------------
_TOKEN = compile_re2(r"[A-Za-z0-9][A-Za-z0-9_\-+/=.~%|]{15,300}")
_DATA_URI = compile_re2(r"data:[\w/+.\-]{1,40};base64,[A-Za-z0-9+/=\s]*")
_SEGMENT = compile_re2(r"[^/=&?]+")
_DIGEST = compile_re2(r"(?i)(?:sha\d*|md5|digest|commit|hash)[:= ]$")
_AWS = compile_re2(r"\b(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}\b")
AWS_TRIGGER = r"akia|asia|abia|acca|a3t"  # on the lower-cased text: one of the prefixes
P_RANDOM = P_CREDENTIAL - 5


def aws_key_ids(text: str, lower: str) -> Iterator[Candidate]:
    """AWS access key ids (``AKIA`` + 16): provider tokens, not scored for randomness."""
    for m in finditer(_AWS, text):
        yield Candidate(m.start(), m.end(), "API_KEY", P_TOKEN)


def random_tokens(text: str, lower: str) -> Iterator[Candidate]:
    """Unlabelled credentials: long tokens that mix letters and digits with high entropy.

    Most provider tokens are ``prefix_`` + 20-60 random characters; what separates them from
    words, identifiers, paths and URLs is randomness: several character classes, high Shannon
    entropy, and little of the token made of word-like letter runs. Base64 that decodes to
    plain text, and data URIs, are content rather than keys.
    """
    data_uris = [m.span() for m in finditer(_DATA_URI, text)] if "base64," in lower else []
    # Lines of a PEM private key block are tokens too, and a third of all tokens in dense
    # text: the block is a secret whole, so they are not scored (fail closed if the block
    # itself is not redacted, e.g. with PRIVATE_KEY off or a deny-list match over it).
    blocks = [(c.start, c.end) for c in pem_blocks(text, lower)]
    for m in finditer(_TOKEN, text):
        s, e = m.span()
        if any(ds <= s < de for ds, de in data_uris):
            continue
        while e > s and text[e - 1] in ".,|":
            e -= 1
        value = text[s:e]
        if blocks and any(bs <= s < be for bs, be in blocks):
            if len(value) >= 16:
                yield Candidate(s, e, "API_KEY", P_RANDOM)
            continue
        if len(value) < 16 or not count_ascii(value, DIGITS) or _digest(text, s, value):
            continue  # no digit: neither the token nor any of its segments looks random
        if not _url_or_path(text, s, value):
            # scored only if it would win its place (see ``Candidate.check``)
            yield Candidate(s, e, "API_KEY", P_RANDOM, partial(_random_token, text, s, e, value))
            continue
        # a path or URL: its segments can still be tokens (".../token/<secret>")
        for seg in finditer(_SEGMENT, value):
            piece = seg.group() or ""
            ok = len(piece) >= 16 and "." not in piece and _looks_random(piece)
            if ok and not _encoded_text(piece):
                yield Candidate(s + seg.start(), s + seg.end(), "API_KEY", P_RANDOM)


def _random_token(text: str, s: int, e: int, value: str) -> bool:
    """A whole token (not a URL or path) that looks random and is neither encoded prose nor
    a JSON member name, nor a malformed token of a provider whose format can be checked."""
    return (
        _looks_random(value)
        and not _encoded_text(value)
        and not _json_key(text, s, e)
        and not malformed_token(value)
    )


_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_BASE58_VALUE = {ch: i for i, ch in enumerate(_BASE58)}


def malformed_token(value: str) -> bool:
    """True for a value in a provider's token shape that its format rules out: a JFrog API key
    (``AKCp`` + 69) is base58 of 54 bytes, so one with a ``0``, ``O``, ``I`` or ``l`` in it,
    or of another decoded length, cannot be one (CredSweeper checks the same). Such a value
    is a made-up example: it opens nothing."""
    if len(value) == 73 and value.startswith("AKCp"):
        n = 0
        for ch in value:
            digit = _BASE58_VALUE.get(ch)
            if digit is None:
                return True
            n = n * 58 + digit
        return (n.bit_length() + 7) // 8 != 54
    return False


def _json_key(text: str, s: int, e: int) -> bool:
    """``{"<token>": ...}``: a quoted string followed by a colon names a member; the secrets of
    a JSON object are its values."""
    if not (s > 0 and text[s - 1] == '"' and text.startswith('"', e)):
        return False
    return text[e + 1 : e + 4].lstrip(" \t").startswith(":")


def _digest(text: str, s: int, value: str) -> bool:
    """Content hashes labelled as such (``sha256:<hex>``) identify data; they are not keys."""
    hexlike = not value.lower().encode("utf-8").translate(None, b"0123456789abcdef")
    return hexlike and _DIGEST.search(text[max(0, s - 8) : s]) is not None


def _url_or_path(text: str, s: int, value: str) -> bool:
    before = text[max(0, s - 8) : s].lower()
    if before.endswith(("://", "base64,", "@", "www.")) or value.startswith(("/", "www.")):
        return True
    if "=" in value.rstrip("=") or "&" in value:
        return True  # query string: judge its parts
    low = value.lower()
    return any(t in low for t in (".com", ".org", ".net", ".html", ".php", ".js", ".py"))


def _looks_random(value: str) -> bool:
    # token characters are ASCII (``_TOKEN``), so class counts can run in C over bytes
    data = value.encode("utf-8")
    n = len(data)
    digits = n - len(data.translate(None, DIGITS))
    if not digits:
        return False
    uppers = n - len(data.translate(None, UPPERS))
    lowers = n - len(data.translate(None, LOWERS))
    if not (uppers or lowers):
        return False
    classes = 1 + (uppers > 0) + (lowers > 0)
    entropy = shannon_entropy(value)
    if entropy < (3.0 if len(value) < 24 else 3.3) or (classes < 3 and entropy < 3.3):
        return False
    wordish = sum(len(w) for w in _WORDISH_RUNS.findall(value) if _vowelly(w))
    return wordish * 2 < len(value)


# Letter runs, on a token of at most ~300 characters. stdlib ``re`` is safe here: each
# alternative succeeds as soon as its minimum run is reached and fails within 5 characters,
# so the scan is linear (no backtracking beyond a constant).
_WORDISH_RUNS = stdlib_re.compile(r"[A-Z]?[a-z]{4,}|[A-Z]{5,}")


def _vowelly(run: str) -> bool:
    """Letter runs of real words have vowels; random letters mostly do not."""
    return bool(count_ascii(run, b"aeiouAEIOU") * 10 >= 3 * len(run))


_PRINTABLE = bytes(range(32, 127))


def encoded_text(value: str) -> bool:
    return _encoded_text(value)


def _encoded_text(value: str) -> bool:
    """True for base64 that decodes to mostly printable text with spaces (prose, not a key)."""
    core = value.rstrip("=")
    if len(core) < 24 or not core.replace("+", "").replace("/", "").isalnum():
        return False
    try:
        raw = base64.b64decode(core + "=" * (-len(core) % 4))
    except (binascii.Error, ValueError):
        return False
    printable = len(raw) - len(raw.translate(None, _PRINTABLE))
    return raw.count(b" ") >= 2 and printable >= 0.95 * len(raw)

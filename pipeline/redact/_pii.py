"""Personal identifiers with a structure: emails, phones, cards, IBANs, IPs, national ids.

Each detector finds candidates with one RE2 pattern and confirms them with a validator
(Luhn, mod-97, phonenumbers, python-stdnum, ipaddress), so the regexes can stay loose.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextvars import ContextVar
from functools import partial

import phonenumbers
from stdnum import iban as std_iban
from stdnum.us import ssn as std_ssn

from memstream.pipeline.redact._core import (
    DIGITS,
    P_ID,
    P_PHONE,
    P_VALIDATED,
    Candidate,
    compile_re2,
    count_ascii,
    finditer,
    luhn_ok,
)

# The local part is unbounded here (a counted repetition makes RE2's scan several times
# slower) and limited to 64 characters in Python, which gives the same matches: a bounded
# pattern would match only the last 64 characters of a longer run, a fragment then skipped.
_EMAIL = compile_re2(
    r"(?i)[a-z0-9][a-z0-9._%+\-]*@(?:[a-z0-9](?:[a-z0-9\-]{0,62}[a-z0-9])?\.){1,8}"
    r"[a-z]{2,24}\b"
)
_MAX_LOCAL = 64


def emails(text: str, lower: str) -> Iterator[Candidate]:
    if "@" not in text:
        return
    for m in finditer(_EMAIL, text):
        s = m.start()
        if s > 0 and (text[s - 1].isalnum() or text[s - 1] in "._%+-"):
            continue  # a fragment of a longer local part
        if text.find("@", s, s + _MAX_LOCAL + 1) < 0:
            continue  # local part over 64 characters
        if s > 0 and text[s - 1] == ":":
            scheme = text.rfind("://", max(0, s - 120), s)
            if scheme >= 0 and not any(ch.isspace() for ch in text[scheme:s]):
                continue  # user:password@host in a URL, not an address
        yield Candidate(s, m.end(), "EMAIL", P_VALIDATED)


# ---- cards ---------------------------------------------------------------------------------
_CARD = compile_re2(
    r"\b(?:\d{4}[ \-]\d{4}[ \-]\d{4}[ \-]\d{1,7}|\d{4}[ \-]\d{6}[ \-]\d{4,5}|\d{12,19})\b"
)


def cards(text: str, lower: str) -> Iterator[Candidate]:
    for m in finditer(_CARD, text):
        s, e = m.span()
        if _digit_neighbour(text, s, e):
            continue
        digits = "".join(ch for ch in m.group() if ch.isdigit())
        if 12 <= len(digits) <= 19 and len(set(digits)) > 1 and luhn_ok(digits):
            yield Candidate(s, e, "CREDIT_CARD", P_VALIDATED)


def _digit_neighbour(text: str, s: int, e: int) -> bool:
    """True when the match continues a longer number (digit or digit-separator-digit)."""
    before = text[max(0, s - 2) : s]
    after = text[e : e + 2]
    if before[-1:].isdigit() or after[:1].isdigit():
        return True
    if len(before) == 2 and before[0].isdigit() and before[1] in "-.,/":
        return True
    return len(after) == 2 and after[1].isdigit() and after[0] in "-.,/"


# ---- IBAN ----------------------------------------------------------------------------------
_IBAN = compile_re2(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")


def ibans(text: str, lower: str) -> Iterator[Candidate]:
    for m in finditer(_IBAN, text):
        if std_iban.is_valid(m.group()):
            yield Candidate(m.start(), m.end(), "IBAN", P_VALIDATED)


# ---- IP addresses ---------------------------------------------------------------------------
_IPV4 = compile_re2(
    r"\b(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}\b"
)
_IPV6 = compile_re2(
    r"(?i)(?:[0-9a-f]{1,4}:|:){2,7}(?:[0-9a-f]{1,4}|:)(?:(?:\.\d{1,3}){3}|(?::[0-9a-f]{1,4})?)"
)


def ips(text: str, lower: str) -> Iterator[Candidate]:
    if "." in text:
        for m in finditer(_IPV4, text):
            s, e = m.span()
            before, after = text[max(0, s - 2) : s], text[e : e + 2]
            if (before.endswith(".") and before[:1].isdigit()) or (
                after.startswith(".") and after[1:].isdigit()
            ):
                continue  # part of a longer dotted number (version, OID)
            yield Candidate(s, e, "IP_ADDRESS", P_VALIDATED)
    if "::" in text or text.count(":") >= 5:
        for m in finditer(_IPV6, text):
            s, e = m.span()
            if (s > 0 and (text[s - 1].isalnum() or text[s - 1] == ":")) or (
                e < len(text) and (text[e].isalnum() or text[e] == ":")
            ):
                continue
            value = m.group()
            if sum(ch.isalnum() for ch in value) < 4:
                continue
            try:
                ipaddress.IPv6Address(value)
            except ValueError:
                continue
            yield Candidate(s, e, "IP_ADDRESS", P_VALIDATED)


# ---- US SSN ---------------------------------------------------------------------------------
_SSN = compile_re2(r"\b\d{3}([\- .]?)\d{2}[\- .]?\d{4}\b")
_SSN_CUE = ("ssn", "social security", "social sec", "ss#", "ss #")


def ssns(text: str, lower: str) -> Iterator[Candidate]:
    for m in finditer(_SSN, text):
        s, e = m.span()
        if _digit_neighbour(text, s, e):
            continue
        value = m.group()
        sep = [ch for ch in value if not ch.isdigit()]
        cue = any(c in lower[max(0, s - 40) : s] for c in _SSN_CUE)
        if not cue and not (len(sep) == 2 and sep[0] == sep[1] == "-"):
            continue
        if std_ssn.is_valid(value.replace(" ", "-").replace(".", "-")):
            yield Candidate(s, e, "US_SSN", P_VALIDATED)


# ---- phones ---------------------------------------------------------------------------------
_PHONE = compile_re2(
    r"(?:\+|\b00|\(|\b)\d[\d\-. /()]{5,22}\d(?:\s?(?:x|ext\.?|extension)\s?\d{1,6})?\b"
)
_DATE_LIKE = compile_re2(
    r"^(?:\d{4}[-./](?:0?[1-9]|1[0-2])[-./](?:0?[1-9]|[12]\d|3[01])"
    r"|(?:0?[1-9]|[12]\d|3[01])[-./](?:0?[1-9]|[12]\d|3[01])[-./](?:\d{2}|\d{4}))$"
)


def _date_like(value: str) -> bool:
    """``_DATE_LIKE`` matches whole values of at most 10 digits and ``-./``: anything else is
    ruled out without a call into RE2 (most phone candidates)."""
    return len(value) <= 10 and not value.strip("0123456789-./") and bool(_DATE_LIKE.search(value))


_NANP = compile_re2(r"^\(?[2-9]\d{2}\)?[ .\-]?[2-9]\d{2}[ .\-]\d{4}$")
_PHONE_CUES = (
    "phone", "mobile", "cell", "tel", "fax", "call", "desk", "office", "whatsapp", "sms",
    "text me", "dial", "contact", "reach me", "number", "answering", "ring", "landline", "mob",
    "messag", "registered",
)  # fmt: skip
# National numbers are tried against these regions, most permissive and most common first
# (Germany's plan accepts many lengths). International numbers need no region.
_REGIONS = ("US", "GB", "DE", "AU", "NZ", "IN", "IE", "FR", "ES", "IT", "NL", "BR")


# Validations memoised for one ``Redactor.redact`` call (its first pass and its re-checks see
# the same numbers), keyed by value and cue. Set per call; a context variable, so threads
# and tasks each have their own.
PHONE_MEMO: ContextVar[dict[tuple[str, bool], bool] | None] = ContextVar("PHONE_MEMO", default=None)


class PhoneValidator:
    """Validates phone candidates with phonenumbers, with a per-call budget.

    Parsing a candidate against many regions is slow; an adversarial text can hold tens of
    thousands of candidates. Past the budget, candidates are judged by shape alone (7-15
    digits with phone-like grouping): the redactor fails closed, never slow.
    """

    def __init__(self, budget: int = 400) -> None:
        self.budget = budget

    def __call__(self, text: str, lower: str) -> Iterator[Candidate]:
        spent = [0]  # validations in this call, shared by its candidates' checks
        memo = PHONE_MEMO.get()
        if memo is None:
            memo = {}
        for m in finditer(_PHONE, text):
            s, e = m.span()
            value = m.group()
            if value.startswith("(") and ")" not in value:
                s, value = s + 1, value[1:]
            if value.endswith(")") and "(" not in value:
                e, value = e - 1, value[:-1]
            digits = count_ascii(value, DIGITS)
            if not 7 <= digits <= 15 or _date_like(value) or value.count(".") == 3:
                continue
            if _digit_neighbour(text, s, e) or (s > 0 and text[s - 1] in "+$€£"):
                continue
            # validated only if it would win its place (see ``Candidate.check``): digits in
            # cards, tokens and passwords are never parsed as phone numbers (nor their cue
            # words looked for)
            check = partial(self._confirm, value, lower, s, e, memo, spent)
            yield Candidate(s, e, "PHONE", P_PHONE, check)

    def _confirm(
        self,
        value: str,
        lower: str,
        s: int,
        e: int,
        memo: dict[tuple[str, bool], bool],
        spent: list[int],
    ) -> bool:
        window = lower[max(0, s - 40) : s] + " " + lower[e : e + 20]
        cue = any(c in window for c in _PHONE_CUES)
        known = memo.get((value, cue))
        if known is not None:
            return known
        if spent[0] >= self.budget:
            return cue or value.startswith(("+", "00", "("))  # past the budget: by shape
        spent[0] += 1
        known = memo[value, cue] = _valid_phone(value, cue)
        return known


def _valid_phone(value: str, cue: bool) -> bool:
    grouped = any(ch in value for ch in " -.()/")
    if cue and (grouped or value.startswith("+") or count_ascii(value, DIGITS) >= 9):
        # a cue word next to a grouped number is enough: national formats the metadata does
        # not know (short local numbers) are still phone numbers
        return True
    intl = value.startswith("+") or value.startswith("00")
    if not (cue or intl or value[0] in "0(" or _NANP.search(value)):
        return False  # a bare national number needs a trunk prefix, NANP shape or a cue
    number = "+" + value[2:] if value.startswith("00") else value
    regions: tuple[str | None, ...] = (None,) if intl else _REGIONS
    for region in regions:
        try:
            parsed = phonenumbers.parse(number, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(parsed) or (
            cue and phonenumbers.is_possible_number(parsed)
        ):
            return True
        if intl:
            return False
    return False


# ---- national ids and licences (cue + value, validated with python-stdnum when possible) ----
_ID_CUE = compile_re2(
    r"(?i)\b(driver'?s?\s+licen[cs]e|driving\s+licen[cs]e|licen[cs]e\s+(?:number|no\.?)|"
    r"passport|national\s+id(?:entity)?|identity\s+(?:card|number)|id\s+(?:card|number)|"
    r"personal\s+(?:id|number|code)|tax\s+(?:id|number|code)|\btin\b|\bnif\b|\bnie\b|\bdni\b|"
    r"\bbsn\b|pesel|personnummer|henkilötunnus|cpr|\bcpf\b|aadhaar|\bpan\b|\bsin\b|nino|"
    r"national\s+insurance|insurance\s+number|codice\s+fiscale|steuer-?id|social\s+insurance)"
    r"(?:\s+(?:number|no\.?|num|#|id|code))?\s*(?:is|:|#|=|-)?\s*"
    r"([A-Z0-9][A-Z0-9\-./ ]{3,22}[A-Z0-9])"
)


def national_ids(text: str, lower: str) -> Iterator[Candidate]:
    for m in finditer(_ID_CUE, text):
        value = m.group(2) or ""  # both groups are mandatory in the pattern
        # keep the value to its first token when the rest is prose
        parts = value.split(" ")
        if len(parts) > 1 and not all(p[:1].isdigit() for p in parts):
            value = parts[0]
        if count_ascii(value, DIGITS) < 4:
            continue
        cue = (m.group(1) or "").lower()
        label = "DRIVER_LICENSE" if "licen" in cue else "NATIONAL_ID"
        if "passport" in cue:
            label = "PASSPORT"
        yield Candidate(m.start(2), m.start(2) + len(value), label, P_ID)

"""Redaction: replace personal data and secrets with typed, tenant-stable placeholders.

    policy = RedactionPolicy()                      # which detectors, allow- and deny-lists
    r = Redactor(key=b"per-deployment secret", policy=policy)
    out = r.redact(text, tenant="t1")               # out.text, out.counts, out.spans

A placeholder is ``[LABEL:xxxxxxxx]``: the label and the first 8 hex digits of
HMAC-SHA256(key, tenant NUL normalised-value), so one value maps to one token within a tenant
and to unrelated tokens across tenants. Placeholders are never detected again, and detection
runs to a fixed point, so ``redact(redact(x).text) == redact(x)``. Text outside the reported
spans is returned unchanged. All patterns run on RE2 (linear time); validators with a cost per
candidate (phone numbers) have a budget past which they fail closed.

Labels: EMAIL, PHONE, CREDIT_CARD, IBAN, IP_ADDRESS, US_SSN, NATIONAL_ID, PASSPORT,
DRIVER_LICENSE, API_KEY, JWT, PRIVATE_KEY, PASSWORD, PERSON, ADDRESS, and DENY (or a custom
label) for the deny-list. The redactor is pure: no I/O beyond reading its packaged rule file
once, at construction.
"""

from __future__ import annotations

import bisect
import hmac
from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple, Protocol

import re2
from pydantic import BaseModel, ConfigDict, Field, field_validator

from memstream.pipeline.redact import _assign, _cues, _pii, _secrets
from memstream.pipeline.redact._core import (
    P_DENY,
    Candidate,
    Detector,
    Solo,
    Trigger,
    compile_re2,
    compile_set,
    finditer,
    known_placeholders,
    placeholders,
    resolve,
)
from memstream.pipeline.redact._core import (
    PLACEHOLDER as PLACEHOLDER,
)
from memstream.pipeline.redact._gitleaks import GitleaksRules
from memstream.pipeline.redact._spans import Span, all_placeholders, overlaps, rendered, to_original

__all__ = [
    "LABELS",
    "DenyPattern",
    "Redacted",
    "RedactionPolicy",
    "Redactor",
    "Redacts",
    "Span",
    "TenantRedactors",
]

LABELS: frozenset[str] = frozenset(
    [
        "EMAIL",
        "PHONE",
        "CREDIT_CARD",
        "IBAN",
        "IP_ADDRESS",
        "US_SSN",
        "NATIONAL_ID",
        "PASSPORT",
        "DRIVER_LICENSE",
        "API_KEY",
        "JWT",
        "PRIVATE_KEY",
        "PASSWORD",
        "PERSON",
        "ADDRESS",
    ]
)
_MAX_ROUNDS = 4
_WINDOW = 160  # context any detector looks at around a value, in characters


class DenyPattern(BaseModel):
    """A term or RE2 pattern that is always redacted, under ``label``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pattern: str
    regex: bool = False
    ignore_case: bool = True
    label: str = Field(default="DENY", pattern=r"^[A-Z][A-Z0-9_]{0,31}$")


class RedactionPolicy(BaseModel):
    """Per-tenant redaction configuration.

    ``labels``: detectors to run (default: all of ``LABELS``). ``allow``: literal values that
    are never redacted (compared after stripping, case-insensitively). ``deny``: terms and
    patterns that are always redacted, whatever the detectors say.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1
    labels: frozenset[str] = LABELS
    allow: frozenset[str] = frozenset()
    deny: tuple[DenyPattern, ...] = ()

    @field_validator("labels")
    @classmethod
    def _known(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = value - LABELS
        if unknown:
            raise ValueError(f"unknown labels: {sorted(unknown)}")
        return value


class Redacted(NamedTuple):
    """The redacted text, counts by label, and the spans in the original text."""

    text: str
    counts: dict[str, int]
    spans: list[Span]


# Detectors by the labels they can produce; a detector runs if any of its labels is enabled.
# The third column is the detector's trigger: an RE2 pattern, over the lower-cased text with
# placeholders blanked out, that every candidate the detector can produce (outside a
# placeholder) contains. All triggers run as one RE2 set; a detector whose trigger does not
# occur has nothing to find and is skipped. ``None``: the detector always runs (its cues
# are too common for a prefilter to pay).
_DETECTORS: tuple[tuple[frozenset[str], Detector, Trigger | None], ...] = (
    (frozenset({"PRIVATE_KEY"}), _secrets.pem_blocks, r"-----begin"),
    (frozenset({"PRIVATE_KEY"}), _secrets.encoded_keys, Solo(r"[a-z0-9+/]{32}")),
    (
        frozenset({"PRIVATE_KEY"}),
        _secrets.key_material,
        Solo(r'"(?:kty|d|k|p|q|dp|dq|qi)"\s*:|s[uancoxp][a-z2-7]{56}|swmkey-1-|age-secret-key-1'),
    ),
    (frozenset({"JWT"}), _secrets.jwts, r"eyj"),
    (frozenset({"API_KEY"}), _secrets.random_tokens, Solo(r"[a-z0-9][a-z0-9_\-+/=.~%|]{15}")),
    (frozenset({"API_KEY"}), _secrets.aws_key_ids, _secrets.AWS_TRIGGER),
    (frozenset({"PASSWORD"}), _secrets.url_credentials, r"://"),
    (
        frozenset({"PASSWORD", "API_KEY"}),
        _assign.pairs,
        # every secret name contains one of these; a name inside a placeholder can only
        # yield a value that overlaps the placeholder, so blanking placeholders is safe
        r"pass|pwd|pw|secret|cred|token|key|identified|-string",
    ),
    (frozenset({"PASSWORD", "API_KEY"}), _assign.comparisons, _assign.COMPARISON_TRIGGER),
    (frozenset({"PASSWORD"}), _assign.cli_flags, _assign.CLI_TRIGGER),
    (frozenset({"EMAIL"}), _pii.emails, r"@"),
    (frozenset({"CREDIT_CARD"}), _pii.cards, r"\d{4}"),
    (frozenset({"IBAN"}), _pii.ibans, r"[a-z]{2}\d{2}"),
    (frozenset({"IP_ADDRESS"}), _pii.ips, r"\d\.\d|:[0-9a-f:]"),
    (frozenset({"US_SSN"}), _pii.ssns, r"\d{3}[\- .]?\d{2}"),
    (
        frozenset({"NATIONAL_ID", "PASSPORT", "DRIVER_LICENSE"}),
        _pii.national_ids,
        # a part of every cue of _pii._ID_CUE
        r"licen|passport|national|identity|\bid\s|personal|tax\s|\btin\b|\bnif\b|\bnie\b"
        r"|\bdni\b|\bbsn\b|pesel|personnummer|henkilötunnus|cpr|\bcpf\b|aadhaar|\bpan\b"
        r"|\bsin\b|nino|insurance|codice|steuer",
    ),
    (frozenset({"PERSON"}), _cues.names, None),
    (frozenset({"PERSON"}), _cues.signoff_names, _cues.SIGNOFF_TRIGGER),
    (frozenset({"PERSON"}), _cues.answer_names, _cues.ANSWER_TRIGGER),
    (frozenset({"ADDRESS"}), _cues.addresses, r"\d|usns|uss|usnv|uscgc"),
)
_PHONE_TRIGGER = r"\d[\d\-. /()]{5}"


class Redactor:
    """Compiled detectors for one policy. Immutable after construction; thread-safe."""

    __slots__ = (
        "_allow",
        "_always",
        "_deny",
        "_gated",
        "_key",
        "_labels",
        "_mac",
        "_triggers",
        "gitleaks_skipped",
        "key_id",
    )

    def __init__(self, key: bytes, policy: RedactionPolicy | None = None) -> None:
        if not key:
            raise ValueError("a non-empty key is required")
        policy = policy or RedactionPolicy()
        self._key = bytes(key)
        self.key_id = key_id(self._key)
        # the key's pads hashed once; each placeholder copies that state instead of rehashing
        self._mac = hmac.new(self._key, digestmod="sha256")
        self._labels = policy.labels
        self._allow = frozenset(a.strip().lower() for a in policy.allow)
        self._deny = tuple((compile_re2(_deny_regex(d)), d.label) for d in policy.deny if d.pattern)
        table: list[tuple[Detector, Trigger | None]] = [
            (d, trigger) for labels, d, trigger in _DETECTORS if labels & policy.labels
        ]
        if "PHONE" in policy.labels:
            table.append((_pii.PhoneValidator(), _PHONE_TRIGGER))
        self.gitleaks_skipped: dict[str, str] = {}
        if "API_KEY" in policy.labels:
            rules = GitleaksRules.load()  # prefilters itself, on its keywords
            self.gitleaks_skipped = rules.skipped
            table.append((rules, None))
        self._always = tuple(d for d, trigger in table if trigger is None)
        self._gated = tuple(d for d, trigger in table if trigger is not None)
        self._triggers = compile_set([t for _, t in table if t is not None])

    def __repr__(self) -> str:
        return f"Redactor(labels={sorted(self._labels)}, key=<hidden>)"

    def redact(self, text: str, tenant: str) -> Redacted:
        """Replace every detected value with its placeholder; see the module docstring."""
        memo = _pii.PHONE_MEMO.set({})
        try:
            return self._redact(text, tenant)
        finally:
            _pii.PHONE_MEMO.reset(memo)

    def _redact(self, text: str, tenant: str) -> Redacted:
        spans = [Span(c.start, c.end, c.label) for c in self._detect(text)]
        tokens: dict[Span, str] = {}
        current = self._render(text, spans, tenant, tokens) if spans else text
        fresh = spans
        for _ in range(_MAX_ROUNDS - 1):
            # A replacement changes the context of its neighbours only: re-check the text
            # around the new placeholders until nothing more is found (a fixed point, so
            # redacting the output again changes nothing).
            if not fresh:
                break
            marks = all_placeholders(placeholders(text), spans)
            found = self._detect_near(current, rendered(fresh, spans), marks)
            fresh = to_original(found, spans)
            spans = sorted(spans + fresh, key=lambda s: s.start)
            if fresh:
                current = self._render(text, spans, tenant, tokens)
        counts = Counter(s.label for s in spans)
        return Redacted(current, dict(counts), spans)

    def _detect_near(
        self, text: str, ranges: list[tuple[int, int]], marks: list[tuple[int, int]]
    ) -> list[Candidate]:
        # Each window runs from the start of the line _WINDOW characters before a placeholder
        # to the end of the line _WINDOW characters after it. Ranges are sorted and disjoint,
        # so line ends are searched only past what was already searched (linear overall,
        # even on a megabyte without line breaks). ``marks``: every placeholder of ``text``
        # (none contains a line break, so each lies wholly inside or outside a window).
        windows: list[tuple[int, int]] = []
        searched, line_end = -1, -1  # line_end: first "\n" (or the end) at or after searched
        for s, e in ranges:
            lo = max(0, s - _WINDOW)
            prev_end = windows[-1][1] if windows else 0
            if windows and lo <= prev_end:
                ws = prev_end  # its line starts at or before the previous window's end
            else:
                nl = text.rfind("\n", prev_end, lo)
                ws = nl + 1 if nl >= 0 else prev_end
            hi = min(len(text), e + _WINDOW)
            if hi > line_end or hi < searched:
                found = text.find("\n", hi)
                searched, line_end = hi, len(text) if found < 0 else found
            we = line_end
            if windows and ws <= windows[-1][1] + _WINDOW:
                # overlapping, or a short gap: one window (a wider context never hurts, and
                # each detection pass has a fixed cost that fewer windows pay less often)
                windows[-1] = (windows[-1][0], max(we, windows[-1][1]))
            else:
                windows.append((ws, we))
        out: list[Candidate] = []
        for ws, we in windows:
            window = text[ws:we]
            i = bisect.bisect_left(marks, (ws, -1))
            j = bisect.bisect_left(marks, (we, -1), i)
            known_placeholders(window, [(a - ws, b - ws) for a, b in marks[i:j]])
            out.extend(c._replace(start=c.start + ws, end=c.end + ws) for c in self._detect(window))
        return out

    def _detect(self, text: str) -> list[Candidate]:
        lower = text.lower()
        protected = placeholders(text)
        masked = lower
        if protected:
            parts: list[str] = []
            pos = 0
            for ps, pe in protected:
                parts.append(lower[pos:ps])
                parts.append(" " * (pe - ps))
                pos = pe
            parts.append(lower[pos:])
            masked = "".join(parts)
        cands: list[Candidate] = []
        for regex, label in self._deny:
            cands.extend(
                Candidate(m.start(), m.end(), label, P_DENY) for m in finditer(regex, text)
            )
        detectors = list(self._always)
        if self._gated:
            detectors.extend(self._gated[i] for i in sorted(self._triggers.Match(masked) or ()))
        for detector in detectors:
            for c in detector(text, lower):
                if c.label in self._labels or c.priority == P_DENY:
                    cands.append(c)
        if protected:
            # a candidate overlapping a placeholder is void, and must not shadow others
            cands = [c for c in cands if not overlaps(c, protected)]
        out = []
        for c in resolve(cands):
            if self._allow and text[c.start : c.end].strip().lower() in self._allow:
                continue
            out.append(c)
        return out

    def _render(self, text: str, spans: list[Span], tenant: str, tokens: dict[Span, str]) -> str:
        parts: list[str] = []
        pos = 0
        for s in spans:
            parts.append(text[pos : s.start])
            token = tokens.get(s)
            if token is None:
                token = tokens[s] = self.placeholder(s.label, text[s.start : s.end], tenant)
            parts.append(token)
            pos = s.end
        parts.append(text[pos:])
        return "".join(parts)

    def placeholder(self, label: str, value: str, tenant: str) -> str:
        """The token for ``value`` under ``label`` in ``tenant``."""
        msg = tenant.encode() + b"\x00" + _normalise(label, value).encode()
        mac = self._mac.copy()
        mac.update(msg)
        digest = mac.digest()[:4].hex()
        return f"[{label}:{digest}]"


def key_id(key: bytes) -> str:
    """A short public name of a redaction key (never the key, nor enough to find it): what
    a redacted candidate carries, so that a process keyed otherwise is told apart."""
    return hmac.new(key, b"memstream redaction key id", "sha256").hexdigest()[:12]


class Redacts(Protocol):
    """What a stage needs of redaction: a Redactor or TenantRedactors."""

    @property
    def key_id(self) -> str:
        """``key_id`` of the key the placeholders are made with."""

    def redact(self, text: str, tenant: str) -> Redacted: ...


class TenantRedactors:
    """Redaction by tenant policy: tenants named in ``by_tenant`` get their own Redactor, every
    other tenant ``default``. Same ``redact(text, tenant)`` as a Redactor. Build them all with
    one key, so a tenant's placeholders do not change when it gets a policy of its own."""

    __slots__ = ("_by_tenant", "_default")

    def __init__(self, default: Redactor, by_tenant: Mapping[str, Redactor] | None = None) -> None:
        self._default = default
        self._by_tenant = dict(by_tenant or {})

    def __repr__(self) -> str:
        return f"TenantRedactors(tenants={sorted(self._by_tenant)}, key=<hidden>)"

    @property
    def key_id(self) -> str:
        return self._default.key_id

    def for_tenant(self, tenant: str) -> Redactor:
        return self._by_tenant.get(tenant, self._default)

    def redact(self, text: str, tenant: str) -> Redacted:
        return self.for_tenant(tenant).redact(text, tenant)


def _deny_regex(d: DenyPattern) -> str:
    body = d.pattern if d.regex else re2.escape(d.pattern)
    return f"(?i:{body})" if d.ignore_case else body


def _normalise(label: str, value: str) -> str:
    """One spelling per value, so '+1 202-555-0143' and '(202) 555 0143' share a token."""
    if label in {"PHONE", "CREDIT_CARD", "US_SSN"}:
        digits = "".join(filter(str.isdigit, value))
        return digits[-10:] if label == "PHONE" else digits
    if label in {"EMAIL", "IBAN", "IP_ADDRESS"}:
        return "".join(value.split()).lower()
    return value

"""The gitleaks rule set (vendored data file, MIT) run with RE2 and its keyword prefilter.

gitleaks rules are Go regexes, i.e. RE2 syntax, so most compile unchanged. A rule is used when
it has a regex RE2 accepts and no ``path`` condition (file-name rules mean nothing for a chat
message); the others are skipped and counted in ``GitleaksRules.skipped``. Per rule, as in
gitleaks: the secret is the first non-empty capture group (else the whole match); it must reach
the rule's Shannon entropy; rule and global allowlists (regexes and stopwords) are honoured.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import re2

from memstream.pipeline.redact._core import (
    P_TOKEN,
    Candidate,
    Pattern,
    compile_re2,
    finditer,
    shannon_entropy,
)

# Rules whose hits are better served by memstream's own detectors (which know where the value
# of an assignment starts and ends, and which placeholders to skip) are not run twice.
_SET_OPTIONS = re2.Options()
_SET_OPTIONS.log_errors = False

_REPLACED = frozenset({"generic-api-key", "private-key", "jwt"})

# Rules published without keywords would run on every text. Their regexes require one of
# these literals (lower-cased; the rule's names are case-insensitive), so they serve as the
# rule's keywords here: "database-password" needs ``db_passw(or)d``, ``database_passw(or)d``
# or ``pwd`` in its name part.
_DERIVED_KEYWORDS = {"database-password": ("pwd", "db_passw", "database_passw")}

# Two published keywords occur in most texts ("s." ends every plural before a full stop, "sk"
# is in "ask" and "task"), so their rules would run on most messages for almost no hits. Each is
# looked for as a pattern its rule's regex requires around it instead (still a necessary
# condition, on the lower-cased text): vault's ``s\.(?i:[a-z0-9]{24})`` starts with ``s.``
# and a letter or digit, ``(?i)`` so that what the rule's case folding accepts there (the
# long s, the Kelvin sign) is accepted here; twilio's ``SK[0-9a-fA-F]{32}`` starts with
# ``sk`` and 8 hex digits.
_NARROWED_KEYWORDS = {
    ("vault-service-token", "s."): r"(?i:s\.[a-z0-9])",
    ("twilio-api-key", "sk"): r"sk[0-9a-f]{8}",
}


@dataclass(frozen=True)
class _Allow:
    target: str  # "secret" | "match" | "line"
    regexes: tuple[Pattern, ...]
    stopwords: tuple[str, ...]


@dataclass(frozen=True)
class _Rule:
    id: str
    regex: Pattern
    entropy: float
    keywords: tuple[str, ...]
    allows: tuple[_Allow, ...]


@dataclass
class GitleaksRules:
    rules: list[_Rule] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    global_allow: tuple[Pattern, ...] = ()
    global_stopwords: tuple[str, ...] = ()
    keyword_set: Any = None
    keyword_list: list[str] = field(default_factory=list)
    by_keyword: dict[str, list[_Rule]] = field(default_factory=dict)  # by keyword pattern
    always: list[_Rule] = field(default_factory=list)

    @classmethod
    def load(cls, text: str | None = None) -> GitleaksRules:
        """Parse the TOML (default: the packaged ``data/gitleaks.toml``) and compile it."""
        if text is None:
            data = resources.files("memstream.pipeline.redact") / "data" / "gitleaks.toml"
            text = data.read_text(encoding="utf-8")
        doc: dict[str, Any] = tomllib.loads(text)
        out = cls()
        glob = doc.get("allowlist", {})
        out.global_allow = tuple(_compile_all(glob.get("regexes", [])))
        out.global_stopwords = tuple(s.lower() for s in glob.get("stopwords", []))
        for raw in doc.get("rules", []):
            rid = str(raw.get("id", "?"))
            if rid in _REPLACED:
                out.skipped[rid] = "replaced by a memstream detector"
                continue
            if "path" in raw or "regex" not in raw:
                out.skipped[rid] = "file-path rule"
                continue
            try:
                regex = compile_re2(raw["regex"])
                allows = tuple(
                    _Allow(
                        a.get("regexTarget", "secret"),
                        tuple(_compile_all(a.get("regexes", []), strict=True)),
                        tuple(s.lower() for s in a.get("stopwords", [])),
                    )
                    for a in raw.get("allowlists", [])
                    if "paths" not in a
                )
            except re2.error as exc:
                out.skipped[rid] = f"RE2 rejected the regex: {exc}"
                continue
            rule = _Rule(
                rid,
                regex,
                float(raw.get("entropy", 0.0)),
                tuple(k.lower() for k in raw.get("keywords", [])) or _DERIVED_KEYWORDS.get(rid, ()),
                allows,
            )
            out.rules.append(rule)
            if rule.keywords:
                for kw in rule.keywords:
                    pattern = _NARROWED_KEYWORDS.get((rid, kw)) or re2.escape(kw)
                    out.by_keyword.setdefault(pattern, []).append(rule)
            else:
                out.always.append(rule)
        if out.by_keyword:
            # an RE2 set reports every keyword present in one linear pass (the prefilter)
            out.keyword_set = re2.Set.SearchSet(_SET_OPTIONS)
            out.keyword_list = list(out.by_keyword)
            for pattern in out.keyword_list:
                out.keyword_set.Add(pattern)
            out.keyword_set.Compile()
        return out

    def __call__(self, text: str, lower: str) -> Iterator[Candidate]:
        active: dict[str, _Rule] = {r.id: r for r in self.always}
        if self.keyword_set is not None:
            for index in self.keyword_set.Match(lower) or ():
                for rule in self.by_keyword[self.keyword_list[index]]:
                    active.setdefault(rule.id, rule)
        for rule in active.values():
            for m in finditer(rule.regex, text):
                yield from self._check(rule, m, text)

    def _check(self, rule: _Rule, m: Any, text: str) -> Iterator[Candidate]:
        start, end = m.span()
        for i in range(1, rule.regex.groups + 1):
            if m.group(i):
                start, end = m.span(i)
                break
        secret = text[start:end]
        if not secret or shannon_entropy(secret) < rule.entropy:
            return
        low = secret.lower()
        if any(r.search(secret) for r in self.global_allow):
            return
        if any(w in low for w in self.global_stopwords):
            return
        for allow in rule.allows:
            target = secret
            if allow.target == "match":
                target = m.group()
            elif allow.target == "line":
                ls = text.rfind("\n", 0, start) + 1
                le = text.find("\n", end)
                target = text[ls : le if le >= 0 else len(text)]
            if any(r.search(target) for r in allow.regexes):
                return
            if any(w in low for w in allow.stopwords):
                return
        if _prose(secret) or _malformed(secret):
            return
        yield Candidate(start, end, "API_KEY", P_TOKEN)


def _malformed(secret: str) -> bool:
    from memstream.pipeline.redact._secrets import malformed_token

    return bool(malformed_token(secret))


def _prose(secret: str) -> bool:
    from memstream.pipeline.redact._secrets import encoded_text

    return bool(encoded_text(secret))


def _compile_all(patterns: list[str], strict: bool = False) -> Iterator[Pattern]:
    """One alternation of the patterns RE2 accepts ("any of them matches" in one scan)."""
    ok: list[str] = []
    for p in patterns:
        try:
            compile_re2(p)
        except re2.error:
            if strict:
                raise
            continue
        ok.append(p)
    if ok:
        yield compile_re2("|".join(f"(?:{p})" for p in ok))

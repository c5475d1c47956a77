"""Values assigned to secret-looking names: ``password = "..."``, ``"apiKey": "..."``,
``--password=...``, ``PASSWORD '...'`` in SQL, ``pw: ...`` in prose, comparisons in code.

The name decides the label (``pass``/``pwd``/``pw`` -> PASSWORD, else API_KEY); only the value
is replaced. Values that are references rather than secrets (``${VAR}``, ``getenv(...)``,
``self.password``, empty strings, ``***``) are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator

from memstream.pipeline.redact._core import P_CREDENTIAL, Candidate, compile_re2, finditer

_KEYWORD = (
    r"(?:pass(?:word|wd|phrase|code)?|pwd|pw|secrete?|creds?|credentials?|token"
    r"|(?:api|secret|private|access|signing|encryption|master|licen[cs]e|activation|auth"
    r"|client|app|consumer|account)[_\-. ]?key|apikey|client[_\-.]?secret)"
)
_NAME = r"([A-Za-z0-9_.\-]{0,40}?" + _KEYWORD + r"[A-Za-z0-9_.\-]{0,30})"
_QUOTED = (
    r'@?"((?:[^"\\\n]|\\.){1,200})"'
    r"|@?'([^'\n]{1,200})'"
    r"|`([^`\n]{1,200})`"
    r"|&quot;([^&\n]{1,200})&quot;"
)
_UNQUOTED = r"([^\s'\"`]{1,200})"
_OP = r"(?:\[\d*\])?[\"']?[ \t]*(?::=|=>|===|!==|==|!=|=|:|,(?:[ \t]*\")|\s(?:is|was)\s)[ \t]*"

_ASSIGN = compile_re2(r"(?i)" + _NAME + _OP + r"(?:" + _QUOTED + "|" + _UNQUOTED + ")")
# "..." == password   /   secret("...")   /   secret.assign("...")   /   password "..."
_REVERSED = compile_re2(r'(?i)"([^"\n]{1,200})"\s*(?:===|!==|==|!=)\s*' + _NAME)
_CALL = compile_re2(
    r"(?i)"
    + _NAME
    + r"(?:\.assign)?\(\s*(?:"
    + _QUOTED
    + r")|"
    + _NAME
    + r"[ \t]+(?:"
    + _QUOTED
    + r")[ \t]*[;,)]?[ \t]*$"
)
# CLI flags and SQL: --password=..., -p..., IDENTIFIED BY '...', PASSWORD '...'
_CLI = compile_re2(
    r"(?i)(?:--?(?:pass(?:word|phrase)?|pwd|secret|token|api[_\-]?key)[ =]"
    r"|identified\s+by\s+|with\s+(?:encrypted\s+)?password\s+|-string\s+-force\s+)"
    r"(?:" + _QUOTED + "|" + _UNQUOTED + ")"
)
_KEY_SKIP = compile_re2(
    r"(?i)(?:length|len|size|name|_id|id$|url|uri|file|path|field|type|hint|policy|regex"
    r"|pattern|label|prompt|placeholder|header|expir|count|min|max|ttl|format|valid|strength"
    r"|reset|forgot|author|keyboard|monkey|turkey|keystore|keyring|tokenizer|public)"
)
_OTHER_PAIR = compile_re2(r"[,;\s][A-Za-z_][\w.\-]{0,40}\s*[:=]")
_REFERENCE = compile_re2(
    r"(?i)^(?:\$\{?[\w.]+\}?|\{\{.*\}\}|<[^>]*>|%\(?\w*\)?s?|\{\d*\}|@\w+@|%\w+%|\[\w+\]"
    r"|(?:os\.)?(?:getenv|environ|process\.env|env|config|settings|self|this|params|request)\b.*"
    r"|[a-z_]+(?:\.[a-z_]+)+(?:\(.*\))?|\w+\(.*\))$"
)
_STOP_VALUES = frozenset(
    [
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "string",
        "str",
        "password",
        "passwd",
        "secret",
        "token",
        "changeme",
        "change_me",
        "example",
        "required",
        "optional",
        "empty",
        "hidden",
        "dummy",
        "test",
        "sample",
        "placeholder",
        "incorrect",
        "invalid",
        "wrong",
        "correct",
        "missing",
        "expired",
        "same",
        "different",
        "yes",
        "no",
        "value",
    ]
)
_STOP_PARTS = ("fake", "example", "dummy", "placeholder", "your_", "your-", "xxxx", "****")


def assignments(text: str, lower: str) -> Iterator[Candidate]:
    for m in finditer(_ASSIGN, text):
        name_start = m.start(1)
        if name_start > 0 and (text[name_start - 1].isalnum()):
            continue
        name = m.group(1)
        if _KEY_SKIP.search(_strip_keyword(name)):
            continue
        label = _label(name)
        natural = m.group(0)[len(name) :].lstrip("[]0123456789\"' \t").startswith(("is", "was"))
        for g in range(2, 6):
            if m.group(g) is not None:
                yield from _value(text, m.start(g), m.end(g), label, quoted=True)
                break
        else:
            s, e = m.span(6)
            s, e = _unquoted_extent(text, name_start, s, e)
            if natural:
                while e > s and text[e - 1] in ".,;:?)":
                    e -= 1
                if not _strong(text[s:e]):
                    continue
            yield from _value(text, s, e, label, quoted=False)
    for m in finditer(_REVERSED, text):
        yield from _value(text, m.start(1), m.end(1), _label(m.group(2)), quoted=True)
    for m in finditer(_CALL, text):
        groups = [g for g in range(1, _CALL.groups + 1) if m.group(g) is not None]
        name, value = groups[0], groups[-1]
        if name != value and not _KEY_SKIP.search(_strip_keyword(m.group(name))):
            yield from _value(text, m.start(value), m.end(value), _label(m.group(name)), True)
    for m in finditer(_CLI, text):
        groups = [g for g in range(1, _CLI.groups + 1) if m.group(g) is not None]
        if groups:
            s, e = m.span(groups[-1])
            quoted = groups[-1] != _CLI.groups
            if not quoted:
                s, e = _unquoted_extent(text, m.start(), s, e)
            yield from _value(text, s, e, "PASSWORD", quoted)


def _strip_keyword(name: str) -> str:
    """The parts of a name around its secret keyword (so 'password_length' -> '_length')."""
    low = name.lower()
    for kw in ("password", "passwd", "passphrase", "secret", "token", "key", "pwd", "pass"):
        i = low.find(kw)
        if i >= 0:
            return low[:i] + " " + low[i + len(kw) :]
    return low


def _label(name: str) -> str:
    low = name.lower()
    return "PASSWORD" if ("pass" in low or "pwd" in low or "pw" in low) else "API_KEY"


def _unquoted_extent(text: str, line_from: int, s: int, e: int) -> tuple[int, int]:
    """An unquoted value: one token, or the rest of the line for ``key: value`` lines."""
    value = text[s:e]
    cut = _OTHER_PAIR.search(value)
    if cut:
        e = s + cut.start()
    line_start = text.rfind("\n", 0, line_from) + 1
    if not cut and not text[line_start:line_from].strip():
        line_end = text.find("\n", e)
        line_end = len(text) if line_end < 0 else line_end
        rest = text[e:line_end]
        if rest.strip() and len(rest) < 100 and not _OTHER_PAIR.search(rest):
            e = e + len(rest.rstrip())
    while e > s and text[e - 1] in ",;":
        e -= 1
    return s, e


def _strong(value: str) -> bool:
    """A value in prose ("my password is X") must look like a password, not a word."""
    return any(ch.isdigit() for ch in value) or not value.isalpha() or not value.islower()


def _placeholder(value: str) -> bool:
    v = value.strip()
    low = v.lower()
    if len(v) < 4 or not any(ch.isalnum() for ch in v):
        return True
    if low in _STOP_VALUES or any(p in low for p in _STOP_PARTS):
        return True
    return _REFERENCE.search(v) is not None


def _value(text: str, s: int, e: int, label: str, quoted: bool) -> Iterator[Candidate]:
    value = text[s:e]
    if _placeholder(value):
        return
    if not quoted and value.replace("_", "").isalpha() and ("_" in value or value.islower()):
        return  # an identifier (variable) rather than a literal
    if quoted and value.replace("_", "").isalpha() and "_" in value and value.islower():
        return
    yield Candidate(s, e, label, P_CREDENTIAL)

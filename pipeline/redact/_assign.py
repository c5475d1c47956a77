"""Values assigned to secret-looking names: ``password = "..."``, ``"apiKey": "..."``,
``--password=...``, ``PASSWORD '...'`` in SQL, ``pw: ...`` in prose, comparisons in code.

The name decides the label (``pass``/``pwd``/``pw`` -> PASSWORD, else API_KEY); only the value
is replaced. Values that are references rather than secrets (``${VAR}``, ``getenv(...)``,
``self.password``, empty strings, ``***``) are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator

from memstream.pipeline.redact._core import (
    P_CREDENTIAL,
    Candidate,
    Match,
    blank_placeholders,
    compile_re2,
    finditer,
    in_placeholder,
    placeholders,
)

_KEYWORD = (
    r"(?:pass(?:word|wd|phrase|code)?|pwd|pw|secrete?|creds?|credentials?|token"
    r"|(?:api|secret|private|access|signing|encryption|master|licen[cs]e|activation|auth"
    r"|client|app|consumer|account)[_\-. ]?key|apikey|client[_\-.]?secret)"
)
# Names and values are unbounded in the patterns and bounded here, in Python: counted
# repetitions ({0,40}, {1,200}) make every RE2 match several times more expensive. A name is
# at most _MAX_PREFIX characters before its keyword and _MAX_SUFFIX after it; a quoted value
# longer than _MAX_VALUE is not a password (skipped); an unquoted one is cut there.
_MAX_PREFIX, _MAX_SUFFIX, _MAX_VALUE = 40, 30, 200
_NAME = r"([A-Za-z0-9_.\-]*?" + _KEYWORD + r"[A-Za-z0-9_.\-]*)"
_QUOTED = (
    r'@?"((?:[^"\\\n]|\\.)+)"'
    r"|@?'([^'\n]+)'"
    r"|`([^`\n]+)`"
    r"|&quot;([^&\n]+)&quot;"
)
_UNQUOTED = r"([^\s'\"`]+)"
_KW = compile_re2(r"(?i)" + _KEYWORD)
_OP = r"(?:\[\d*\])?[\"']?[ \t]*(?::=|=>|===|!==|==|!=|=|:|,(?:[ \t]*\")|\s(?:is|was)\s)[ \t]*"

_ASSIGN = compile_re2(r"(?i)" + _NAME + _OP + r"(?:" + _QUOTED + "|" + _UNQUOTED + ")")
# "..." == password   /   secret("...")   /   secret.assign("...")   /   password "..."
_REVERSED = compile_re2(r'(?i)"([^"\n]+)"\s*(?:===|!==|==|!=)\s*' + _NAME)
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
# every _CLI match contains one of these (lower-cased): the trigger of ``cli_flags``
_CLI_CUES = ("-pass", "-pwd", "-secret", "-token", "-api", "identified", "password", "-string")
CLI_TRIGGER = "|".join(_CLI_CUES)
COMPARISON_TRIGGER = r"==|!="
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


def pairs(text: str, lower: str) -> Iterator[Candidate]:
    """``name = value`` in any common syntax, and calls (``secret("...")``)."""
    done = placeholders(text)  # a value starting inside one is void: skip it early
    # Scanned with the insides of placeholders blanked: "[API_KEY:0123abcd]" is itself a
    # name, an operator and a value (void, but costly to match). Same offsets as ``text``.
    scan = blank_placeholders(text, done)
    for m in finditer(_ASSIGN, scan):
        name_start = m.start(1)
        if name_start > 0 and (text[name_start - 1].isalnum()):
            continue
        if done and in_placeholder(done, _value_start(m)):
            continue
        name = m.group(1) or ""
        if not _name_ok(name) or _KEY_SKIP.search(_strip_keyword(name)):
            continue
        label = _label(name)
        after = text[m.end(1) : m.end(1) + 16]
        natural = after.lstrip("[]0123456789\"' \t").startswith(("is", "was"))
        for g in range(2, 6):
            if m.group(g) is not None:
                if m.end(g) - m.start(g) <= _MAX_VALUE:
                    yield from _value(text, m.start(g), m.end(g), label, quoted=True)
                break
        else:
            s, e = m.span(6)
            s, e = _unquoted_extent(text, name_start, s, min(e, s + _MAX_VALUE))
            if _code_expression(text, m.end(1), s, e):
                continue
            if natural:
                while e > s and text[e - 1] in ".,;:?)":
                    e -= 1
                if not _strong(text[s:e]):
                    continue
            yield from _value(text, s, e, label, quoted=False)
    for m in finditer(_CALL, scan) if _maybe_call(scan) else ():
        groups = [g for g in range(1, _CALL.groups + 1) if m.group(g) is not None]
        gname, gvalue = groups[0], groups[-1]
        key = m.group(gname) or ""
        if gname == gvalue or m.end(gvalue) - m.start(gvalue) > _MAX_VALUE or not _name_ok(key):
            continue
        if not _KEY_SKIP.search(_strip_keyword(key)):
            yield from _value(text, m.start(gvalue), m.end(gvalue), _label(key), True)


def comparisons(text: str, lower: str) -> Iterator[Candidate]:
    """``"value" == password`` (trigger: ``==`` or ``!=``)."""
    scan = blank_placeholders(text, placeholders(text))
    for m in finditer(_REVERSED, scan):
        name = m.group(2) or ""
        if m.end(1) - m.start(1) <= _MAX_VALUE and _name_ok(name):
            yield from _value(text, m.start(1), m.end(1), _label(name), quoted=True)


def cli_flags(text: str, lower: str) -> Iterator[Candidate]:
    """``--password=...``, ``IDENTIFIED BY '...'`` (trigger: one of ``_CLI_CUES``)."""
    scan = blank_placeholders(text, placeholders(text))
    for m in finditer(_CLI, scan):
        groups = [g for g in range(1, _CLI.groups + 1) if m.group(g) is not None]
        if groups:
            s, e = m.span(groups[-1])
            quoted = groups[-1] != _CLI.groups
            if quoted and e - s > _MAX_VALUE:
                continue
            if not quoted:
                s, e = _unquoted_extent(text, m.start(), s, min(e, s + _MAX_VALUE))
            yield from _value(text, s, e, "PASSWORD", quoted)


_QUOTE_STARTS = ('"', "'", "`", '@"', "@'", "&quot;")
_QUOTE_ENDS = ('"', "'", "`", "&quot;")
_BLANKS = " \t\n\r\f\v"


def _maybe_call(scan: str) -> bool:
    """False when ``_CALL`` cannot match (checked without a call into RE2): its first form
    needs ``(``, blanks and a quoted value; its second a quoted value at the very end of the
    text (``$`` without multi-line mode), then only blanks and one of ``;,)``."""
    tail = scan.rstrip(" \t")
    if tail.endswith(_QUOTE_ENDS):
        return True
    if tail[-1:] in (";", ",", ")") and tail[:-1].rstrip(" \t").endswith(_QUOTE_ENDS):
        return True
    i = scan.find("(")
    for _ in range(32):  # bounded Python work: past 32 parentheses, left to the pattern
        if i < 0:
            return False
        after = scan[i + 1 : i + 65]
        rest = after.lstrip(_BLANKS)
        if rest.startswith(_QUOTE_STARTS) or (not rest and len(after) == 64):
            return True  # a quote after the blanks (or 64 blanks: left to the pattern)
        i = scan.find("(", i + 1)
    return i >= 0


def _name_ok(name: str) -> bool:
    """At most _MAX_PREFIX characters before the name's (first) keyword, _MAX_SUFFIX after."""
    if len(name) <= _MAX_SUFFIX + 2:  # every keyword has 2+ characters
        return True
    kw = _KW.search(name)
    if kw is None:
        return False
    start, end = int(kw.start()), int(kw.end())
    return start <= _MAX_PREFIX and len(name) - end <= _MAX_SUFFIX


def _value_start(m: Match) -> int:
    for g in range(2, 7):
        if m.group(g) is not None:
            return int(m.start(g))
    return int(m.end())


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
    cut = _other_pair(value)
    if cut:
        e = s + cut.start()
    if not cut and _line_start(text, line_from):
        # the rest of the line, if it is short (searched no further: linear on long lines)
        line_end = text.find("\n", e, e + 100)
        if line_end < 0 and len(text) - e < 100:
            line_end = len(text)
        rest = text[e:line_end] if line_end >= 0 else ""
        if rest.strip() and not _other_pair(rest):
            e = e + len(rest.rstrip())
    while e > s and text[e - 1] in ",;":
        e -= 1
    return s, e


def _line_start(text: str, pos: int) -> bool:
    """Only blanks between the start of the line and ``pos`` (walks back over the blanks)."""
    i = pos
    while i > 0 and text[i - 1] != "\n":
        if not text[i - 1].isspace():
            return False
        i -= 1
    return True


def _code_expression(text: str, name_end: int, s: int, e: int) -> bool:
    """``name = value;`` as a statement of C-family code: an unquoted right-hand side there is
    an expression (identifier, macro, call), since string literals are always quoted.

    Needs the spaced operator of code (``=``, ``:=``, ``=>``; shell's ``VAR=value;`` has no
    spaces and stays a literal) and the ``;`` ending the line.
    """
    op = text[name_end:s].lstrip("[]0123456789")  # ``secret[] = ...``: an array declaration
    if op.strip(" \t") not in ("=", ":=", "=>") or op[:1] not in " \t" or op[-1:] not in " \t":
        return False
    if not text.startswith(";", e):
        return False
    line_end = text.find("\n", e)
    return not text[e + 1 : len(text) if line_end < 0 else line_end].strip()


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
    return _maybe_reference(v) and _REFERENCE.search(v) is not None


def _other_pair(value: str) -> Match | None:
    """``_OTHER_PAIR.search(value)``; a pair needs ``:`` or ``=`` (no call into RE2 without)."""
    if ":" not in value and "=" not in value:
        return None
    found: Match | None = _OTHER_PAIR.search(value)
    return found


_REFERENCE_WORDS = ("getenv", "env", "config", "settings", "self", "this", "params", "request")


def _maybe_reference(v: str) -> bool:
    """False when ``_REFERENCE`` cannot match ``v`` (checked without a call into RE2): each of
    its forms starts with one of ``$%{<@[``, contains a dot, ends with ``)`` or starts with one
    of its words (case-insensitive; non-ASCII text is left to the pattern)."""
    if v[:1] in ("$", "%", "{", "<", "@", "[") or "." in v or v.endswith(")"):
        return True
    return not v.isascii() or v[:8].lower().startswith(_REFERENCE_WORDS)


def _value(text: str, s: int, e: int, label: str, quoted: bool) -> Iterator[Candidate]:
    value = text[s:e]
    if _placeholder(value):
        return
    if not quoted and value.replace("_", "").isalpha() and ("_" in value or value.islower()):
        return  # an identifier (variable) rather than a literal
    if quoted and value.replace("_", "").isalpha() and "_" in value and value.islower():
        return
    if label == "API_KEY" and _sequential(value):
        return  # "ABCDE-FGHIJ", "key12345678": an example, not a generated key
    yield Candidate(s, e, label, P_CREDENTIAL)


def _sequential(value: str) -> bool:
    """True when ``value`` holds a run of consecutive characters (``KLMNO``, ``54321``) longer
    than a generated key gives by chance: at least 5, and at least the bit length of the
    value's length (6 from 32 characters, 7 from 64). The odds of a run of 5 in a random
    alphanumeric key of 30 characters are ~1e-6 (CredSweeper's ValuePatternCheck, after
    Meli et al., "How Bad Can It Git?", NDSS 2019, applies the same rule to keyword pairs).
    Keys only: people choose passwords like ``Summer12345``, and those are secrets."""
    need = max(5, len(value).bit_length())
    if len(value) < need:
        return False
    up = down = 1
    prev = ord(value[0])
    for ch in value[1:]:
        cur = ord(ch)
        up = up + 1 if cur - prev == 1 else 1
        down = down + 1 if prev - cur == 1 else 1
        if up >= need or down >= need:
            return True
        prev = cur
    return False

"""Names and street addresses, found by cue and by pattern (no name lists).

A capitalised word is only taken for a name when a cue says so: an introduction ("my name is",
"call me"), a title (Mr, Dr), a greeting or sign-off, a speech verb ("says"), a form label
("Name:"), or a relation ("my sister"). Street addresses are matched by shape: a house number
and a street-type word (English, and common continental forms), a PO box or a military
address, followed by the apartment, city, region and postal-code parts when they follow.
"""

from __future__ import annotations

from collections.abc import Iterator

from memstream.pipeline.redact._core import (
    P_ADDRESS,
    P_PERSON,
    Candidate,
    Match,
    Pattern,
    compile_re2,
    finditer,
)

_TOK = r"\p{Lu}[\p{Ll}\p{Lu}'\x{2019}\-]*\p{Ll}[\p{Ll}'\x{2019}\-]*"
_PART = (
    r"(?:"
    + _TOK
    + r"|\p{Lu}\.?|(?:de|da|di|do|dos|van|von|der|den|del|la|le|du|bin|al|ten|ter|mc))"
)
_NAME = r"(" + _TOK + r"(?:[ \t]+" + _PART + r"){0,3})"

_CUES = compile_re2(
    r"(?:(?i:\bmy name is|\bmy name's|\bname is|\bi am called|\bcall me|\bnamed|\bcalled"
    r"|\bi'm|\bi am|\bthis is|\bsays|\bsaid|\basked|\breplied|\bwrote|\baccording to"
    r"|\bstarring|\bfeaturing|\b(?:directed|written|produced|sung|composed|founded|played"
    r"|performed|signed|sent|approved|created) by|\bspeak (?:to|with)|\btalk to|\bask for"
    r"|\bintroduce you to|\bassistant to|\bmarried|\bmy (?:wife|husband|son|daughter|mother"
    r"|father|mom|mum|dad|brother|sister|friend|boss|manager|colleague|partner|grandmother"
    r"|grandfather|grandma|grandpa|aunt|uncle|cousin|neighbou?r|fianc[ée]e?|girlfriend"
    r"|boyfriend|doctor|lawyer)(?:,| is| was| named| called)?)"
    r"|\b(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Dame|Madam|Mme|Mlle|Herr|Frau|Sr|Sra)\.?)"
    r"[ \t]+" + _NAME
)
_LINE_CUES = compile_re2(
    r"(?m)^[ \t>*]*(?:(?i:hi|hello|hey|dear|good (?:morning|afternoon|evening)|greetings)"
    r"[ \t,]+" + _NAME + r"|(?i:(?:full |first |last |customer |patient |contact |account "
    r"|card ?holder |user)?name|user|customer|patient|contact|from|to|attn|signed|author)"
    r"[ \t]*:[ \t]*" + _NAME + r"[ \t.,;!?]*$)"
)
_SIGNOFF_CUE = (
    r"(?i:regards|best|cheers|thanks|thank you|sincerely|yours(?: truly)?|best wishes|love"
    r"|respectfully|warmly|take care)[ \t]*[,.!]?[ \t]*\n"
)
_SIGNOFF = compile_re2(_SIGNOFF_CUE + r"[ \t>]*" + _NAME + r"[ \t]*(?:\n|$)")
_QUESTION = r"(?i:what(?:'s| is) your name|name on the account)"
_ANSWER = compile_re2(_QUESTION + r"\??[ \t]*(?:\w+:)?[ \t]*" + _NAME)
_NOT_NAMES = frozenset(
    [
        "I",
        "The",
        "A",
        "An",
        "It",
        "This",
        "That",
        "There",
        "Here",
        "Not",
        "Sorry",
        "Happy",
        "Glad",
        "Fine",
        "Good",
        "Great",
        "Okay",
        "Ok",
        "Yes",
        "No",
        "So",
        "Just",
        "Very",
        "Really",
        "Going",
        "Trying",
        "Looking",
        "Calling",
        "Writing",
        "Interested",
        "Available",
        "Sure",
        "Mr",
        "Mrs",
        "Ms",
        "Dr",
        "What",
        "When",
        "Where",
        "Who",
        "Why",
        "How",
        "Please",
        "Thanks",
        "Thank",
        "Hello",
        "Hi",
        "Dear",
        "All",
        "Team",
        "Everyone",
        "Sir",
        "Madam",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ]
)


def names(text: str, lower: str) -> Iterator[Candidate]:
    """Names after a cue, a greeting or a form label (``_CUES``, ``_LINE_CUES``); the rarer
    forms have detectors of their own, run only when their trigger occurs (``signoff_names``,
    ``answer_names``)."""
    yield from _names(text, _CUES)
    yield from _names(text, _LINE_CUES)


def signoff_names(text: str, lower: str) -> Iterator[Candidate]:
    """The name on the line after a sign-off ("Regards,\nAnn")."""
    return _names(text, _SIGNOFF)


def answer_names(text: str, lower: str) -> Iterator[Candidate]:
    """The answer to "what's your name?" (a speaker label after the question is not)."""
    for m in finditer(_ANSWER, text):
        for g in range(1, _ANSWER.groups + 1):
            if m.group(g):
                if not text.startswith(":", m.end(g)):
                    yield from _name(text, m.start(g), m.end(g))
                break


# Triggers of the two rarer forms: the part of their pattern before the name (a necessary
# condition; the patterns are case-insensitive there, so it holds on the lower-cased text).
SIGNOFF_TRIGGER = _SIGNOFF_CUE
ANSWER_TRIGGER = _QUESTION


def _names(text: str, regex: Pattern) -> Iterator[Candidate]:
    for m in finditer(regex, text):
        for g in range(1, regex.groups + 1):
            if m.group(g):
                yield from _name(text, m.start(g), m.end(g))


def _name(text: str, s: int, e: int) -> Iterator[Candidate]:
    words = text[s:e].split()
    while words and (len(words[-1]) <= 2 or words[-1].islower()):
        words.pop()  # trailing initial or particle
    if not words or words[0].strip("'\u2019") in _NOT_NAMES:
        return
    value = " ".join(words)
    if text[s : s + len(value)] != value:  # tabs or double spaces: keep the first word only
        value = words[0]
    for suffix in ("'s", "\u2019s"):
        if value.endswith(suffix):
            value = value[: -len(suffix)]
    yield Candidate(s, s + len(value), "PERSON", P_PERSON)


# ---- street addresses ---------------------------------------------------------------------------
_SUFFIX = (
    r"(?:Street|St|Avenue|Ave|Road|Rd|Lane|Ln|Drive|Dr|Boulevard|Blvd|Court|Ct|Way|Place|Pl"
    r"|Terrace|Ter|Circle|Cir|Parkway|Pkwy|Highway|Hwy|Square|Sq|Trail|Trl|Crescent|Close"
    r"|Row|Alley|Plaza|Loop|Path|Pike|Walk|Grove|Gardens|Heights|Hill|Park|Point|Ridge|View"
    r"|Mews|Wharf|Quay|Crossing|Isle|Fort|Union|Station|Port|Village|Turnpike|Expressway"
    r"|Freeway|Estate|Manor|Meadows?|Springs?|Valley|Vista|Lakes?|Landing|Mills?|Mount"
    r"|Orchard|Pass|Pines|Ranch|Shores?|Summit|Track|Trace|Vale|Ville|Wells?|Center|Centre"
    r"|Common|Corners?|Cove|Creek|Crest|Dale|Falls|Fields?|Flats?|Ford|Forest|Forks?|Garden"
    r"|Gateway|Glen|Green|Harbou?r|Haven|Island|Knolls?|Lodge|Oval|Route|Stream|Str)\b\.?"
)
_STREET_END = (
    r"(?:katu|tie|kuja|polku|raitti|vej|veien|vegen|gata|gatan|gade|stræde|straße|strasse"
    r"|str\.|weg|laan|straat|plein|gasse|allee|väg|vägen|utca|út|ulica|stræti|vegur|stig)"
)
_STREET_START = (
    r"(?:Rua|Via|Viale|Calle|Avenida|Av\.|Rue|Piazza|Corso|Camino|Travessa|Largo|Praça"
    r"|Carrer|Paseo|Plaza|Ulica|ul\.|Chaussée|Place|Vicolo|Strada|Rambla|Alameda)"
)
_W = r"[\p{Lu}\d][\p{L}\d'\x{2019}.\-]*"
_CORE = compile_re2(
    r"\b(?:\d{1,6}[A-Za-z]?[ \t]+(?:" + _W + r"[ \t]+){0,4}" + _SUFFIX + r"(?:[ \t]+\d{1,5}\b\.?)?"
    r"|(?:\d{1,6}[ \t]+)?\p{Lu}[\p{L}'\-]*(?:[ \t](?:út|utca|ulica|gata|gade|vej|Str\.)|"
    + _STREET_END
    + ")"
    + r"[ \t]+\d{1,5}[A-Za-z]?\b\.?"
    r"|(?:\d{1,6}[ \t]+)?(?:\d{1,3}[ \t]+)?"
    + _STREET_START
    + r"[ \t]+(?:[\p{L}'\x{2019}.\-]+[ \t]+){0,5}"
    r"\d{1,5}[A-Za-z]?\b"
    r"|(?i:p\.?[ \t]?o\.?[ \t]*box|psc|unit)[ \t]+\d{1,6}(?:,?[ \t]*(?i:box)[ \t]+\d{1,6})?"
    r"|(?:USNS|USS|USNV|USCGC)[ \t]+\p{Lu}\p{L}+)"
)
_UNIT = compile_re2(
    r"^[ \t]*,?[ \t\n>]*(?:Apt\.?|Apartment|Suite|Ste\.?|Unit|Flat|Floor|Fl\.?|#)[ \t]*[\w\-]{1,6}"
)
_UNIT_WORDS = ("Apt", "Apartment", "Suite", "Ste", "Unit", "Fl", "#")


def _unit(chunk: str) -> Match | None:
    """``_UNIT.search(chunk)``, ruled out in Python (no call into RE2) unless the first word
    after the blanks, comma and line breaks ``_UNIT`` skips is one of its unit words."""
    rest = chunk.lstrip(" \t")
    if rest.startswith(","):
        rest = rest[1:]
    if not rest.lstrip(" \t\n>").startswith(_UNIT_WORDS):
        return None
    found: Match | None = _UNIT.search(chunk)
    return found


_TAIL_PART = compile_re2(
    r"^(?:\p{Lu}[\p{L}'\x{2019}.\-]*(?:[ \t]+(?:\p{Lu}[\p{L}'\x{2019}.\-()]*|\(\p{L}+\))){0,3}"
    r"(?:[ \t]+\d{4,6}(?:-\d{4})?)?"
    r"|[A-Z]{2}(?:[ \t]+\d{5}(?:-\d{4})?)?|\d{4,6}(?:-\d{4})?"
    r"|(?:APO|FPO|DPO)[ \t]+A[AEP][ \t]+\d{5}"
    r"|nan(?:[ \t]+\d{4,6})?)\b"
)


def addresses(text: str, lower: str) -> Iterator[Candidate]:
    for m in finditer(_CORE, text):
        s, e = m.span()
        unit = _unit(text[e : e + 40])
        if unit:
            e += unit.end()
        e = _tail(text, e)
        yield Candidate(s, e, "ADDRESS", P_ADDRESS)


def _tail(text: str, e: int) -> int:
    """Extend over up to four short ', City' / '\\nCity' / ', ST 12345' parts."""
    for _ in range(4):
        i = e
        while i < len(text) and text[i] in " \t":
            i += 1
        if i >= len(text) or text[i] not in ",\n":
            return e
        i += 1
        while (i < len(text) and text[i] in " \t,>\n" and text[i - 1] != "\n") or (
            i < len(text) and text[i] in " \t,>"
        ):
            i += 1
        j = i
        while j < len(text) and text[j] not in ",\n" and j - i < 40:
            j += 1
        part = text[i:j].rstrip()
        found = _TAIL_PART.search(part) if _maybe_tail(part) else None
        if not found:
            return e
        e = i + found.end()
        if found.end() < len(part):
            return e
    return e


def _maybe_tail(part: str) -> bool:
    """False when ``_TAIL_PART`` cannot match (no call into RE2): each of its forms starts with
    an upper-case letter, a digit or "nan"; other ASCII first characters are ruled out."""
    first = part[:1]
    if not first:
        return False
    return not first.isascii() or first.isupper() or first.isdigit() or first == "n"

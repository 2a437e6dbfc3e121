"""The forms of a correction's values, and numbers said alone.

A correction seldom names what it corrects: "make that 3,100 rows" replaces
"sample size: 2,400 rows" because both values have one form (``9,9 rows``: the
digits blanked, the unit kept), "rebooked onto DL 1893" replaces "UA 512" (a code
before a number). :func:`form` is that form, ``None`` for a value too plain to
tell subjects apart; :func:`bare_numbers` reads a correction that states a number
and nothing else ("Actually, 16."). With :data:`CUES`, the words that say a
statement corrects another: they are not what a statement is about.
"""

from __future__ import annotations

import re

from ctxstore._local.fact_words import STOP
from ctxstore._local.shapes import values as spans

_FILLERS = frozenset(
    re.findall(r"\S+", "hmm hm oh ah well ok okay make it that say let lets do go with")
)
"""Words a bare correction is said with ("Hmm, make it 12.", "let's say 40")."""
CUES = frozenset(
    re.findall(
        r"\S+",
        "correcting correction corrected myself changes changed change things moving move"
        " switching switch changing actually wait sorry rechecking checking re mistake wrong"
        " earlier after all new direction update updated instead rather should now going"
        " let's lets scratch got previously formerly replaces replaced moved switched"
        " rebooked renamed",
    )
)
"""Words that say a statement corrects another, not what it is about."""


_URL = re.compile(r"[a-z][a-z0-9+.-]*://([^/\s]+)")
_MAIL = re.compile(r"[\w.+-]+@([\w-]+\.[\w.-]+)")
_FILE = re.compile(r"\w\.([a-z][a-z0-9]{0,4})$")
_CODE = re.compile(r"\b[A-Z]{1,5}\b")
_UNIT = re.compile(r"\s?([a-z]{1,12})\b", re.I)
_DISTINCT = re.compile(r"[^\W9_]|[$€£¥%@#]")
"""What makes a form tell subjects apart: a letter or a sign, not digits alone."""
BARE = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _bare_at(line: str, start: int, end: int) -> bool:
    """Whether the value at ``line[start:end]`` is a number alone, nothing to tell its subject by.

    No unit, sign or code, and no name before it ("March 21", "UA 512").
    """
    if not BARE.fullmatch(line[start:end]) or (start and line[start - 1] in "$€£¥#-+"):
        return False
    return form(line, start, end) is None and line[end : end + 1] != "%"


def bare_numbers(line: str) -> list[str] | None:
    """The numbers a line states when it says nothing else ("Make it 36."); else ``None``.

    Nothing else: no word but fillers and a correction's cues, so the number's
    subject can only be the one stated last ("the attendance is 7,204" has one).
    """
    found = value_spans(line)
    if not found or not all(_bare_at(line, a, b) for a, b in found):
        return None
    words = set(re.findall(r"[a-z]+", line.lower())) - STOP - CUES - _FILLERS
    return None if words else [line[a:b] for a, b in found]


_FILENAME = re.compile(r"(?<![\w./-])[\w-]{2,}\.[a-z][a-z0-9]{0,4}\b(?![./-]\w)")


def value_spans(line: str) -> list[tuple[int, int]]:
    """Where a line's values are, file names ("invoice.py") among them."""
    found = spans(line)
    taken = {i for a, b in found for i in range(a, b)}
    found += [m.span() for m in _FILENAME.finditer(line) if m.start() not in taken]
    return found


def forms(line: str) -> list[str | None]:
    """The forms of a line's values (see :func:`form`)."""
    return [form(line, start, end) for start, end in value_spans(line)]


def form(line: str, start: int, end: int) -> str | None:
    """The form of the value at ``line[start:end]``: what two values of one subject share.

    "$9,9" for "$15,000"; "9,9 rows" for "2,400 rows" (the unit after it); "A 9" for
    "UA 512" (a code before it); "url host" for a URL, "mail domain", "file .yaml",
    "v9.9.9". ``None`` for a form too plain to tell subjects apart ("17", a name).
    """
    value = line[start:end]
    low = value.lower()
    if found := _URL.match(low):
        return f"url {re.sub(r'[0-9]+', '9', found[1])}"
    if value.startswith("@"):
        return "@handle"
    if found := _MAIL.fullmatch(low):
        return f"mail {found[1]}"
    if found := _FILE.search(low):
        return f"file .{found[1]}"
    if "/" in value:
        return f"path {low.strip('/').split('/')[0]}"
    if re.fullmatch(r"[a-z]+(?:_[a-z]+)+", value):
        return "snake_case"
    core = _CODE.sub("A", re.sub(r"\d+", "9", value))
    before = line[:start].rstrip().rsplit(" ", 1)[-1]
    if _CODE.fullmatch(before):
        core = f"A {core}"
    elif before[:1].isupper() and before.isalpha():
        core = f"{before.lower()} {core}"
    unit = _UNIT.match(line, end)
    if unit and unit[1].lower() not in STOP:
        core = f"{core} {unit[1].lower()}"  # "10 MB" and "15 mb" are one form
    if "9" not in core or (not _DISTINCT.search(core) and core.count("9") < 3):
        return None
    return core


def same_form(found: str, wanted: set[str]) -> bool:
    """Whether a value's form is one of ``wanted``, a unit missing on either side aside.

    ("Postgres 13." and "Postgres 16 last sprint": "postgres 9" and "postgres 9 last").
    """
    for other in wanted:
        shorter, longer = sorted((found, other), key=len)
        if found == other or (
            shorter in (longer.rsplit(" ", 1)[0], longer.split(" ", 1)[-1])
            and _DISTINCT.search(shorter)
        ):
            return True
    return False

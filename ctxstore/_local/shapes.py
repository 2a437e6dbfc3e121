"""The shape of a sentence or a line: its wording with every value blanked out.

A conversation repeats the lines it is made of: a log prints one line per
event, a table one row per record, a tool one sentence per hit ("the DPA runs
to 26 pages", "the SOW runs to 33 pages"). What it says once is what someone
meant to say: a fact stated for a later turn. The shape of a unit is its text
with values (numbers, dates, identifiers, paths, quoted strings, names) turned
into ``#`` and punctuation dropped, so the units a template printed share one
shape, and :class:`ShapeCounts` counts how often each was seen: the ledger ranks a
fact from a shape seen many times as data, not as a fact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

__all__ = ["ShapeCounts", "shape", "values"]

_VALUE = re.compile(
    r"""
    (?P<key>(?<![^\s{,\[])"?[A-Za-z_][\w .-]{0,60}?"?(?=\s*[:=]\s))  # a key: its value's subject
    | [\w.+-]+@[\w-]+\.[\w.-]+                 # an email
    | [a-z][a-z0-9+.-]*://\S+                # a URL
    | `[^`]*`                                # code in backticks
    | "[^"]{0,80}"(?!\s*:)                   # a quoted string (not a JSON key: a subject)
    | \S*[\d/@_]\S*                          # a number, a path, an id, a snake_case name
    | (?<=[\w,;:(]\ )[A-Z][\w'&.-]*          # a capitalized word inside the text: a name
    | \b[A-Z]{2,}\b                          # an acronym, a code
    | \b[a-z]+[A-Z]\w*                       # camelCase
    """,
    re.VERBOSE,
)
_PUNCTUATION = re.compile(r"[^\w#]+")
_RUN = re.compile(r"#(?:\s*#)+")
_WORDS = 16
"""Words of a unit its shape keeps: a long unit is told from another by its start."""
_HEAD = 5
"""Words of a shape that make its head, counted too."""


@lru_cache(maxsize=8192)  # a tool's line is shaped when counted and when read
def shape(unit: str) -> str:
    """``unit`` with its values blanked (``#``), lower case, words only.

    >>> shape("The SOW-3 runs to 33 pages plus schedules.")
    'the # runs to # pages plus schedules'
    >>> shape("The Order Form 2 runs to 26 pages plus schedules.")
    'the # runs to # pages plus schedules'
    """
    blanked = _VALUE.sub(_blank, unit.strip())
    words = _PUNCTUATION.sub(" ", _RUN.sub("#", blanked).lower()).split()
    merged: list[str] = []
    for word in words[:_WORDS]:
        if not (word == "#" and merged and merged[-1] == "#"):
            merged.append(word)
    return " ".join(merged)


def values(unit: str) -> list[tuple[int, int]]:
    """Where ``unit``'s values are (what :func:`shape` blanks), as ``(start, end)`` spans.

    Punctuation that ends a sentence or a clause is not part of a value.
    """
    found = []
    for match in _VALUE.finditer(unit):
        if match["key"]:
            continue
        start, end = match.span()
        while end > start and unit[end - 1] in ".,;:!?)]'\"":
            end -= 1
        while start < end and unit[start] in "([":
            start += 1
        if end > start:
            found.append((start, end))
    return found


def _blank(match: re.Match[str]) -> str:
    key = match["key"]
    return key.replace("_", " ") if key else "#"


class ShapeCounts:
    """How often each shape was seen, bounded: the shapes seen once go first when it is full.

    Args:
        counts: Counts to start from (a saved state).
        limit: The most shapes kept.
    """

    def __init__(self, counts: dict[str, int] | None = None, limit: int = 4_000) -> None:
        self.counts: dict[str, int] = dict(counts or {})
        self._limit = limit

    def add(self, units: Iterable[str]) -> None:
        """Count each unit's shape once, and its head (a template may vary its last words)."""
        self.count(shape(unit) for unit in units)

    def count(self, keys: Iterable[str]) -> None:
        """Count shapes already made (:func:`shape`), and their heads."""
        counts = self.counts
        for key in keys:
            if key and key != "#":
                counts[key] = counts.get(key, 0) + 1
                head = _head(key)
                if head != key:
                    counts[head] = counts.get(head, 0) + 1
        if len(counts) > self._limit:
            # The repeated shapes are what tells data from facts: keep those first.
            kept = sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
            self.counts = dict(kept[: self._limit * 3 // 4])

    def seen(self, key: str) -> int:
        """How often shape ``key``, or one that starts as it does, was seen (0: never)."""
        return max(self.counts.get(key, 0), self.counts.get(_head(key), 0))


def _head(key: str) -> str:
    """The first words of a shape, a key of its own: a template may vary its last words.

    ``"no conflict between the # and the # on payment"`` and ``"... on notice"``
    are one template.
    """
    words = key.split(" ", _HEAD)
    return key if len(words) <= _HEAD else "^" + " ".join(words[:_HEAD])

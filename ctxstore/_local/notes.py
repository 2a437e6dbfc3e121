"""Notes: the sentences and lines a reader would underline, kept as written.

The ledger's typed reading (:mod:`ctxstore._local.facts`) keys what it recognises by
its subject ("batch size: 384"); a fact worded in a way it does not know
would be lost. A *note* is the sentence (or the line of a tool's output)
itself, clipped around its values, kept when it carries a value (a number, a
date, an identifier, a path, a name, code) and something in it says it
matters: a request to remember it ("keep it handy", "for the record"), the
form of a statement of fact ("the X is V", "X: V"), a decision, a
constraint, a preference, a correction, or an error someone reports. What a
template printed many times is not a note: the ledger ranks a note by its
shape (:mod:`ctxstore._local.shapes`) like every other fact.

Pure functions of the text: deterministic, no network.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ctxstore._local.entries import LedgerEntry
from ctxstore._local.fact_words import _CORRECTIVE, FactKind
from ctxstore._local.facts import _statement, _values, _was, clip, content, plain, signature
from ctxstore._local.shapes import values as spans

__all__ = ["ABOUT", "Note", "note"]

# Someone asks for this to be kept, or marks it as worth keeping.
_MEMORY = re.compile(
    r"\b(?:keep (?:it|this|that|these)? ?(?:handy|in mind|on file|around)|remember|don'?t forget"
    r"|for the record|worth (?:noting|recording|remembering|keeping)|to keep|make a note|take note"
    r"|note (?:that|down)|noting|noted|fyi|for your info(?:rmation)?|just so you know|heads[- ]up"
    r"|important|for reference|if (?:anyone|someone|they) asks?|you(?:'ll| will) need"
    r"|recorded|per (?:this|the|our) records?|on record|bookmark|jot (?:it|this) down"
    r"|for later|keep track)\b|^(?:note|nb|n\.b\.|reminder|important)\s*:",
    re.I,
)
# What people say beside a standing preference, decision or limit that the typed reading
# may not know ("works best for me", "we landed on", "that's firm").
_STATED = re.compile(
    r"\b(?:works? best for me|suits? me|i(?:'d| would)? like|i(?:'m| am) partial to|i favou?r"
    r"|(?:we|i) (?:landed|settled) on|our position|my recommendation|recommendation|sign[- ]?off"
    r"|in case it comes up|going forward|from now on|whenever|every time|new (?:plan|preference)"
    r"|(?:that|this|it)(?:'s| is) (?:the|our)\b"
    r"|policy|rule|ceiling|cap\b|hard (?:deadline|limit|stop)|firm|non-negotiable"
    r"|at the latest|no later than|targeting|target(?:ed)? (?:date|is)|due (?:on|by)"
    r"|(?:is|are) the (?:one|ones) (?:to|we)|sign(?:s|ed)? off|signatory|owner|point of contact"
    r"|our contact|the contact|in charge|responsible for|approved|confirmed"
    r"|how i (?:work|like)|(?:anything|everything) you send|when you (?:suggest|write|send|reply"
    r"|quote|show|give|report))\b",
    re.I,
)
# A later statement that replaces an earlier one.
_CHANGED = re.compile(
    r"(?<!for )(?<!right )(?<!just )(?<!by )(?<!until )(?<!to )\bnow\b"
    r"|\b(?:changed|previously|previous:|formerly|as amended|amended|new direction"
    r"|revised|update[ds]?:?|(?:that|this) changes|changes things|after all|no wait|should read"
    r"|on second thought|turns? out|make (?:that|it)|correcting|re-?checking|my mistake"
    r"|mis(?:spoke|read|typed|quoted)|going forward|re-?(?:booked|named|ran|measured)"
    r"|hand(?:ing|ed)(?: \S+)? (?:to|over|off)|slipped|pushed|rescheduled|postponed|delayed"
    r"|brought forward|redlined|raised|lowered|bumped|extended|shortened|corrected from"
    r"|(?:i'm|we're|i am|we are) (?:moving|switching|changing)"
    r"|the (?:right|correct|new) (?:one|value|figure|number|date)|no longer|any ?more"
    r"|correction|corrected|superseded|replaced|moved (?:to|from)|instead)\b",
    re.I,
)
# A fact's form: "the X is V", "X: V", "X = V", "X reads V".
_ASSERTED = re.compile(
    r"(?:^|\b(?:the|our|their|my|your|its)\s)[\w' -]{2,60}?\b(?:is|are|was|reads|equals"
    r"|comes (?:to|out at)|lands on|set (?:to|for)|stands at|should read|=)\s"
    r"|^[\w' .-]{2,40}(?::|\s=)\s*\S"
    r"|\b(?:gives?|lists?|shows?|records?|puts?)\b.{1,60}\bas\s"
    r"|\b(?:resolved|updated|set|changed|moved|bumped|pinned)\b.{1,60}\bto\s"
    r"|\b(?:using|use|used)\b.{1,40}\b(?:for|as)\s|\bis (?:at|in|under)\s",
    re.I,
)
_REPORTED = re.compile(
    r"\b(?:fail(?:s|ed|ing)? with|ended in|error(?:ed)?|exception|crash(?:ed|es)? with"
    r"|refused|rejected|timed? ?out|returns? (?:an? )?error)\b",
    re.I,
)
_CLIP = 200
"""The most characters a note keeps (around its values when the unit is longer)."""


class Note(NamedTuple):
    """A unit kept as written, and how much it says it matters."""

    entry: LedgerEntry  # its weight says how much it matters
    changed: bool  # it says it replaces something said before
    values: tuple[str, ...]  # the values it states, as written
    was: str | None = None  # the value it names as replaced ("(was X)", "rather than X")


def note(unit: str, *, user: bool, tool: bool = False) -> Note | None:
    """The note ``unit`` makes, or ``None`` when nothing in it says it matters.

    Args:
        unit: A sentence of a message, or a line of a tool's output.
        user: The user said it.
        tool: It is a line of a tool's output (a note there must say what it is).
    """
    text = " ".join(unit.strip(" \t-*>•").split())
    if len(text) < 6 or text.endswith("?"):
        return None  # a question states nothing for sure
    values = spans(text)
    kind = _statement(text)
    memory = bool(_MEMORY.search(text))
    stated = bool(_STATED.search(text))
    was = _was(text) or _cell_was(text) or _arrow_was(text)
    changed = bool(was or _CHANGED.search(text) or _CORRECTIVE.search(text))
    asserted = bool(_ASSERTED.search(text))
    reported = bool(_REPORTED.search(text))
    words = content(text)
    if not values and kind is None and not (stated and len(words) >= 4):
        return None
    if tool and not (memory or kind or stated or asserted or (was and values)):
        return None  # data: a line of output must say what it is (or what it replaced)
    weight = 4 * memory + 3 * (kind is not None or stated) + 3 * changed + 2 * reported
    weight += 2 * asserted + min(3, len(values)) + 2 * user
    if weight < _THRESHOLD and (tool or not values or len(words) < 3):
        return None  # a sentence that states a value is a note, if a weak one
    said = tuple(text[a:b] for a, b in values)
    if kind is None:
        kind = _kind_of(text, said, reported) if said else FactKind.DECISION
    entry = LedgerEntry(
        kind,
        signature(plain(words)),
        _clip(text, values),
        user=user,
        words=words,
        weight=weight,
        about=words[:ABOUT],
    )
    return Note(entry, changed, said, was)


ABOUT = 16
"""The most words of its sentence an entry keeps to be found by (:attr:`LedgerEntry.about`)."""

_WAS_CELL = re.compile(
    r"(?:^|\|)\s*(?:was|previously|formerly|old:?)\s+(?P<old>[^|]+?)\s*(?:\||$)", re.I
)


_ARROW = re.compile(r"(?P<old>[^\s(:,;]+(?: [^\s(:,;>-]+)?)\s*(?:->|→|=>)\s*\S")


def _arrow_was(text: str) -> str | None:
    """The old value of "X -> Y" ("01:15 UTC -> 03:45 UTC")."""
    found = _ARROW.search(text)
    return found["old"] if found and any(c.isalnum() for c in found["old"]) else None


def _cell_was(text: str) -> str | None:
    """The old value a table row names in a cell of its own ("| was X |")."""
    found = _WAS_CELL.search(text)
    return " ".join(found["old"].split()[:5]) if found else None


_THRESHOLD = 3
"""The weight a line of output needs to be a note: one that says what a value is ("owner:
X"); its shape tells whether a template printed it. A sentence of a message that states a
value is a note whatever its weight: the weight ranks it."""


def _kind_of(text: str, said: tuple[str, ...], reported: bool) -> FactKind:
    """The ledger section a note goes under, from what it says and the form of its values."""
    if reported:
        return FactKind.ERROR
    if any("/" in v or "://" in v for v in said):
        return FactKind.PATH
    if any(v.group == "date" for v in _values(text)):  # the typed reading's dates
        return FactKind.DATE
    if any(re.fullmatch(r"[$€£¥]?[\d.,]+%?", v) for v in said):
        return FactKind.NUMBER
    if any(re.search(r"\d|_|[a-z][A-Z]|^[A-Z0-9-]{3,}$", v) for v in said):
        return FactKind.IDENTIFIER
    return FactKind.NAME


def _clip(text: str, values: list[tuple[int, int]]) -> str:
    """``text`` clipped around its values when it is long."""
    if len(text) <= _CLIP or not values:
        return clip(text, _CLIP)
    start = max(0, values[0][0] - 80)
    end = min(len(text), max(values[-1][1], start) + 80)
    if end - start > _CLIP:
        end = start + _CLIP
    piece = text[start:end]
    if start:
        piece = "…" + piece.split(" ", 1)[-1]
    if end < len(text):
        piece = piece.rsplit(" ", 1)[0] + "…"
    return piece

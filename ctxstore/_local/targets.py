"""The entry a new statement restates or corrects: its target in the ledger.

A later statement may give a new value for a fact the ledger holds without
saying which ("Make it 36.", "the new limit is after 6:45 pm", "Correcting
myself: who signs off on the budget is R."). These lookups find it, by the old
value the statement names (:func:`holding`), by its subject
(:func:`same_subject`, :func:`noted_subject`), by the words either side of a
value, by the wording of the sentence it was read from, by a value of the same
form, or as the number stated last; :func:`duplicate` finds the entry a
statement only restates. They read the entries and change none but a restated
one; :class:`~ctxstore._local.ledger.Ledger` applies what they find.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ctxstore._local.entries import TASK, LedgerEntry, entry_line
from ctxstore._local.fact_words import STOP, TOKEN, FactKind
from ctxstore._local.facts import (
    ENTITIES,
    STATEMENTS,
    key_of,
    named,
    norm,
    plain,
    similar,
    valueish,
)
from ctxstore._local.notes import Note
from ctxstore._local.shapes import values as spans
from ctxstore._local.value_forms import (
    BARE,
    CUES,
    bare_numbers,
    form,
    forms,
    same_form,
    value_spans,
)

_CORRECTABLE = frozenset(FactKind) - {FactKind.TOOL, FactKind.ERROR, FactKind.REQUEST}


def noted_subject(entries: Mapping[str, LedgerEntry], found: Note, n: int) -> LedgerEntry | None:
    """The entry a note gives a new value for.

    The one holding the value it names as replaced, else the one whose
    subject's words it shares. A note that says it replaces something
    ("changed", "now") needs half the entry's subject, or failing that the
    words either side of a value, or most of the words of the sentence the
    entry was read from; one that does not, most of both subjects and the
    same kind of value: a later value for the same subject is the current
    one (but two rules alike are two rules).
    """
    new = found.entry
    if found.was:  # "(was X)", "rather than X": the entry holding X, if one does
        target = holding(entries, found.was, new)
        if target is not None and target.last != n:
            return target
    words = set(plain(new.words)) - STOP
    if len(words) < 2:  # "Make it 36.": only a number to go by
        return _bare(entries, new.value, n) if found.changed else None
    said = new.value.lower()
    best: tuple[int, int] | None = None
    chosen = None
    for entry in _earlier(entries, n):
        subject = (set(plain(entry.words)) | set(key_of(entry.pre).split())) - STOP
        shared = len(words & subject)
        if shared < 2 or 2 * shared < len(subject) or norm(entry.value) in said:
            continue
        if not found.changed and (
            entry.kind is not new.kind
            or new.kind in STATEMENTS  # "don't touch a.py", "... b.py": two rules
            or 5 * shared < 3 * len(subject | words)
        ):
            continue
        if best is None or (shared, entry.last) > best:
            best, chosen = (shared, entry.last), entry
    if chosen is None and found.changed:
        return (
            _framed(entries, found, n)
            or _worded(entries, found, n)
            or _alike(entries, forms(new.value), new.value, new.words, n)
            or _bare(entries, new.value, n)
        )
    return chosen


def _worded(entries: Mapping[str, LedgerEntry], found: Note, n: int) -> LedgerEntry | None:
    """The entry read from a sentence worded most like a note that says it changed.

    "Correcting myself: who signs off on the budget is R." replaces "Loop in A;
    they're who signs off on the budget": the words that are neither values,
    names nor the correction's own share at least three, or two that are most
    of the shorter sentence's.
    """
    new = found.entry
    words = _core(new.words, new.value)
    if len(words) < 2:
        return None
    said = new.value.lower()
    scored: list[tuple[tuple[int, int], LedgerEntry]] = []
    for entry in _earlier(entries, n):
        if norm(entry.value) in said:
            continue
        around = _core(entry.about or entry.words, entry_line(entry))
        around |= set(key_of(entry.pre).split())
        shared = len(words & around)
        most = shared >= 2 and 3 * shared >= 2 * min(len(words), len(around))
        whole = shared == len(around) >= 1  # "the warehouse is Redshift": all of it
        if shared >= 3 or most or whole:
            scored.append(((shared, entry.last), entry))
    return _best(scored)


def _framed(entries: Mapping[str, LedgerEntry], found: Note, n: int) -> LedgerEntry | None:
    """The latest entry stating a value in the same words as a note that says it changed.

    "the new limit is after 6:45 pm" replaces "don't call me after 6:15 pm":
    the value differs, the words either side of it do not.
    """
    frames = {f for v in found.values if (f := _frame(found.entry.value, v)) is not None}
    if not frames:
        return None
    said = found.entry.value.lower()
    for entry in sorted(_earlier(entries, n), key=lambda e: e.last, reverse=True):
        line = entry_line(entry)
        for start, end in spans(line):
            value = line[start:end]
            if value.lower() not in said and _frame(line, value) in frames:
                return entry
    return None


def holding(entries: Mapping[str, LedgerEntry], old: str, new: LedgerEntry) -> LedgerEntry | None:
    """The entry whose value a statement says it replaces ("instead of X")."""
    phrase = norm(old)
    pattern = re.compile(rf"(?<!\w){re.escape(phrase)}(?!\w)")
    # A distinct old value ("Ambergate Systems", "$764") is found in a line of any kind.
    distinct = 2 * any(valueish(w) or w[:1].isupper() for w in old.split())
    best: tuple[int, int] | None = None
    found = None
    for entry in entries.values():
        if entry.kind in (FactKind.TOOL, FactKind.ERROR) or not pattern.search(norm(entry.value)):
            continue
        # "a list" in "use a set instead of a list" must not overwrite any line with "list".
        score = 2 * (entry.kind is new.kind) + 2 * (norm(entry.value) == phrase) + distinct
        if score >= 2 and (best is None or (score, entry.last) > best):
            best, found = (score, entry.last), entry
    return found


def same_subject(
    entries: Mapping[str, LedgerEntry], new: LedgerEntry, marked: bool, n: int
) -> LedgerEntry | None:
    """The entry a statement restates or corrects by being about the same subject.

    ``marked``: the statement says it corrects something but not which value.
    """
    if new.kind in (FactKind.TOOL, FactKind.ERROR, FactKind.REQUEST):
        return None
    entry = entries.get(new.key)
    if entry is not None and not new.key.startswith("~") and entry.kind in _CORRECTABLE:
        return entry
    if new.kind in STATEMENTS:
        for entry in entries.values():
            if entry.kind is not new.kind or entry.key == TASK:
                continue
            # Alike but for a value, unmarked, is another fact: "don't touch a.py", "... b.py".
            if marked and similar(plain(new.words), plain(entry.words)) >= 0.34:
                return entry
    if marked and new.strong:  # "latency is 250 ms now" corrects "p95 latency: 230 ms"
        words = set(new.key.split())
        keyed = [
            e
            for e in entries.values()
            if e.kind in _CORRECTABLE
            and words <= set(e.key.split()) | set(key_of(e.pre).split()) | set(e.about)
        ]
        if keyed:
            return max(keyed, key=lambda e: e.last)
    if marked:  # "scratch that": the latest statement of its kind, if it is fresh
        recent = [e for e in entries.values() if e.kind is new.kind and e.last >= n - 4]
        overlap = [e for e in recent if (set(e.words) & set(new.words)) - STOP]
        if overlap:
            return max(overlap, key=lambda e: e.last)
        line = entry_line(new)
        return _alike(entries, forms(line), line, new.words, n) or _bare(entries, line, n)
    return None


def _bare(entries: Mapping[str, LedgerEntry], said: str, n: int) -> LedgerEntry | None:
    """The latest fresh entry stating one number, for a correction that states only one.

    "Make it 36." (after "let's book 30"), "Actually, 16." (after "cap the
    workers at 8"): a number with nothing around it to tell its subject by
    corrects the number stated last, within the last few messages.
    """
    values = bare_numbers(said)
    if not values:
        return None
    fresh = [
        e
        for e in _earlier(entries, n)
        if e.last >= n - 4
        and sum(1 for a, b in value_spans(e.value) if BARE.fullmatch(e.value[a:b])) == 1
        and not any(v in entry_line(e) for v in values)
    ]
    return max(fresh, key=lambda e: e.last) if fresh else None


def _alike(
    entries: Mapping[str, LedgerEntry],
    forms: Sequence[str | None],
    said: str,
    words: list[str],
    n: int,
) -> LedgerEntry | None:
    """The entry stating a value of the same form as a correction's.

    "Make that 3,100 rows" corrects "sample size: 2,400 rows"; "rebooked onto
    DL 1893", "UA 512". Of those, the one sharing most words with it, then the
    latest.
    """
    wanted = {f for f in forms if f}
    if not wanted:
        return None
    lowered, mine = said.lower(), set(plain(words)) - STOP - CUES
    found: list[tuple[tuple[int, int], LedgerEntry]] = []
    for entry in _earlier(entries, n):
        line = f"{entry.pre}{entry.value}{entry.post}"
        if any(
            (shaped := form(line, start, end)) is not None
            and same_form(shaped, wanted)
            and line[start:end].lower() not in lowered
            for start, end in value_spans(line)
        ):
            shared = len(mine & set(plain(entry.about or entry.words)))
            found.append(((shared, entry.last), entry))
    return _best(found)


def _earlier(entries: Mapping[str, LedgerEntry], n: int) -> list[LedgerEntry]:
    """The entries a statement of message ``n`` may correct.

    Not the task, a tool's record or an error, and nothing message ``n`` itself
    stated or corrected already.
    """
    return [e for e in entries.values() if e.kind in _CORRECTABLE and e.key != TASK and e.last != n]


def duplicate(entries: Mapping[str, LedgerEntry], new: LedgerEntry) -> LedgerEntry | None:
    """The entry a statement only restates, merged with what it adds; else ``None``.

    The same value (keyed alike, or two entities), or a statement of the same
    kind worded alike: one with other values lists them on the entry's line.
    """
    for entry in entries.values():
        if entry.kind is FactKind.TOOL:
            continue
        if norm(entry.value) == norm(new.value):
            if entry.key == new.key or {new.kind, entry.kind} <= ENTITIES:
                if new.strong and not entry.strong and entry.kind in ENTITIES:
                    entry.pre, entry.strong = new.pre, True  # now we know whose it is
                return entry
        elif new.kind in STATEMENTS and entry.kind is new.kind and _template(new, entry):
            # "Don't touch a.py for now" and "... b.py for now": one line, values listed.
            values = [w for w in TOKEN.findall(new.value) if valueish(w) and w not in entry.value]
            entry.more = [v for v in entry.more if v not in values][-8:] + values
            return entry
        elif new.kind in STATEMENTS and entry.kind is new.kind:
            # A request is the same one whatever it names ("check why X is slow").
            request = new.kind is FactKind.REQUEST
            words = [plain(e.words) if request else e.words for e in (new, entry)]
            if similar(*words) >= 0.75:
                return entry
    return None


def _best(scored: list[tuple[tuple[int, int], LedgerEntry]]) -> LedgerEntry | None:
    """The entry of the highest score (the first of equals), or ``None``."""
    return max(scored, key=lambda pair: pair[0])[1] if scored else None


def _core(words: list[str], text: str) -> set[str]:
    """What a sentence is about: its words but values, names, function words and cues."""
    return set(plain(words)) - STOP - CUES - named(text)


def _frame(text: str, value: str) -> tuple[str, str] | None:
    """The words either side of ``value`` in ``text`` ("after", "pm"); ``None`` when bare."""
    found = re.search(rf"(\w+)\W+{re.escape(value)}\W+(\w+)", text)
    if found is None:
        return None
    before, after = found[1].lower(), found[2].lower()
    return None if before in STOP and after in STOP else (before, after)


def _template(new: LedgerEntry, old: LedgerEntry) -> bool:
    """Whether two statements are worded alike and differ only in their values."""
    values = [w for w in new.words if valueish(w)]
    return bool(values) and similar(plain(new.words), plain(old.words)) >= 0.8

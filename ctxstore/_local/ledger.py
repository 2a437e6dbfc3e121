"""The ledger: a conversation's facts, folded message by message.

:class:`Ledger` reads each message (:mod:`ctxstore._local.turns`) into facts and
notes and folds them into its entries, keyed by subject: a later value for the
same subject overwrites the entry and keeps the old one beside it, a
restatement counts as a reference, a correction also drops the other lines that
still state the value it replaced. Which entry a statement corrects is found by
:mod:`ctxstore._local.targets`. It also keeps each tool's record (calls,
failures, the last outcomes) and the calls awaiting results, and tells the
open stretch of the narrative what was noted. Its state travels as JSON
(:meth:`Ledger.dump`, :meth:`Ledger.load`) between folds.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields
from functools import lru_cache
from typing import Any

from ctxstore._local.entries import (
    KINDS,
    REPEATED,
    TASK,
    LedgerEntry,
    entry_line,
    eviction_rank,
)
from ctxstore._local.fact_words import STOP, TOKEN, FactKind
from ctxstore._local.facts import (
    ENTITIES,
    STATEMENTS,
    Fact,
    clip,
    content,
    first_sentence,
    is_request,
    named,
    norm,
    signature,
    similar,
    statements,
)
from ctxstore._local.narrative import Story
from ctxstore._local.notes import ABOUT, Note, note
from ctxstore._local.shapes import ShapeCounts, shape
from ctxstore._local.targets import duplicate, holding, noted_subject, same_subject
from ctxstore._local.turns import OUTCOME, failure, notes, outcome, reported, turn
from ctxstore._local.value_forms import BARE, CUES, bare_numbers, value_spans

_FIELDS = tuple(f.name for f in fields(LedgerEntry))
_MAX_ENTRIES = 400  # bounds the state; far more than a ledger's budget can show
_SHAPED_LINES = 400  # lines of a tool result whose shapes are counted
_TOLD = 5  # the weight a note needs for the narrative to tell it (``notes``)
_NOTES_PER_RESULT = 12  # the most notes one tool result gives
_FAILED = 6  # the weight of a failure a tool's result reports


class Ledger:
    """The entries, the tools' records and the calls awaiting results, folded message by message."""

    def __init__(self) -> None:
        self.entries: dict[str, LedgerEntry] = {}
        self.tools: dict[str, list[Any]] = {}  # tool -> [calls, failed, [[args, outcome], ...]]
        self.pending: dict[str, list[str]] = {}  # call id -> [tool, args]
        self.seen = 0  # messages folded so far: the next one's ordinal
        self.asked = 0  # user requests seen (the first is the task)
        self.shapes = ShapeCounts()  # how often each sentence's and line's shape was seen

    def fold(self, message: dict[str, Any], story: Story) -> None:
        """Fold one message into the entries and into the open stretch of ``story``."""
        n, self.seen = self.seen, self.seen + 1
        said = turn(message)
        if said is None:
            return
        if said.role in ("user", "assistant") and said.text:
            self._read(said.text, said.role == "user", n, story)
        for call_id, tool, arguments in said.calls:
            self.pending[call_id] = [tool, arguments]
        for call_id, output, flagged in said.results:
            self.shapes.add(output.splitlines()[:_SHAPED_LINES])
            self._result(call_id, output, flagged, n, story)
        # A long output's head says what it is about; scanning all of it costs more than it tells.
        mentions = [said.text, *(r[1][:4000] for r in said.results), *(c[2] for c in said.calls)]
        self._mentioned("\n".join(mentions).lower(), n)

    def _read(self, text: str, user: bool, n: int, story: Story) -> None:
        said = list(statements(text))
        shaped = [shape(sentence) for sentence, _ in said]
        self.shapes.count(shaped)
        noted: list[Note | None] = []
        for (sentence, facts), form in zip(said, shaped, strict=True):
            found = note(sentence, user=user)
            noted.append(found)
            if found is not None:
                found.entry.shape = form
            about = content(sentence)[:ABOUT]
            for fact in facts:
                fact.entry.shape, fact.entry.about = form, about
                fact.entry.weight = found.entry.weight if found else 0
        request = None
        task = user and self.asked == 0
        if user:
            # A sentence that states facts is kept as those facts, which a correction updates.
            asks = (clip(s, 200) for s, facts in said if not facts and is_request(s))
            request = next(asks, None)
            story.begin(request or first_sentence(text))
            if self.asked == 0:
                request = clip(first_sentence(text), 200)  # the first message states the task
            if request:
                words = content(request)
                key = TASK if self.asked == 0 else signature(words)
                self.asked += 1
                entry = LedgerEntry(FactKind.REQUEST, key, request, user=True, words=words)
                self.add(Fact(entry, None, False), n)
        asked = {request} | ({clip(first_sentence(text), 200)} if task else set())
        for (sentence, facts), found in zip(said, noted, strict=True):
            for fact in facts:
                fact.entry.user = user
                self.add(fact, n, story)
            if clip(sentence, 200) in asked:
                continue  # the request is its own entry
            if found is None:
                continue
            if not (facts and self._covered(found, n)):
                self.note(found, n, story)
            elif found.changed and (target := noted_subject(self.entries, found, n)) is not None:
                # Read as a fact of its own, yet it says it replaces another: that one goes,
                # and so does a statement of this sentence the note now says whole.
                self._replace(target, found, n, story)
                whole = norm(found.entry.value)
                for stated in (fact.entry for fact in facts if fact.entry is not target):
                    held = self.entries.get(stated.key) is stated
                    if held and stated.kind in STATEMENTS and norm(stated.value) in whole:
                        del self.entries[stated.key]

    def _result(self, call_id: str, output: str, flagged: bool, n: int, story: Story) -> None:
        tool, arguments = self.pending.pop(call_id, ["a tool", ""])
        error = failure(output, flagged)
        ended = "failed" if error else outcome(output)  # the error has a line of its own
        story.ran(tool, arguments, ended)
        calls, failed, recent = self.tools.get(tool, [0, 0, []])
        recent = [*[r for r in recent if r[0] != arguments][-1:], [arguments, ended]]
        calls, failed = calls + 1, failed + bool(error)
        self.tools[tool] = [calls, failed, recent]
        shown = "; ".join(f"{a} → {o}" if a else o for a, o in recent)
        tally = f"{calls} call{'s' * (calls > 1)}" + (f", {failed} failed" if failed else "")
        key = f"tool:{tool}"
        entry = self.entries.setdefault(
            key, LedgerEntry(FactKind.TOOL, key, "", f"{tool}: ", first=n)
        )
        entry.value, entry.last = clip(f"{tally}; {shown}", 160), n
        entry.strong = bool(error) or bool(OUTCOME.search(ended))
        label = f"{tool}({arguments}): " if arguments else f"{tool}: "
        for said in dict.fromkeys([error, *reported(output)] if error else reported(output)):
            key = "error:" + re.sub(r"\d+|0x[0-9a-f]+", "#", said.lower())  # the same error again
            entry = LedgerEntry(FactKind.ERROR, key, said, label, strong=True, words=content(said))
            entry.weight = _FAILED  # a tool failed: it says so itself
            self.add(Fact(entry, None, False), n, story)
        # What a template printed (its shape seen often, in this output or before) is
        # data; of the rest, the weightiest few notes are kept: an output is mostly data.
        read = [f for f in notes(output) if self.shapes.seen(f.entry.shape) < REPEATED]
        kept = sorted((f for f in read if isinstance(f, Note)), key=lambda f: -f.entry.weight)
        for found in [f for f in read if not isinstance(f, Note)] + kept[:_NOTES_PER_RESULT]:
            if isinstance(found, Note):
                self.note(found, n, story)
            else:
                self.add(found, n, story)

    def add(self, fact: Fact, n: int, story: Story | None = None) -> None:
        """Fold one fact stated at message ``n``: correct, restate, merge or add an entry."""
        new = fact.entry
        if fact.was and norm(new.value) in norm(fact.was):
            return  # "orders:v1.5.0 (was orders:v1.4.2)" reads "v1.4.2" too: that is the old one
        new.first = new.last = n
        new.words = new.words[:12]
        target = holding(self.entries, fact.was, new) if fact.was else None
        old = fact.was if target is not None else None  # named as replaced: a correction
        if fact.was and target is None:
            new.old = [fact.was]  # "from 30s to 60s" with no 30s on record yet
        target = target or same_subject(self.entries, new, fact.marked and not fact.was, n)
        if target is not None and (old or not _restates(new, target)):
            if not (old or fact.marked) and not _qualified_alike(target, new):
                # Keyed alike, qualified apart ("frontend ... port 3000", "backend ... port
                # 8000"): two facts, one line; neither value is said to replace the other.
                target.more = [v for v in target.more if v != target.value][-8:]
                target.more.append(target.value)
                target.value, target.last = new.value, n
                return
            if fact.marked and not (old or new.strong) and self._renumber(target, new.value, n):
                return  # "Actually, 16.": the number is all it says, the subject is the entry's
            target.fixed = target.fixed or bool(old) or fact.marked
            old = old or _replaced(target, new)
            self._correct(target, new, old, n)
            self._sweep(target, old)
            if story is not None:
                story.note(self.rank(target)[1], entry_line(target))
            return
        target = target or duplicate(self.entries, new)
        if target is not None:
            target.refs, target.last, target.user = target.refs + 1, n, target.user or new.user
            return
        if new.key in self.entries:  # worded like another statement, yet different
            new.key = f"{new.key}={norm(new.value)}"
        self.entries[new.key] = new
        if story is not None:
            story.note(self.rank(new)[1], entry_line(new))
        if len(self.entries) > _MAX_ENTRIES:
            del self.entries[min(self.entries.values(), key=self.rank).key]

    def note(self, found: Note, n: int, story: Story | None = None) -> None:
        """Fold a note: as a new entry, or over the entry it says it replaces."""
        target = noted_subject(self.entries, found, n)
        if target is None:
            # A weak note (a value said in passing) is kept for a large level, not told.
            told = story if found.entry.weight >= _TOLD else None
            self.add(Fact(found.entry, None, False), n, told)
        else:
            self._replace(target, found, n, story)

    def _replace(self, target: LedgerEntry, found: Note, n: int, story: Story | None) -> None:
        """Overwrite ``target`` with a note, keeping the values it loses as (was X)."""
        new = found.entry
        if self._renumber(target, new.value, n):
            if story is not None:
                story.note(self.rank(target)[1], entry_line(target))
            return
        gone = [v for v in named(entry_line(target)) if v not in new.value.lower()]
        # Shown without a sentence's full stop; swept as named ("anika." is not "Anika Rautio").
        old = ", ".join(v.rstrip(".,;:!?") for v in gone[:3]) if gone else clip(target.value, 60)
        target.fixed = True
        self._correct(target, new, old, n)
        target.kind, target.weight, target.shape = new.kind, new.weight, new.shape
        for value in gone or [old]:
            self._sweep(target, value)
        if story is not None:
            story.note(self.rank(target)[1], entry_line(target))

    def _covered(self, found: Note, n: int) -> bool:
        """Whether the entries message ``n`` wrote state every value a note of it does."""
        lines = " ".join(entry_line(e) for e in self.entries.values() if e.last == n).lower()
        return all(v.lower() in lines for v in found.values)

    def rank(self, entry: LedgerEntry) -> tuple[bool, int, int, str]:
        """Eviction order, worst first (:func:`eviction_rank`), a templated line's facts last."""
        return eviction_rank(entry, self.shapes.seen(entry.shape) if entry.shape else 0)

    def _renumber(self, target: LedgerEntry, said: str, n: int) -> bool:
        """Give ``target`` the one bare number a correction states, in its own words.

        "Make it 36." over "seats to book: 30" reads "seats to book: 36 (was 30)".
        False (nothing changed) unless the correction states one number and nothing
        else, and the entry one number (its unit stays: "Reserve 24 chairs (was 20)").
        """
        said_values = bare_numbers(said)
        spots = [(a, b) for a, b in value_spans(target.value) if BARE.fullmatch(target.value[a:b])]
        if said_values is None or len(said_values) != 1 or len(spots) != 1:
            return False
        (a, b), value = spots[0], target.value
        old = value[a:b]
        target.old = [o for o in target.old if o != said_values[0]] + [old]
        target.value = value[:a] + said_values[0] + value[b:]
        target.fixed, target.last = True, n
        self._sweep(target, old)
        return True

    def _correct(self, target: LedgerEntry, new: LedgerEntry, old: str, n: int) -> None:
        target.old = [o for o in target.old if norm(o) != norm(new.value)] + [old]
        if KINDS[new.kind][1] > KINDS[target.kind][1] or target.kind not in STATEMENTS:
            target.kind = new.kind
        target.value, target.pre, target.post = new.value, new.pre, new.post
        target.words, target.user, target.last = new.words, target.user or new.user, n

    def _sweep(self, target: LedgerEntry, old: str) -> None:
        """Drop other lines that still state a replaced value; the task says what replaced it."""
        pattern = re.compile(rf"(?<!\w){re.escape(old.lower())}(?!\w)")
        distinct = not re.fullmatch(r"[\d.,]{1,4}", old)  # "512" alone may be anything
        unit = re.search(r"(?<![\w:.,])[\d.,]+\s?([a-z]{1,12})\b", target.value.lower())
        if not distinct and unit and unit[1] not in STOP:  # "230 ms" is, beside "310 ms"
            pattern = re.compile(rf"(?<![\w:.,]){re.escape(old.lower())}\s?{unit[1]}\b")
            distinct = True
        for entry in list(self.entries.values()):
            line = entry_line(entry).lower()
            if entry is target or entry.kind in (FactKind.TOOL, FactKind.ERROR):
                continue
            # A line that names the old value as its subject ("Figma seats left: 14") states
            # another fact; one that states it (in its value, or a note's text) goes.
            subject = pattern.search(entry.pre.lower()) and not pattern.search(entry.value.lower())
            if pattern.search(line) and not subject and (distinct or target.key in line):
                if entry.key == TASK:
                    entry.post = f" (now {_gist(target, old)})"
                else:
                    del self.entries[entry.key]

    def _mentioned(self, text: str, n: int) -> None:
        """Count a reference for each earlier entry this message names by key or value."""
        for entry in self.entries.values():
            if entry.last < n:
                for anchor in _anchors(entry.kind, entry.key, entry.value, entry.strong):
                    if anchor in text:
                        entry.refs += 1
                        break

    def dump(self, story: Story) -> str:
        """The state to carry to the next fold, as JSON."""
        entries = [{f: getattr(e, f) for f in _FIELDS} for e in self.entries.values()]
        state = {"v": 1, "seen": self.seen, "asked": self.asked, "entries": entries}
        state["shapes"] = self.shapes.counts
        pending = dict(list(self.pending.items())[-64:])  # calls whose results never came
        state |= {"tools": self.tools, "pending": pending, "open": story.open()}
        return json.dumps(state, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def load(cls, state: str, story: Story) -> Ledger | None:
        """The ledger a :meth:`dump` saved (its open stretch into ``story``), else None."""
        try:
            data = json.loads(state)
            ledger = cls()
            for item in data["entries"]:
                entry = LedgerEntry(**{**item, "kind": FactKind(item["kind"])})
                ledger.entries[entry.key] = entry
            ledger.tools, ledger.pending = dict(data["tools"]), dict(data["pending"])
            ledger.seen, ledger.asked = int(data["seen"]), int(data["asked"])
            ledger.shapes = ShapeCounts({str(k): int(v) for k, v in data.get("shapes", {}).items()})
            story.reopen(data["open"])
        except (ValueError, KeyError, TypeError):
            return None
        return ledger


def _qualified_alike(old: LedgerEntry, new: LedgerEntry) -> bool:
    """Whether two facts keyed alike come from sentences about the same thing.

    "The frontend runs on port 3000" and "the backend runs on port 8000", or "Q1
    revenue" and "Q2 revenue", share a key but each has a word the other lacks:
    two facts. The words compared are the sentences' but each fact's key and value;
    a later sentence that only says less ("port: 8080") restates the same one.
    """
    if not old.about or not new.about:
        return True

    def qualifiers(entry: LedgerEntry) -> set[str]:
        value, key = norm(entry.value), set(entry.key.split())
        words = {w for w in entry.about if w not in value and w not in key} - CUES
        return {w for w in words if not re.fullmatch(r"[\d.,:]+", w)}  # "9:30" beside "Tuesday"

    mine, theirs = qualifiers(old), qualifiers(new)
    return not (mine - theirs and theirs - mine)  # each says what the other does not


@lru_cache(maxsize=8192)
def _anchors(kind: FactKind, key: str, value: str, strong: bool) -> tuple[str, ...]:
    """What a later message says when it refers to an entry: its subject or a distinct value."""
    found = []
    if strong and len(key) >= 4 and not key.startswith(("~", "tool:", "error:")) and key != TASK:
        found.append(key)
    lowered = value.lower()
    distinct = kind in ENTITIES or (kind is FactKind.NUMBER and re.search(r"\d{3}|,|\s", lowered))
    if distinct and len(lowered) >= 4:  # "16" or "ok" would match everywhere
        found.append(lowered)
    return tuple(found)


def _restates(new: LedgerEntry, old: LedgerEntry) -> bool:
    """Whether ``new`` says what ``old`` said (a statement may add to it, naming all it named)."""
    if norm(new.value) == norm(old.value):
        return True
    if new.kind not in STATEMENTS or old.pre:
        return False
    names = named(old.value)
    return (bool(names) and names <= named(new.value)) or similar(new.words, old.words) >= 0.75


def _replaced(target: LedgerEntry, new: LedgerEntry) -> str:
    """How the value a correction overwrites is shown beside the new one."""
    if target.kind not in STATEMENTS or target.pre:
        return target.value
    lowered = new.value.lower()
    gone = [w for w in TOKEN.findall(target.value)[1:] if w.lower() not in lowered]
    gone = [w for w in gone if w.lower() not in STOP]
    shown = [w for w in gone if w.lower() in named(target.value)] or gone[:4]
    return " ".join(shown) if shown else clip(target.value, 60)


def _gist(entry: LedgerEntry, old: str) -> str:
    """An entry's new value in a few words: a statement's names and values but the ``old``."""
    if entry.pre or entry.kind not in STATEMENTS:
        return entry.value
    gone = {w.lower() for w in TOKEN.findall(old)}
    names = [w for w in TOKEN.findall(entry.value) if w.lower() in named(entry.value) - gone]
    return " ".join(names[:4]) or clip(entry.value, 40)

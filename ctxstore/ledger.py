"""The local summarizer: a facts ledger and a narrative, offline and deterministic.

The local summarizer (:class:`LocalSummarizer`) folds a conversation's turns into two levels:

- the **ledger**, one line per fact a later turn may need, grouped by kind
  (the task and requests, constraints, decisions, preferences, identifiers,
  numbers, names, dates, paths, tool errors, tool outcomes). Each fact is
  keyed by its subject: a later value for the same subject overwrites it and
  keeps the old one beside it (``batch size: 384 (was 512)``); a restatement
  counts as a reference instead of a new line. Over budget, the facts of the
  lowest kinds that were referred to least go first, never by age; the first
  statement of the task stays.
- the **narrative**, one bullet per stretch of the conversation (what was
  asked, which tools ran and how they ended, what was noted), the oldest
  shrunk first.

Facts are read by regexes and heuristics, no network and no model: from prose
by :mod:`ctxstore._facts`, from messages and tool results by
:mod:`ctxstore._turns`; the narrative is :mod:`ctxstore._narrative`. The
entries travel in :attr:`Summary.state` between folds, so folding in batches
gives the ledger one pass would. With no state (a text this summarizer or
another wrote), the previous ledger is read back line by line.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import fields
from functools import lru_cache
from typing import Any

from ctxstore._fact_words import BULLET, STOP, TOKEN
from ctxstore._facts import (
    ENTITIES,
    STATEMENTS,
    Entry,
    Fact,
    Kind,
    clip,
    content,
    first_sentence,
    is_request,
    key_of,
    named,
    norm,
    plain,
    signature,
    similar,
    statements,
    valueish,
)
from ctxstore._narrative import NARRATIVE, Story, fit_narrative
from ctxstore._notes import ABOUT, Note, note
from ctxstore._shapes import Shapes, shape
from ctxstore._shapes import values as spans
from ctxstore._turns import OUTCOME, failure, notes, outcome, reported, turn
from ctxstore.models import Summary
from ctxstore.tokens import TiktokenCounter, TokenCounter

__all__ = ["HEADER", "MORE", "NARRATIVE", "LocalSummarizer"]

HEADER = 'Ledger (current values; "was" marks a replaced one):'
"""The ledger's first line; it tells this summarizer's text from another's."""
MORE = "More facts (referred to less):"
"""The first line of the facts level 2 adds to the ledger."""
_MORE_SHARE = 0.6
"""Of what level 2 adds to the ledger, the most its further facts take; the narrative
has the rest (and what they leave)."""


# Heading and eviction weight, in render order: constraints and decisions outrank
# everything else, requests outrank what tools said, errors outrank plain entities.
_KINDS: dict[Kind, tuple[str, int]] = {
    Kind.REQUEST: ("Requests", 3),
    Kind.CONSTRAINT: ("Constraints", 10),
    Kind.DECISION: ("Decisions", 9),
    Kind.PREFERENCE: ("Preferences", 8),
    Kind.IDENTIFIER: ("Identifiers", 6),
    Kind.NUMBER: ("Numbers", 6),
    Kind.NAME: ("Names", 5),
    Kind.DATE: ("Dates", 6),
    Kind.PATH: ("Paths", 5),
    Kind.ERROR: ("Errors", 7),
    Kind.TOOL: ("Tools", 2),
}
_HEADINGS = {f"{heading}:": kind for kind, (heading, _) in _KINDS.items()}
_CORRECTABLE = frozenset(Kind) - {Kind.TOOL, Kind.ERROR, Kind.REQUEST}
_ATTRIBUTES = ENTITIES | {Kind.NUMBER}
_FIELDS = tuple(f.name for f in fields(Entry))
TASK = "task"  # the key of the first request, which is never evicted
_MAX_ENTRIES = 400  # bounds the state; far more than a ledger's budget can show
_SHAPED_LINES = 400  # lines of a tool result whose shapes are counted
_REPEATED = 3  # a shape seen this often is a template's: what it says is data
_TEMPLATED = 12  # how far that sinks its facts' rank (a constraint weighs 10)
_TOLD = 5  # the weight a note needs for the narrative to tell it (``_notes``)
_NOTES_PER_RESULT = 12  # the most notes one tool result gives
_FAILED = 6  # the weight of a failure a tool's result reports
# The old LocalSummarizer's lines ("- Decisions: user: ..."), read when folding its summary.
_LEGACY = re.compile(r"^(Decisions|Errors|Facts|Requests|Tools): (?:(?:user|assistant): )?(.*)$")


class _Ledger:
    """The entries, the tools' records and the calls awaiting results, folded message by message."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.tools: dict[str, list[Any]] = {}  # tool -> [calls, failed, [[args, outcome], ...]]
        self.pending: dict[str, list[str]] = {}  # call id -> [tool, args]
        self.seen = 0  # messages folded so far: the next one's ordinal
        self.asked = 0  # user requests seen (the first is the task)
        self.shapes = Shapes()  # how often each sentence's and line's shape was seen

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
                entry = Entry(Kind.REQUEST, key, request, user=True, words=words)
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
            elif found.changed and (target := self._noted_subject(found, n)) is not None:
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
        entry = self.entries.setdefault(key, Entry(Kind.TOOL, key, "", f"{tool}: ", first=n))
        entry.value, entry.last = clip(f"{tally}; {shown}", 160), n
        entry.strong = bool(error) or bool(OUTCOME.search(ended))
        label = f"{tool}({arguments}): " if arguments else f"{tool}: "
        for said in dict.fromkeys([error, *reported(output)] if error else reported(output)):
            key = "error:" + re.sub(r"\d+|0x[0-9a-f]+", "#", said.lower())  # the same error again
            entry = Entry(Kind.ERROR, key, said, label, strong=True, words=content(said))
            entry.weight = _FAILED  # a tool failed: it says so itself
            self.add(Fact(entry, None, False), n, story)
        # What a template printed (its shape seen often, in this output or before) is
        # data; of the rest, the weightiest few notes are kept: an output is mostly data.
        read = [f for f in notes(output) if self.shapes.seen(f.entry.shape) < _REPEATED]
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
        target = self._holding(fact.was, new) if fact.was else None
        old = fact.was if target is not None else None  # named as replaced: a correction
        if fact.was and target is None:
            new.old = [fact.was]  # "from 30s to 60s" with no 30s on record yet
        target = target or self._same_subject(new, fact.marked and not fact.was, n)
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
                story.note(self.rank(target)[1], _line(target))
            return
        target = target or self._duplicate(new)
        if target is not None:
            target.refs, target.last, target.user = target.refs + 1, n, target.user or new.user
            return
        if new.key in self.entries:  # worded like another statement, yet different
            new.key = f"{new.key}={norm(new.value)}"
        self.entries[new.key] = new
        if story is not None:
            story.note(self.rank(new)[1], _line(new))
        if len(self.entries) > _MAX_ENTRIES:
            del self.entries[min(self.entries.values(), key=self.rank).key]

    def note(self, found: Note, n: int, story: Story | None = None) -> None:
        """Fold a note: as a new entry, or over the entry it says it replaces."""
        target = self._noted_subject(found, n)
        if target is None:
            # A weak note (a value said in passing) is kept for a large level, not told.
            told = story if found.entry.weight >= _TOLD else None
            self.add(Fact(found.entry, None, False), n, told)
        else:
            self._replace(target, found, n, story)

    def _replace(self, target: Entry, found: Note, n: int, story: Story | None) -> None:
        """Overwrite ``target`` with a note, keeping the values it loses as (was X)."""
        new = found.entry
        if self._renumber(target, new.value, n):
            if story is not None:
                story.note(self.rank(target)[1], _line(target))
            return
        gone = [v for v in named(_line(target)) if v not in new.value.lower()]
        # Shown without a sentence's full stop; swept as named ("anika." is not "Anika Rautio").
        old = ", ".join(v.rstrip(".,;:!?") for v in gone[:3]) if gone else clip(target.value, 60)
        target.fixed = True
        self._correct(target, new, old, n)
        target.kind, target.weight, target.shape = new.kind, new.weight, new.shape
        for value in gone or [old]:
            self._sweep(target, value)
        if story is not None:
            story.note(self.rank(target)[1], _line(target))

    def _covered(self, found: Note, n: int) -> bool:
        """Whether the entries message ``n`` wrote state every value a note of it does."""
        lines = " ".join(_line(e) for e in self.entries.values() if e.last == n).lower()
        return all(v.lower() in lines for v in found.values)

    def _noted_subject(self, found: Note, n: int) -> Entry | None:
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
            target = self._holding(found.was, new)
            if target is not None and target.last != n:
                return target
        words = set(plain(new.words)) - STOP
        if len(words) < 2:  # "Make it 36.": only a number to go by
            return self._bare(new.value, n) if found.changed else None
        said = new.value.lower()
        best: tuple[int, int] | None = None
        chosen = None
        for entry in self._earlier(n):
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
                self._framed(found, n)
                or self._worded(found, n)
                or self._alike(forms(new.value), new.value, new.words, n)
                or self._bare(new.value, n)
            )
        return chosen

    def _worded(self, found: Note, n: int) -> Entry | None:
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
        scored: list[tuple[tuple[int, int], Entry]] = []
        for entry in self._earlier(n):
            if norm(entry.value) in said:
                continue
            around = _core(entry.about or entry.words, _line(entry))
            around |= set(key_of(entry.pre).split())
            shared = len(words & around)
            most = shared >= 2 and 3 * shared >= 2 * min(len(words), len(around))
            whole = shared == len(around) >= 1  # "the warehouse is Redshift": all of it
            if shared >= 3 or most or whole:
                scored.append(((shared, entry.last), entry))
        return _best(scored)

    def _framed(self, found: Note, n: int) -> Entry | None:
        """The latest entry stating a value in the same words as a note that says it changed.

        "the new limit is after 6:45 pm" replaces "don't call me after 6:15 pm":
        the value differs, the words either side of it do not.
        """
        frames = {f for v in found.values if (f := _frame(found.entry.value, v)) is not None}
        if not frames:
            return None
        said = found.entry.value.lower()
        for entry in sorted(self._earlier(n), key=lambda e: e.last, reverse=True):
            line = _line(entry)
            for start, end in spans(line):
                value = line[start:end]
                if value.lower() not in said and _frame(line, value) in frames:
                    return entry
        return None

    def rank(self, entry: Entry) -> tuple[bool, int, int, str]:
        """Eviction order, worst first (see :func:`_rank`), a templated line's facts last."""
        return _rank(entry, self.shapes.seen(entry.shape) if entry.shape else 0)

    def _holding(self, old: str, new: Entry) -> Entry | None:
        """The entry whose value a statement says it replaces ("instead of X")."""
        phrase = norm(old)
        pattern = re.compile(rf"(?<!\w){re.escape(phrase)}(?!\w)")
        # A distinct old value ("Ambergate Systems", "$764") is found in a line of any kind.
        distinct = 2 * any(valueish(w) or w[:1].isupper() for w in old.split())
        best: tuple[int, int] | None = None
        found = None
        for entry in self.entries.values():
            if entry.kind in (Kind.TOOL, Kind.ERROR) or not pattern.search(norm(entry.value)):
                continue
            # "a list" in "use a set instead of a list" must not overwrite any line with "list".
            score = 2 * (entry.kind is new.kind) + 2 * (norm(entry.value) == phrase) + distinct
            if score >= 2 and (best is None or (score, entry.last) > best):
                best, found = (score, entry.last), entry
        return found

    def _same_subject(self, new: Entry, marked: bool, n: int) -> Entry | None:
        """The entry a statement restates or corrects by being about the same subject.

        ``marked``: the statement says it corrects something but not which value.
        """
        if new.kind in (Kind.TOOL, Kind.ERROR, Kind.REQUEST):
            return None
        entry = self.entries.get(new.key)
        if entry is not None and not new.key.startswith("~") and entry.kind in _CORRECTABLE:
            return entry
        if new.kind in STATEMENTS:
            for entry in self.entries.values():
                if entry.kind is not new.kind or entry.key == TASK:
                    continue
                # Alike but for a value, unmarked, is another fact: "don't touch a.py", "... b.py".
                if marked and similar(plain(new.words), plain(entry.words)) >= 0.34:
                    return entry
        if marked and new.strong:  # "latency is 250 ms now" corrects "p95 latency: 230 ms"
            words = set(new.key.split())
            keyed = [
                e
                for e in self.entries.values()
                if e.kind in _CORRECTABLE
                and words <= set(e.key.split()) | set(key_of(e.pre).split()) | set(e.about)
            ]
            if keyed:
                return max(keyed, key=lambda e: e.last)
        if marked:  # "scratch that": the latest statement of its kind, if it is fresh
            recent = [e for e in self.entries.values() if e.kind is new.kind and e.last >= n - 4]
            overlap = [e for e in recent if (set(e.words) & set(new.words)) - STOP]
            if overlap:
                return max(overlap, key=lambda e: e.last)
            line = _line(new)
            return self._alike(forms(line), line, new.words, n) or self._bare(line, n)
        return None

    def _renumber(self, target: Entry, said: str, n: int) -> bool:
        """Give ``target`` the one bare number a correction states, in its own words.

        "Make it 36." over "seats to book: 30" reads "seats to book: 36 (was 30)".
        False (nothing changed) unless the correction states one number and nothing
        else, and the entry one number (its unit stays: "Reserve 24 chairs (was 20)").
        """
        said_values = _bare_numbers(said)
        spots = [(a, b) for a, b in _spans(target.value) if _BARE.fullmatch(target.value[a:b])]
        if said_values is None or len(said_values) != 1 or len(spots) != 1:
            return False
        (a, b), value = spots[0], target.value
        old = value[a:b]
        target.old = [o for o in target.old if o != said_values[0]] + [old]
        target.value = value[:a] + said_values[0] + value[b:]
        target.fixed, target.last = True, n
        self._sweep(target, old)
        return True

    def _bare(self, said: str, n: int) -> Entry | None:
        """The latest fresh entry stating one number, for a correction that states only one.

        "Make it 36." (after "let's book 30"), "Actually, 16." (after "cap the
        workers at 8"): a number with nothing around it to tell its subject by
        corrects the number stated last, within the last few messages.
        """
        values = _bare_numbers(said)
        if not values:
            return None
        fresh = [
            e
            for e in self._earlier(n)
            if e.last >= n - 4
            and sum(1 for a, b in _spans(e.value) if _BARE.fullmatch(e.value[a:b])) == 1
            and not any(v in _line(e) for v in values)
        ]
        return max(fresh, key=lambda e: e.last) if fresh else None

    def _alike(
        self, forms: Sequence[str | None], said: str, words: list[str], n: int
    ) -> Entry | None:
        """The entry stating a value of the same form as a correction's.

        "Make that 3,100 rows" corrects "sample size: 2,400 rows"; "rebooked onto
        DL 1893", "UA 512". Of those, the one sharing most words with it, then the
        latest.
        """
        wanted = {f for f in forms if f}
        if not wanted:
            return None
        lowered, mine = said.lower(), set(plain(words)) - STOP - _CUES
        found: list[tuple[tuple[int, int], Entry]] = []
        for entry in self._earlier(n):
            line = f"{entry.pre}{entry.value}{entry.post}"
            if any(
                (shaped := form(line, start, end)) is not None
                and _same_form(shaped, wanted)
                and line[start:end].lower() not in lowered
                for start, end in _spans(line)
            ):
                shared = len(mine & set(plain(entry.about or entry.words)))
                found.append(((shared, entry.last), entry))
        return _best(found)

    def _earlier(self, n: int) -> list[Entry]:
        """The entries a statement of message ``n`` may correct.

        Not the task, a tool's record or an error, and nothing message ``n`` itself
        stated or corrected already.
        """
        return [
            e
            for e in self.entries.values()
            if e.kind in _CORRECTABLE and e.key != TASK and e.last != n
        ]

    def _duplicate(self, new: Entry) -> Entry | None:
        for entry in self.entries.values():
            if entry.kind is Kind.TOOL:
                continue
            if norm(entry.value) == norm(new.value):
                if entry.key == new.key or {new.kind, entry.kind} <= ENTITIES:
                    if new.strong and not entry.strong and entry.kind in ENTITIES:
                        entry.pre, entry.strong = new.pre, True  # now we know whose it is
                    return entry
            elif new.kind in STATEMENTS and entry.kind is new.kind and _template(new, entry):
                # "Don't touch a.py for now" and "... b.py for now": one line, values listed.
                values = [
                    w for w in TOKEN.findall(new.value) if valueish(w) and w not in entry.value
                ]
                entry.more = [v for v in entry.more if v not in values][-8:] + values
                return entry
            elif new.kind in STATEMENTS and entry.kind is new.kind:
                # A request is the same one whatever it names ("check why X is slow").
                request = new.kind is Kind.REQUEST
                words = [plain(e.words) if request else e.words for e in (new, entry)]
                if similar(*words) >= 0.75:
                    return entry
        return None

    def _correct(self, target: Entry, new: Entry, old: str, n: int) -> None:
        target.old = [o for o in target.old if norm(o) != norm(new.value)] + [old]
        if _KINDS[new.kind][1] > _KINDS[target.kind][1] or target.kind not in STATEMENTS:
            target.kind = new.kind
        target.value, target.pre, target.post = new.value, new.pre, new.post
        target.words, target.user, target.last = new.words, target.user or new.user, n

    def _sweep(self, target: Entry, old: str) -> None:
        """Drop other lines that still state a replaced value; the task says what replaced it."""
        pattern = re.compile(rf"(?<!\w){re.escape(old.lower())}(?!\w)")
        distinct = not re.fullmatch(r"[\d.,]{1,4}", old)  # "512" alone may be anything
        unit = re.search(r"(?<![\w:.,])[\d.,]+\s?([a-z]{1,12})\b", target.value.lower())
        if not distinct and unit and unit[1] not in STOP:  # "230 ms" is, beside "310 ms"
            pattern = re.compile(rf"(?<![\w:.,]){re.escape(old.lower())}\s?{unit[1]}\b")
            distinct = True
        for entry in list(self.entries.values()):
            line = _line(entry).lower()
            if entry is target or entry.kind in (Kind.TOOL, Kind.ERROR):
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
    def load(cls, state: str, story: Story) -> _Ledger | None:
        """The ledger a :meth:`dump` saved (its open stretch into ``story``), else None."""
        try:
            data = json.loads(state)
            ledger = cls()
            for item in data["entries"]:
                entry = Entry(**{**item, "kind": Kind(item["kind"])})
                ledger.entries[entry.key] = entry
            ledger.tools, ledger.pending = dict(data["tools"]), dict(data["pending"])
            ledger.seen, ledger.asked = int(data["seen"]), int(data["asked"])
            ledger.shapes = Shapes({str(k): int(v) for k, v in data.get("shapes", {}).items()})
            story.reopen(data["open"])
        except (ValueError, KeyError, TypeError):
            return None
        return ledger


_FILLERS = frozenset(
    re.findall(r"\S+", "hmm hm oh ah well ok okay make it that say let lets do go with")
)
"""Words a bare correction is said with ("Hmm, make it 12.", "let's say 40")."""
_CUES = frozenset(
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
_BARE = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _bare_at(line: str, start: int, end: int) -> bool:
    """Whether the value at ``line[start:end]`` is a number alone, nothing to tell its subject by.

    No unit, sign or code, and no name before it ("March 21", "UA 512").
    """
    if not _BARE.fullmatch(line[start:end]) or (start and line[start - 1] in "$€£¥#-+"):
        return False
    return form(line, start, end) is None and line[end : end + 1] != "%"


def _bare_numbers(line: str) -> list[str] | None:
    """The numbers a line states when it says nothing else ("Make it 36."); else ``None``.

    Nothing else: no word but fillers and a correction's cues, so the number's
    subject can only be the one stated last ("the attendance is 7,204" has one).
    """
    found = _spans(line)
    if not found or not all(_bare_at(line, a, b) for a, b in found):
        return None
    words = set(re.findall(r"[a-z]+", line.lower())) - STOP - _CUES - _FILLERS
    return None if words else [line[a:b] for a, b in found]


_FILENAME = re.compile(r"(?<![\w./-])[\w-]{2,}\.[a-z][a-z0-9]{0,4}\b(?![./-]\w)")


def _spans(line: str) -> list[tuple[int, int]]:
    """Where a line's values are, file names ("invoice.py") among them."""
    found = spans(line)
    taken = {i for a, b in found for i in range(a, b)}
    found += [m.span() for m in _FILENAME.finditer(line) if m.start() not in taken]
    return found


def forms(line: str) -> list[str | None]:
    """The forms of a line's values (see :func:`form`)."""
    return [form(line, start, end) for start, end in _spans(line)]


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


def _same_form(found: str, wanted: set[str]) -> bool:
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


def _best(scored: list[tuple[tuple[int, int], Entry]]) -> Entry | None:
    """The entry of the highest score (the first of equals), or ``None``."""
    return max(scored, key=lambda pair: pair[0])[1] if scored else None


def _qualified_alike(old: Entry, new: Entry) -> bool:
    """Whether two facts keyed alike come from sentences about the same thing.

    "The frontend runs on port 3000" and "the backend runs on port 8000", or "Q1
    revenue" and "Q2 revenue", share a key but each has a word the other lacks:
    two facts. The words compared are the sentences' but each fact's key and value;
    a later sentence that only says less ("port: 8080") restates the same one.
    """
    if not old.about or not new.about:
        return True

    def qualifiers(entry: Entry) -> set[str]:
        value, key = norm(entry.value), set(entry.key.split())
        words = {w for w in entry.about if w not in value and w not in key} - _CUES
        return {w for w in words if not re.fullmatch(r"[\d.,:]+", w)}  # "9:30" beside "Tuesday"

    mine, theirs = qualifiers(old), qualifiers(new)
    return not (mine - theirs and theirs - mine)  # each says what the other does not


def _core(words: list[str], text: str) -> set[str]:
    """What a sentence is about: its words but values, names, function words and cues."""
    return set(plain(words)) - STOP - _CUES - named(text)


@lru_cache(maxsize=8192)
def _anchors(kind: Kind, key: str, value: str, strong: bool) -> tuple[str, ...]:
    """What a later message says when it refers to an entry: its subject or a distinct value."""
    found = []
    if strong and len(key) >= 4 and not key.startswith(("~", "tool:", "error:")) and key != TASK:
        found.append(key)
    lowered = value.lower()
    distinct = kind in ENTITIES or (kind is Kind.NUMBER and re.search(r"\d{3}|,|\s", lowered))
    if distinct and len(lowered) >= 4:  # "16" or "ok" would match everywhere
        found.append(lowered)
    return tuple(found)


def _frame(text: str, value: str) -> tuple[str, str] | None:
    """The words either side of ``value`` in ``text`` ("after", "pm"); ``None`` when bare."""
    found = re.search(rf"(\w+)\W+{re.escape(value)}\W+(\w+)", text)
    if found is None:
        return None
    before, after = found[1].lower(), found[2].lower()
    return None if before in STOP and after in STOP else (before, after)


def _template(new: Entry, old: Entry) -> bool:
    """Whether two statements are worded alike and differ only in their values."""
    values = [w for w in new.words if valueish(w)]
    return bool(values) and similar(plain(new.words), plain(old.words)) >= 0.8


def _restates(new: Entry, old: Entry) -> bool:
    """Whether ``new`` says what ``old`` said (a statement may add to it, naming all it named)."""
    if norm(new.value) == norm(old.value):
        return True
    if new.kind not in STATEMENTS or old.pre:
        return False
    names = named(old.value)
    return (bool(names) and names <= named(new.value)) or similar(new.words, old.words) >= 0.75


def _replaced(target: Entry, new: Entry) -> str:
    """How the value a correction overwrites is shown beside the new one."""
    if target.kind not in STATEMENTS or target.pre:
        return target.value
    lowered = new.value.lower()
    gone = [w for w in TOKEN.findall(target.value)[1:] if w.lower() not in lowered]
    gone = [w for w in gone if w.lower() not in STOP]
    shown = [w for w in gone if w.lower() in named(target.value)] or gone[:4]
    return " ".join(shown) if shown else clip(target.value, 60)


def _gist(entry: Entry, old: str) -> str:
    """An entry's new value in a few words: a statement's names and values but the ``old``."""
    if entry.pre or entry.kind not in STATEMENTS:
        return entry.value
    gone = {w.lower() for w in TOKEN.findall(old)}
    names = [w for w in TOKEN.findall(entry.value) if w.lower() in named(entry.value) - gone]
    return " ".join(names[:4]) or clip(entry.value, 40)


def _rank(entry: Entry, seen: int = 0) -> tuple[bool, int, int, str]:
    """Eviction order, worst first: never by age.

    The task first; then by score: the kind's weight, references (up to 5), a stated
    subject, the user's word over the agent's, an explicit correction; less for a fact
    read from a sentence or line whose shape was ``seen`` often (a template's output:
    data, whatever its words). On a tie the earlier statement stays: the newest turns
    are still in the view, raw.
    """
    score = _KINDS[entry.kind][1] + 2 * min(entry.refs, 5) + 2 * entry.user + 2 * entry.strong
    score += min(entry.weight, 12) // 2  # what its sentence said of it: "keep it handy"...
    score -= _TEMPLATED if seen >= _REPEATED else 2 * (seen == _REPEATED - 1)
    # A value said in passing, with no subject ("#44783", "logs show 49"), is context.
    score -= 2 * (entry.kind in _ATTRIBUTES and not entry.strong)
    score += 3 * entry.fixed  # a correction, not a tally's new count
    score += 2 * (entry.kind is Kind.TOOL and entry.strong)  # "42 passed" over "12 lines"
    return (entry.key == TASK, score, -entry.first, entry.key)


def _line(entry: Entry) -> str:
    # An old value the new statement already names ("X instead of Y") needs no "was".
    old = [o for o in entry.old[-2:] if o.lower() not in entry.value.lower()]
    was = f" (was {', '.join(reversed(old))})" if old else ""
    extra = f" and {len(entry.more) - 3} more" if len(entry.more) > 3 else ""
    more = f" (also {', '.join(entry.more[-3:])}{extra})" if entry.more else ""
    return f"{entry.pre}{entry.value}{entry.post}{was}{more}"


# -- rendering and parsing ----------------------------------------------------------


def _render(
    entries: list[Entry],
    budget: int,
    counter: TokenCounter,
    rank: Callable[[Entry], Any] = _rank,
    header: str = HEADER,
) -> tuple[str, list[Entry]]:
    """The ledger text: the best-ranked entries that fit ``budget`` tokens; and those entries.

    cl100k never merges across the start of a line, so a text's tokens are the
    sum of each line's with its newline: lines are costed one by one, exactly.
    """
    chosen: list[Entry] = []
    used = counter.count(f"{header}\n")
    kinds: set[Kind] = set()
    for entry in sorted(entries, key=rank, reverse=True):
        cost = counter.count(f"{_bullet(entry)}\n")
        if entry.kind not in kinds and entry.key != TASK:
            cost += counter.count(f"{_KINDS[entry.kind][0]}:\n")
        if used + cost <= budget + 1:  # the last line has no newline
            chosen.append(entry)
            used += cost
            kinds.add(entry.kind)
    text = _layout(chosen, entries, header)
    while chosen and counter.count(text) > budget:
        chosen.pop()
        text = _layout(chosen, entries, header)
    return (text, chosen) if chosen else ("", [])


def _bullet(entry: Entry) -> str:
    return f"Task: {_line(entry)}" if entry.key == TASK else f"- {_line(entry)}"


def _layout(chosen: list[Entry], entries: list[Entry], header: str = HEADER) -> str:
    """The chosen entries under their headings, each kind in the order its facts were stated."""
    picked = {id(e) for e in chosen}
    ordered = [e for e in entries if id(e) in picked]  # first seen first, as the state keeps them
    lines = [header, *(_bullet(e) for e in ordered if e.key == TASK)]
    for kind, (heading, _) in _KINDS.items():
        group = sorted(
            (e for e in ordered if e.kind is kind and e.key != TASK), key=lambda e: e.first
        )
        if group:
            lines += [f"{heading}:", *(_bullet(e) for e in group)]
    return "\n".join(lines)


def _parse(text: str) -> tuple[_Ledger, list[str], list[str]]:
    """A summary's text as entries, its narrative's lines, and lines of no known form."""
    ledger, narrative, foreign = _Ledger(), [], []
    ledger.asked, kind, section = 1, None, "foreign"
    lines = [line.strip() for line in text.splitlines()]
    for index, line in enumerate(lines):
        if line in (HEADER, MORE, NARRATIVE):
            section = "narrative" if line == NARRATIVE else "ledger"
        elif section == "narrative" and line:
            narrative.append(line)
        elif section == "ledger" and line in _HEADINGS:
            kind = _HEADINGS[line]
        elif section == "ledger" and (line.startswith("Task: ") or (kind and line[:2] == "- ")):
            entry = _parsed(kind if line[:2] == "- " else None, line.partition(" ")[2])
            entry.first = entry.last = index - len(lines)  # before any new message, in order
            ledger.entries.setdefault(entry.key, entry)
        elif line:
            foreign.append(line)
    return ledger, narrative, foreign


def _parsed(kind: Kind | None, body: str) -> Entry:
    """An entry from its ledger line (``kind`` None: the task)."""
    old: list[str] = []
    more: list[str] = []
    if match := re.search(r" \(also (.+?)(?: and (\d+) more)?\)$", body):
        more = ["?"] * int(match[2] or 0) + match[1].split(", ")  # the values not shown are lost
        body = body[: match.start()]
    if match := re.search(r" \(was (.+)\)$", body):
        old, body = list(reversed(match[1].split(", "))), body[: match.start()]
    if kind is None:
        return Entry(Kind.REQUEST, TASK, body, old=old, more=more, user=True, words=content(body))
    found = [f.entry for _, facts in statements(body) for f in facts]
    if kind not in (Kind.TOOL, Kind.ERROR) and len(found) == 1 and _line(found[0]) == body:
        entry = found[0]  # read back as it was written: subject, value and all
        entry.kind, entry.old, entry.more = kind, old, more
        return entry
    pre, value = "", body
    match = re.match(r"([^:]{1,60}?: )(.+)$", body)
    if match and kind not in (Kind.REQUEST, Kind.DECISION, Kind.PREFERENCE):
        pre, value = match[1], match[2]
    label = pre.removesuffix(": ")
    key = {Kind.TOOL: f"tool:{label}", Kind.ERROR: f"error:{value.lower()}"}.get(kind)
    words = content(body)
    key = key or (label.lower() if pre else value.lower() if kind in ENTITIES else signature(words))
    return Entry(kind, key, value, pre, old=old, more=more, strong=bool(pre), words=words)


def _legacy(ledger: _Ledger, line: str) -> bool:
    """Fold one line of another summarizer's text; False when it states nothing known."""
    legacy = _LEGACY.match(BULLET.sub("", line))
    heading, body = legacy.groups() if legacy else ("", BULLET.sub("", line))
    facts = [fact for _, found in statements(body) for fact in found]
    if not facts and heading in ("Decisions", "Errors", "Requests"):
        kind = {"Decisions": Kind.DECISION, "Errors": Kind.ERROR}.get(heading, Kind.REQUEST)
        words = content(body)
        facts = [Fact(Entry(kind, signature(words), clip(body, 200), words=words), None, False)]
    for fact in facts:
        ledger.add(fact, -1)
    return bool(facts)


# -- the summarizer -----------------------------------------------------------------


class LocalSummarizer:
    """A deterministic, extractive two-level summarizer that needs no network.

    Used where no API key is set. Its ledger keeps, keyed by subject, what an
    agent needs to carry on; a correction overwrites the fact it corrects and
    keeps the old value beside it.

    Args:
        counter: Counts the summary's tokens; cl100k by default.
    """

    name = "local-ledger"

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter or TiktokenCounter()

    async def summarize_levels(
        self,
        previous: Summary | None,
        messages: Sequence[dict[str, Any]],
        *,
        max_tokens: int,
        ledger_tokens: int | None = None,
    ) -> Summary:
        """Fold ``messages`` into ``previous`` and render both levels within budget.

        Args:
            previous: The last summary, or None for the first. Without a state
                (another summarizer's text) its ledger is parsed as well as can be.
            messages: The turns after it, oldest first.
            max_tokens: The budget of the ledger and the narrative joined by a blank line.
            ledger_tokens: The ledger's budget; ``min(600, max_tokens // 3)`` by default.

        Returns:
            The new summary; its ``state`` carries the entries to the next fold.
        """
        # Pure and CPU-bound: a long fold must not stall the worker's lease renewals.
        return await asyncio.to_thread(
            self._fold, previous, messages, max_tokens, ledger_tokens, further=True
        )

    def _fold(
        self,
        previous: Summary | None,
        messages: Sequence[dict[str, Any]],
        max_tokens: int,
        ledger_tokens: int | None,
        *,
        further: bool,
    ) -> Summary:
        """Fold and render; with ``further``, level 2 starts with the facts the ledger left out."""
        ledger, story = _resume(previous)
        for message in messages:
            ledger.fold(message, story)
        default = min(600, max_tokens // 3)
        budget = min(max_tokens, default if ledger_tokens is None else ledger_tokens)
        count = self._counter.count
        entries = list(ledger.entries.values())
        text, shown = _render(entries, budget, self._counter, ledger.rank)
        spare = max_tokens - (count(f"{text}\n\n") if text else 0)
        # Level 2: the facts the ledger had no room for, then the narrative.
        shown_ids = {id(e) for e in shown}
        rest = [e for e in entries if id(e) not in shown_ids]
        room = int(spare * _MORE_SHARE) if further else 0
        more, _ = _render(rest, room, self._counter, ledger.rank, MORE)
        spare -= count(f"{more}\n\n") if more else 0
        lines = [*story.lines, story.bullet()]
        narrative = fit_narrative(lines, spare, self._counter)
        told = "\n\n".join(part for part in (more, narrative) if part)
        while narrative and count(f"{text}\n\n{told}") > max_tokens:
            spare -= 4  # tokens can merge across the join: fit a little tighter
            narrative = fit_narrative(lines, spare, self._counter)
            told = "\n\n".join(part for part in (more, narrative) if part)
        return Summary(text, told, ledger.dump(story))

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """The one-level protocol: the ledger, a blank line and the narrative, as one text.

        Args:
            previous: An earlier summary's text (this summarizer's is read back
                entry by entry; another's, line by line), or None.
            messages: The turns after it, oldest first.
            max_tokens: The budget of the whole text.

        Returns:
            The new summary's text.
        """
        earlier = Summary(previous, "", None) if previous else None
        # One text has one ledger: no further facts before the narrative.
        summary = await asyncio.to_thread(
            self._fold, earlier, messages, max_tokens, None, further=False
        )
        return "\n\n".join(part for part in (summary.ledger, summary.narrative) if part)


def _resume(previous: Summary | None) -> tuple[_Ledger, Story]:
    """The ledger and story to fold into: from the state, else read from the text."""
    story = Story()
    if previous is None:
        return _Ledger(), story
    story.lines = _parse(f"{NARRATIVE}\n{previous.narrative}")[1]
    ledger = _Ledger.load(previous.state, story) if previous.state else None
    if ledger is None:
        ledger, own, foreign = _parse(f"{previous.ledger}\n{previous.narrative}")
        unread = [ln for ln in foreign if not _legacy(ledger, ln) and not ln.endswith(":")]
        story.lines = [f"- {clip(BULLET.sub('', ln), 200)}" for ln in unread] + own
    return ledger, story

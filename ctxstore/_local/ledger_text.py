"""The ledger as text: rendered within a token budget, and read back.

:func:`render` writes the best-ranked entries that fit a budget under a header
(:data:`HEADER`, or :data:`MORE` for the further facts of level 2), each kind
under its heading. :func:`parse` reads a summary's text back into a ledger when
no state came with it, line by line, and :func:`fold_foreign_line` folds a line
of another summarizer's text as well as it can.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ctxstore._local.entries import KINDS, TASK, LedgerEntry, entry_line, eviction_rank
from ctxstore._local.fact_words import BULLET, FactKind
from ctxstore._local.facts import ENTITIES, Fact, clip, content, signature, statements
from ctxstore._local.ledger import Ledger
from ctxstore._local.narrative import NARRATIVE
from ctxstore.tokens import TokenCounter

HEADER = 'Ledger (current values; "was" marks a replaced one):'
"""The ledger's first line; it tells this summarizer's text from another's."""
MORE = "More facts (referred to less):"
"""The first line of the facts level 2 adds to the ledger."""
_HEADINGS = {f"{heading}:": kind for kind, (heading, _) in KINDS.items()}
# The old LocalSummarizer's lines ("- Decisions: user: ..."), read when folding its summary.
_LEGACY = re.compile(r"^(Decisions|Errors|Facts|Requests|Tools): (?:(?:user|assistant): )?(.*)$")


def render(
    entries: list[LedgerEntry],
    budget: int,
    counter: TokenCounter,
    rank: Callable[[LedgerEntry], Any] = eviction_rank,
    header: str = HEADER,
) -> tuple[str, list[LedgerEntry]]:
    """The ledger text: the best-ranked entries that fit ``budget`` tokens; and those entries.

    cl100k never merges across the start of a line, so a text's tokens are the
    sum of each line's with its newline: lines are costed one by one, exactly.
    """
    chosen: list[LedgerEntry] = []
    used = counter.count(f"{header}\n")
    kinds: set[FactKind] = set()
    for entry in sorted(entries, key=rank, reverse=True):
        cost = counter.count(f"{_bullet(entry)}\n")
        if entry.kind not in kinds and entry.key != TASK:
            cost += counter.count(f"{KINDS[entry.kind][0]}:\n")
        if used + cost <= budget + 1:  # the last line has no newline
            chosen.append(entry)
            used += cost
            kinds.add(entry.kind)
    text = _layout(chosen, entries, header)
    while chosen and counter.count(text) > budget:
        chosen.pop()
        text = _layout(chosen, entries, header)
    return (text, chosen) if chosen else ("", [])


def _bullet(entry: LedgerEntry) -> str:
    return f"Task: {entry_line(entry)}" if entry.key == TASK else f"- {entry_line(entry)}"


def _layout(chosen: list[LedgerEntry], entries: list[LedgerEntry], header: str = HEADER) -> str:
    """The chosen entries under their headings, each kind in the order its facts were stated."""
    picked = {id(e) for e in chosen}
    ordered = [e for e in entries if id(e) in picked]  # first seen first, as the state keeps them
    lines = [header, *(_bullet(e) for e in ordered if e.key == TASK)]
    for kind, (heading, _) in KINDS.items():
        group = sorted(
            (e for e in ordered if e.kind is kind and e.key != TASK), key=lambda e: e.first
        )
        if group:
            lines += [f"{heading}:", *(_bullet(e) for e in group)]
    return "\n".join(lines)


def parse(text: str) -> tuple[Ledger, list[str], list[str]]:
    """A summary's text as entries, its narrative's lines, and lines of no known form."""
    ledger, narrative, foreign = Ledger(), [], []
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


def _parsed(kind: FactKind | None, body: str) -> LedgerEntry:
    """An entry from its ledger line (``kind`` None: the task)."""
    old: list[str] = []
    more: list[str] = []
    if match := re.search(r" \(also (.+?)(?: and (\d+) more)?\)$", body):
        more = ["?"] * int(match[2] or 0) + match[1].split(", ")  # the values not shown are lost
        body = body[: match.start()]
    if match := re.search(r" \(was (.+)\)$", body):
        old, body = list(reversed(match[1].split(", "))), body[: match.start()]
    if kind is None:
        return LedgerEntry(
            FactKind.REQUEST, TASK, body, old=old, more=more, user=True, words=content(body)
        )
    found = [f.entry for _, facts in statements(body) for f in facts]
    if (
        kind not in (FactKind.TOOL, FactKind.ERROR)
        and len(found) == 1
        and entry_line(found[0]) == body
    ):
        entry = found[0]  # read back as it was written: subject, value and all
        entry.kind, entry.old, entry.more = kind, old, more
        return entry
    pre, value = "", body
    match = re.match(r"([^:]{1,60}?: )(.+)$", body)
    if match and kind not in (FactKind.REQUEST, FactKind.DECISION, FactKind.PREFERENCE):
        pre, value = match[1], match[2]
    label = pre.removesuffix(": ")
    key = {FactKind.TOOL: f"tool:{label}", FactKind.ERROR: f"error:{value.lower()}"}.get(kind)
    words = content(body)
    key = key or (label.lower() if pre else value.lower() if kind in ENTITIES else signature(words))
    return LedgerEntry(kind, key, value, pre, old=old, more=more, strong=bool(pre), words=words)


def fold_foreign_line(ledger: Ledger, line: str) -> bool:
    """Fold one line of another summarizer's text; False when it states nothing known."""
    legacy = _LEGACY.match(BULLET.sub("", line))
    heading, body = legacy.groups() if legacy else ("", BULLET.sub("", line))
    facts = [fact for _, found in statements(body) for fact in found]
    if not facts and heading in ("Decisions", "Errors", "Requests"):
        kind = {"Decisions": FactKind.DECISION, "Errors": FactKind.ERROR}.get(
            heading, FactKind.REQUEST
        )
        words = content(body)
        facts = [
            Fact(LedgerEntry(kind, signature(words), clip(body, 200), words=words), None, False)
        ]
    for fact in facts:
        ledger.add(fact, -1)
    return bool(facts)

"""The ledger's entries: one fact each, its line, its section and its rank.

A :class:`LedgerEntry` is what the local summarizer keeps of a fact: the line
``pre + value + post``, the values it replaced and the ones said with it, and
what folding and ranking it need (references, who said it, the shape of the
sentence it was read from). Each kind of fact has a section of the ledger and a
weight (:data:`KINDS`); an entry's rank (:func:`eviction_rank`) decides which
go first when the ledger is over budget, and :func:`entry_line` is how it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ctxstore._local.fact_words import ENTITIES, FactKind


@dataclass(slots=True)
class LedgerEntry:
    """One fact: the line ``pre + value + post``, and what folding it needs."""

    kind: FactKind
    key: str
    value: str
    pre: str = ""
    post: str = ""
    old: list[str] = field(default_factory=list)
    more: list[str] = field(default_factory=list)  # values the same statement was made with
    refs: int = 0
    first: int = 0
    last: int = 0
    # Keyed by a stated subject ("X is V"); for a tool, its last outcome says how it ended.
    strong: bool = False
    user: bool = False  # the user said it: a requirement, not the agent's remark
    fixed: bool = False  # a correction said so ("actually", "instead of X"): not a tally's update
    words: list[str] = field(default_factory=list)
    shape: str = ""  # the shape of the sentence or line it was read from (``shapes``)
    weight: int = 0  # how much the sentence it was read from says it matters (``notes``)
    # The content words of the whole sentence it was read from: a correction may name the
    # subject by words outside the clause ("Loop in X; they're who signs off on the budget").
    about: list[str] = field(default_factory=list)


# Heading and eviction weight, in render order: constraints and decisions outrank
# everything else, requests outrank what tools said, errors outrank plain entities.
KINDS: dict[FactKind, tuple[str, int]] = {
    FactKind.REQUEST: ("Requests", 3),
    FactKind.CONSTRAINT: ("Constraints", 10),
    FactKind.DECISION: ("Decisions", 9),
    FactKind.PREFERENCE: ("Preferences", 8),
    FactKind.IDENTIFIER: ("Identifiers", 6),
    FactKind.NUMBER: ("Numbers", 6),
    FactKind.NAME: ("Names", 5),
    FactKind.DATE: ("Dates", 6),
    FactKind.PATH: ("Paths", 5),
    FactKind.ERROR: ("Errors", 7),
    FactKind.TOOL: ("Tools", 2),
}

_ATTRIBUTES = ENTITIES | {FactKind.NUMBER}
TASK = "task"  # the key of the first request, which is never evicted
REPEATED = 3  # a shape seen this often is a template's: what it says is data
_TEMPLATED = 12  # how far that sinks its facts' rank (a constraint weighs 10)


def eviction_rank(entry: LedgerEntry, seen: int = 0) -> tuple[bool, int, int, str]:
    """Eviction order, worst first: never by age.

    The task first; then by score: the kind's weight, references (up to 5), a stated
    subject, the user's word over the agent's, an explicit correction; less for a fact
    read from a sentence or line whose shape was ``seen`` often (a template's output:
    data, whatever its words). On a tie the earlier statement stays: the newest turns
    are still in the view, raw.
    """
    score = KINDS[entry.kind][1] + 2 * min(entry.refs, 5) + 2 * entry.user + 2 * entry.strong
    score += min(entry.weight, 12) // 2  # what its sentence said of it: "keep it handy"...
    score -= _TEMPLATED if seen >= REPEATED else 2 * (seen == REPEATED - 1)
    # A value said in passing, with no subject ("#44783", "logs show 49"), is context.
    score -= 2 * (entry.kind in _ATTRIBUTES and not entry.strong)
    score += 3 * entry.fixed  # a correction, not a tally's new count
    score += 2 * (entry.kind is FactKind.TOOL and entry.strong)  # "42 passed" over "12 lines"
    return (entry.key == TASK, score, -entry.first, entry.key)


def entry_line(entry: LedgerEntry) -> str:
    """The entry's line in the ledger: its text, the values it replaced, the ones said with it."""
    # An old value the new statement already names ("X instead of Y") needs no "was".
    old = [o for o in entry.old[-2:] if o.lower() not in entry.value.lower()]
    was = f" (was {', '.join(reversed(old))})" if old else ""
    extra = f" and {len(entry.more) - 3} more" if len(entry.more) > 3 else ""
    more = f" (also {', '.join(entry.more[-3:])}{extra})" if entry.more else ""
    return f"{entry.pre}{entry.value}{entry.post}{was}{more}"

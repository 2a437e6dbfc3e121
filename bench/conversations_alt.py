"""A held-out corpus for the context-quality eval: a second, independent generator.

:mod:`bench.conversations` is the corpus the summarizer is tuned on. This
module builds conversations of the same shape (the same :class:`Conversation`
and :class:`Fact` objects, the same :func:`verify` invariants) with its own
domains, tools, noise, phrasing and correction styles, so the eval can check
that what the summarizer learned carries over to text it was not tuned on.

Six domains (:data:`DOMAINS`), none shared with the first corpus:

- ``incident``: infrastructure incident response: kubectl, terraform,
  metrics queries, runbooks, pager incidents and dashboard panels;
- ``legal``: contract review: document search, clauses, redlines, parties,
  obligations and deadlines;
- ``travel``: event and travel planning: flights, venues, hotels, bookings,
  attendee rosters and budget sheets;
- ``mlops``: ML experiment tracking: runs, hyperparameters, training logs,
  jobs, checkpoints and evaluation suites;
- ``finance``: month-end reconciliation: SQL, spreadsheets, invoices, bank
  statements, ledgers and transaction matching;
- ``helpdesk``: HR onboarding and IT helpdesk: tickets, the directory, asset
  inventory, access requests, device management and the knowledge base.

Each conversation is a system prompt and 220-380 messages: user requests
(short asks, bulleted lists, pasted notes), assistant tool calls (parallel
ones too) and reports, tool results (logs, tables, JSON records, prose,
failures), chit-chat. Most are OpenAI Chat dicts; a third of the
conversations (:func:`style_of`) are in Anthropic format (content blocks,
``tool_use`` / ``tool_result``). Sizes run from about 25k to 120k cl100k
tokens depending on domain and seed, with at least one 3,000-6,000-token
dump each.

Each carries 20-40 planted facts of the nine kinds of :data:`KINDS`, stated
once by the user, the assistant or a tool (a JSON field, a table row, a log
line, a clause, an error output), and 3-6 corrections in one of the modes of
:data:`CORRECTION_MODES`: an explicit marker ("scratch that", "my mistake,
it should be", "X is out, Y is in", ...), a correction that does not repeat
the old value, a correction in passing inside a sentence about something
else, a silent restatement with a new value, an assistant self-correction,
an assistant correction prompted by a tool result that flags the stored
value as stale, or a tool result that shows the change. Keys are drawn after
all the noise is written, so that each occurs only where :func:`verify`
allows; :func:`generate` retries with fresh values until it does.

Nothing here is derived from how any summarizer extracts facts: the corpus
is meant to be blind to it.
"""

from __future__ import annotations

import json
import math
import random
import re
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bench.conversations import KINDS, Conversation, Fact, call_points, text_of, verify
from ctxstore import TiktokenCounter

__all__ = [
    "CORRECTION_MODES",
    "DOMAINS",
    "KINDS",
    "Conversation",
    "Fact",
    "corpus",
    "correction_modes",
    "generate",
    "style_of",
    "text_of",
    "verify",
]

DOMAINS = ("incident", "legal", "travel", "mlops", "finance", "helpdesk")
"""The domains of the held-out corpus, in a fixed order (it takes part in the seeding)."""

CORRECTION_MODES = ("marker", "no_old", "aside", "silent", "self", "after_tool", "tool")
"""How a correction is made.

- ``marker``: the user corrects with a marker phrase, often naming the old value;
- ``no_old``: the user corrects without repeating the old value;
- ``aside``: the new value comes in passing, inside a request about something else;
- ``silent``: the fact is stated again with a new value and no marker at all;
- ``self``: the assistant corrects something it said;
- ``after_tool``: the assistant corrects a value after a tool result flagged it stale;
- ``tool``: a tool result shows the change (an audit line, a diff, a JSON field).
"""

# Total sizes in cl100k tokens; the tier is picked from domain and seed so that
# each seed covers every tier once, and each domain gets a different one per seed.
_TIERS = (27_000, 39_000, 53_000, 71_000, 90_000, 112_000)
_ATTEMPTS = 16
_TOKENS = TiktokenCounter()


def style_of(domain: str, seed: int) -> str:
    """The message format of a conversation.

    Args:
        domain: One of :data:`DOMAINS`.
        seed: The conversation's seed.

    Returns:
        ``"anthropic"`` for a third of the (domain, seed) pairs, ``"openai"`` otherwise.
    """
    return "anthropic" if (2 * DOMAINS.index(domain) + seed) % 3 == 1 else "openai"


def generate(domain: str, seed: int) -> Conversation:
    """The held-out conversation of ``domain`` for ``seed``: the same every time.

    Args:
        domain: One of :data:`DOMAINS`.
        seed: Any integer.

    Returns:
        A conversation whose facts pass :func:`verify`.

    Raises:
        ValueError: ``domain`` is not one of :data:`DOMAINS`.
        AssertionError: No attempt produced keys that occur only where planted.
    """
    return _generate(domain, seed)[0]


def correction_modes(domain: str, seed: int) -> list[tuple[str, str, str]]:
    """How each correction of a conversation is made, for tests and inspection.

    Args:
        domain: One of :data:`DOMAINS`.
        seed: Any integer.

    Returns:
        One ``(subject, mode, voice)`` per corrected fact, in the order the
        facts were planned; ``mode`` is one of :data:`CORRECTION_MODES` and
        ``voice`` is who makes the correction (``user``, ``assistant`` or ``tool``).
    """
    return _generate(domain, seed)[1]


def corpus(seeds: Sequence[int], domains: Sequence[str] = DOMAINS) -> list[Conversation]:
    """The conversations of every domain for every seed, seed-major.

    Args:
        seeds: The seeds.
        domains: Domains of :data:`DOMAINS` (all of them by default).

    Returns:
        ``len(seeds) * len(domains)`` conversations.
    """
    return [generate(domain, seed) for seed in seeds for domain in domains]


_CACHE: dict[tuple[str, int], tuple[Conversation, list[tuple[str, str, str]]]] = {}


def _generate(domain: str, seed: int) -> tuple[Conversation, list[tuple[str, str, str]]]:
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; one of {', '.join(DOMAINS)}")
    cached = _CACHE.get((domain, seed))
    if cached is not None:
        return _copy(cached[0]), list(cached[1])
    problems: list[str] = []
    for attempt in range(_ATTEMPTS):
        rng = random.Random(f"ctxstore-heldout/{domain}/{seed}/{attempt}")
        try:
            conversation, modes = _Builder(domain, seed, rng).build()
        except _Collision as exc:
            problems = [str(exc)]
            continue
        problems = verify(conversation)
        if not problems:
            if len(_CACHE) > 64:
                _CACHE.clear()
            _CACHE[(domain, seed)] = (conversation, modes)
            return _copy(conversation), list(modes)
    raise AssertionError(f"{domain}/{seed}: no sound conversation: {problems[:3]}")


def _copy(conversation: Conversation) -> Conversation:
    """A copy whose messages can be changed without touching the cache."""
    messages = json.loads(json.dumps(conversation.messages))
    return Conversation(
        conversation.domain,
        conversation.seed,
        conversation.style,
        messages,
        list(conversation.facts),
        list(conversation.call_points),
    )


class _Collision(Exception):
    """No value could be drawn that occurs nowhere else: start the attempt over."""


# -- random values --------------------------------------------------------------------

Draw = Callable[[random.Random], str]

_FIRST = (
    "Anika", "Bartosz", "Celeste", "Desmond", "Eunji", "Florin", "Gideon", "Hyacinth",
    "Ignacio", "Jolene", "Kofi", "Liesel", "Marisol", "Nikhil", "Oksana", "Pascal", "Quentin",
    "Rhiannon", "Stellan", "Thandiwe", "Ulrike", "Valentin", "Wilhelmina", "Xiomara",
    "Yannick", "Zainab", "Ansel", "Briony", "Cormac", "Dagny", "Evander", "Farida", "Gunnar",
    "Hollis", "Isolde", "Jasper", "Kalani", "Lorcan", "Mirela", "Niamh", "Osric", "Perpetua",
)  # fmt: skip
_LAST = (
    "Abernathy", "Brandt", "Czerny", "Delacroix", "Ekwueme", "Fairweather", "Gruber",
    "Hallstrom", "Iwasaki", "Jovanovic", "Kavanagh", "Lundgren", "Marchetti", "Nwachukwu",
    "Ostrowski", "Pellegrino", "Quayle", "Rautio", "Szabo", "Trevelyan", "Uchida", "Vasquez",
    "Winterbourne", "Yilmaz", "Zeller", "Achterberg", "Bjornsson", "Castellano", "Dunmore",
    "Esposito", "Falkenrath", "Gallagher", "Hoekstra", "Jankowski", "Kirkpatrick", "Lindahl",
    "Mwangi", "Okonkwo", "Prescott", "Rosenthal", "Sorensen", "Tamura",
)  # fmt: skip
_ORG_A = (
    "Ferrobyte", "Glasswing", "Harrowgate", "Ironvale", "Juniper Crest", "Kingsmere",
    "Larkspur", "Meridian Vale", "Nettlefield", "Oakhollow", "Pemberton", "Quillon",
    "Rookwood", "Stonebridge", "Thistledown", "Umberfield", "Vantor", "Willowmere", "Yarrow",
    "Zephyrine", "Ashgrove", "Bramblecote", "Copperline", "Duskwater",
)  # fmt: skip
_ORG_B = (
    "GmbH", "Holdings", "Partners", "AG", "Ltd", "Capital", "Networks", "Solutions",
    "Group", "Services", "Technologies", "SARL", "BV", "Inc",
)  # fmt: skip
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_NOISE_CITIES = (
    "Rennes", "Utrecht", "Linz", "Trondheim", "Plovdiv", "Tallinn", "Aberdeen", "Salzburg",
    "Bergamo", "Lodz", "Basel", "Nantes", "Odense", "Cluj", "Galway", "Seville",
)  # fmt: skip
_SAFE_LOWER = "abcdefghjkmnpqrstuvwxyz23456789"
_SAFE_UPPER = "ABCDEFGHJKLMNPQRSTUVWXYZ"


def _digits(r: random.Random, n: int) -> str:
    return str(r.randint(1, 9)) + "".join(r.choice(string.digits) for _ in range(n - 1))


def _hexes(r: random.Random, n: int) -> str:
    while True:
        value = "".join(r.choice("0123456789abcdef") for _ in range(n))
        if any(c.isalpha() for c in value) and any(c.isdigit() for c in value):
            return value


def _person(r: random.Random) -> str:
    return f"{r.choice(_FIRST)} {r.choice(_LAST)}"


def _org(r: random.Random) -> str:
    return f"{r.choice(_ORG_A)} {r.choice(_ORG_B)}"


def _ordinal(day: int) -> str:
    if 10 < day % 100 < 14:
        return f"{day}th"
    return f"{day}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th') }"


def _day(r: random.Random) -> str:
    """A calendar day in one of several human spellings (never ISO: the noise is full of it)."""
    day, month = r.randint(1, 28), r.choice(_MONTHS)
    style = r.randrange(5)
    if style == 0:
        return f"{day} {month}"
    if style == 1:
        return f"{month} {_ordinal(day)}"
    if style == 2:
        return f"{_ordinal(day)} of {month}"
    if style == 3:
        return f"{day} {month[:3]}"
    return f"{month[:3]} {_ordinal(day)}"


def _comma(lo: int, hi: int, unit: str = "") -> Draw:
    return lambda r: f"{r.randint(lo, hi):,}{unit}"


def _count(lo: int, hi: int, unit: str) -> Draw:
    return lambda r: f"{r.randint(lo, hi)} {unit}"


def _decimal(lo: float, hi: float, places: int, unit: str = "") -> Draw:
    return lambda r: f"{r.uniform(lo, hi):.{places}f}{unit}"


def _percent(lo: float, hi: float, places: int = 1) -> Draw:
    def draw(r: random.Random) -> str:
        value = f"{r.uniform(lo, hi):.{places}f}"
        if value.endswith("0"):
            value = value[:-1] + str(r.randint(1, 9))
        return value + "%"

    return draw


def _cash(symbol: str, lo: int, hi: int, *, cents: bool = False) -> Draw:
    if cents:
        return lambda r: f"{symbol}{r.randint(lo, hi):,}.{r.randint(1, 99):02d}"
    return lambda r: f"{symbol}{r.randint(lo, hi):,}"


def _bare(option: str) -> str:
    """An option without its leading article: a key is the distinctive words only."""
    return re.sub(r"^(a|an|the) ", "", option)


def _choice(*options: str) -> Draw:
    bare = tuple(_bare(o) for o in options)
    return lambda r: r.choice(bare)


def _shape(template: str, words: Sequence[str] = ()) -> Draw:
    """A drawer of values shaped like ``template``.

    It fills ``{D4}`` (digits), ``{X7}`` (hex), ``{A3}`` (capitals), ``{L6}``
    (lowercase and digits), ``{w}`` (a word), ``{Y}`` (a year), ``{M}`` (a month).
    """

    def one(r: random.Random, match: re.Match[str]) -> str:
        code, size = match.group(1), int(match.group(2) or 0)
        if code == "w":
            return r.choice(words)
        if code == "D":
            return _digits(r, size)
        if code == "X":
            return _hexes(r, size)
        if code == "A":
            return "".join(r.choice(_SAFE_UPPER) for _ in range(size))
        if code == "L":
            while True:
                value = "".join(r.choice(_SAFE_LOWER) for _ in range(size))
                if not value.isdigit():
                    return value
        if code == "Y":
            return str(r.choice((2024, 2025, 2026)))
        return f"{r.randint(1, 12):02d}"

    def draw(r: random.Random) -> str:
        return re.sub(r"\{([wDXALYM])(\d*)\}", lambda m: one(r, m), template)

    return draw


def _either(*draws: Draw) -> Draw:
    return lambda r: r.choice(draws)(r)


# -- topics: what a fact can be about --------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Topic:
    """A subject a fact can be planted about, how its values are drawn and said.

    ``says`` are the topic's own statements (preferences, constraints), with
    ``{v}`` for the value; ``why`` are reasons, for decisions.
    """

    kind: str
    subject: str
    draw: Draw
    says: tuple[str, ...] = ()
    why: tuple[str, ...] = ()
    label: str = ""

    @property
    def field(self) -> str:
        """The subject as a field name (``hpa_max_replicas_checkout``), for tool output."""
        if self.label:
            return self.label
        words = re.sub(r"[^a-z0-9]+", " ", self.subject.lower()).split()
        skip = {"the", "of", "for", "a", "an", "on", "our", "we", "in", "to", "s", "is", "what"}
        return "_".join(w for w in words if w not in skip)[:40]


def _topics(kind: str, rows: Sequence[tuple[Any, ...]]) -> list[_Topic]:
    """Topics of a plain kind from ``(subject, draw[, label])`` rows."""
    return [_Topic(kind, row[0], row[1], label=row[2] if len(row) > 2 else "") for row in rows]


def _choices_topics(rows: Sequence[tuple[str, Sequence[str], Sequence[str]]]) -> list[_Topic]:
    """Decision topics from ``(subject, options, reasons)`` rows."""
    return [_Topic("decision", s, _choice(*opts), why=tuple(why)) for s, opts, why in rows]


def _said(kind: str, rows: Sequence[tuple[str, Draw, Sequence[str]]]) -> list[_Topic]:
    """Preference or constraint topics from ``(subject, draw, statements)`` rows."""
    return [_Topic(kind, s, draw, says=tuple(says)) for s, draw, says in rows]


# -- the plan ---------------------------------------------------------------------------------

_KIND_WEIGHTS = {
    "preference": 0.7,
    "decision": 1.0,
    "number": 1.7,
    "path": 1.0,
    "error": 0.9,
    "name": 1.2,
    "constraint": 0.9,
    "identifier": 1.3,
    "date": 1.2,
}
_VOICES: dict[str, tuple[tuple[str, float], ...]] = {
    "preference": (("user", 1.0),),
    "decision": (("user", 0.45), ("assistant", 0.35), ("tool", 0.2)),
    "number": (("user", 0.35), ("assistant", 0.22), ("tool", 0.43)),
    "path": (("user", 0.3), ("assistant", 0.25), ("tool", 0.45)),
    "error": (("tool", 0.75), ("user", 0.15), ("assistant", 0.1)),
    "name": (("user", 0.45), ("assistant", 0.2), ("tool", 0.35)),
    "constraint": (("user", 0.72), ("tool", 0.28)),
    "identifier": (("user", 0.35), ("assistant", 0.2), ("tool", 0.45)),
    "date": (("user", 0.5), ("assistant", 0.2), ("tool", 0.3)),
}
_PLAIN = frozenset({"number", "path", "name", "identifier", "date"})
_MODE_WEIGHTS: dict[str, dict[str, float]] = {
    "plain": {
        "marker": 3.0,
        "no_old": 2.0,
        "aside": 2.0,
        "silent": 2.0,
        "self": 1.0,
        "after_tool": 1.6,
        "tool": 1.4,
    },
    "decision": {
        "marker": 3.0,
        "no_old": 1.5,
        "silent": 1.0,
        "self": 1.5,
        "after_tool": 1.2,
        "tool": 1.0,
    },
    "preference": {"marker": 3.0, "no_old": 2.0, "silent": 2.0},
    "constraint": {"marker": 3.0, "no_old": 1.5, "silent": 1.2, "tool": 1.0},
}


@dataclass(slots=True)
class _Plan:
    """A fact to plant: about what, when, by whom; then its correction, and its values."""

    number: int
    topic: _Topic
    at: float
    voice: str
    fix_at: float | None = None
    mode: str = ""
    fix_voice: str = ""
    planted: bool = False
    fixed: bool = False
    planted_episode: int = -1
    template: str = ""  # the planting template, so a silent restatement can pick another
    old: str = ""
    new: str = ""

    @property
    def kind(self) -> str:
        return self.topic.kind


@dataclass(slots=True)
class _Item:
    """A statement due in an episode: a planting, or a correction."""

    plan: _Plan
    fix: bool

    @property
    def voice(self) -> str:
        return self.plan.fix_voice if self.fix else self.plan.voice


def _weighted(r: random.Random, pairs: Sequence[tuple[str, float]]) -> str:
    return r.choices([p[0] for p in pairs], [p[1] for p in pairs])[0]


def _old(number: int) -> str:
    return f"§{number}o§"


def _new(number: int) -> str:
    return f"§{number}n§"


_SLOT = re.compile(r"§(\d+)([on])§")


# -- how facts are said: plantings ---------------------------------------------------------

_PLANT: dict[tuple[str, str], tuple[str, ...]] = {
    ("number", "user"): (
        "Quick context: {s} sits at {v} right now, so size things accordingly.",
        "Numbers-wise, {s} - {v}.",
        "As of this morning {s} was {v}; {who} confirmed it.",
        "Bear in mind we're working with {v} for {s}.",
        "{v}. That's {s}, in case it comes up.",
        "I checked {s} on my end and it reads {v}.",
        "The figure you want for {s} is {v}.",
        "If it matters, {s} came out to {v} in the last review.",
    ),
    ("number", "assistant"): (
        "Confirmed - {s} is {v}; I'll carry that forward.",
        "To be explicit, I'm using {v} as {s}.",
        "The output puts {s} at {v}.",
        "Got it: {v} for {s}.",
        "One number to keep: {s} is {v}.",
    ),
    ("path", "user"): (
        "The file for {s} is {v} - not in the usual place.",
        "Grab {s} from {v}.",
        "{S} got moved; it lives at {v} now.",
        "Path for {s}: {v}",
        "When you save {s}, use {v} so the team can find it.",
        "{v} is {s}, should you need to open it.",
    ),
    ("path", "assistant"): (
        "I saved {s} to {v}.",
        "Confirmed {s} is at {v}.",
        "{S} -> {v} (checked that it exists).",
        "Heads-up for later: {s} is {v}.",
    ),
    ("name", "user"): (
        "Our contact for {s} is {v}.",
        "{v} owns {s}, so route questions there.",
        "Heads up, {s} is {v} as of this week.",
        "If anyone asks who {s} is: {v}.",
        "Please cc {v} ({s}) on anything that goes out.",
    ),
    ("name", "assistant"): (
        "Noted {v} as {s}.",
        "Per the directory, {s} is {v}.",
        "I'll loop in {v}, who is {s}.",
    ),
    ("identifier", "user"): (
        "Reference for {s}: {v}.",
        "Tag everything with {v}; that's {s}.",
        "The id you'll need for {s} is {v}.",
        "{S} has the id {v}, keep it handy.",
        "It's filed as {v} ({s}).",
    ),
    ("identifier", "assistant"): (
        "Filed - {s} is {v}.",
        "I've logged it under {v} ({s}).",
        "The system assigned {v} to {s}.",
    ),
    ("date", "user"): (
        "{S} lands on {v}.",
        "Pencil in {v} for {s}.",
        "We're targeting {v} for {s}, and that's firm.",
        "Reminder that {s} is {v}, so plan backwards from there.",
        "{S}: {v}. Don't let that slip.",
    ),
    ("date", "assistant"): (
        "I've got {s} down as {v}.",
        "Booked in: {s} on {v}.",
        "Working back from {s} ({v}), we still have some slack.",
    ),
    ("error", "user"): (
        "When I try it on my side it bails out with: {v}",
        "Same thing again - {v}. That's {s}.",
        "Pasting what I see for {s}: `{v}`",
        "{S} reads `{v}` word for word.",
    ),
    ("error", "assistant"): (
        "The call failed with `{v}`, which is {s}.",
        "That attempt ended in {v}; logging it as {s}.",
        "For the timeline: {s} is {v}.",
    ),
    ("decision", "user"): (
        "We're going with {v} for {s} - {why}.",
        "Call made on {s}: {v}. Reason: {why}.",
        "After the sync we landed on {v} for {s}; {why}.",
        "{v} it is for {s}, mainly because {why}.",
        "Let's not overthink {s}: {v}, since {why}.",
    ),
    ("decision", "assistant"): (
        "My recommendation for {s} is {v} ({why}); I'll proceed on that basis unless you object.",
        "Settled on {v} for {s}: {why}.",
        "I'd pick {v} for {s} given that {why} - going ahead.",
    ),
}
_PREFERENCE_WRAPS = (
    "{stmt}",
    "{stmt}",
    "One thing about how I work: {stmt}",
    "Before I forget - {stmt}",
    "{stmt} Thanks in advance.",
)
_CONSTRAINT_WRAPS = (
    "{stmt}",
    "{stmt}",
    "Non-negotiable: {stmt}",
    "Rule from {team}: {stmt}",
    "{stmt} Please don't work around it.",
)
_MENTIONS = (
    "Worth noting the {f} in that output; I'll keep it in mind.",
    "The {f} field above is the one we'll need later.",
    "That output also gives {s}, which we needed.",
    "I've made a note of {s} from that result.",
)

# -- how facts are said: corrections ---------------------------------------------------------

_FIX_PLAIN: dict[str, tuple[str, ...]] = {
    "marker": (
        "Scratch that - {s} is {v}.",
        "My mistake, it should be {v} for {s}.",
        "Update: {s} is now {v}.",
        "No wait, {s} isn't {o}. It's {v}.",
        "Turns out {s} is {v}; I was looking at an old version.",
        "Revised: {s} = {v}.",
        "{o} is out, {v} is in - for {s}.",
        "We're switching {s} from {o} to {v}.",
        "Hold on, I had {s} wrong: {v}, not {o}.",
        "Small but important: {s} changed to {v} as of this morning.",
    ),
    "no_old": (
        "Ignore what I told you earlier about {s}; {v} is correct.",
        "Whatever you have noted for {s}, overwrite it with {v}.",
        "What I gave you for {s} was off - go with {v}.",
        "Please update {s} in your notes: {v}.",
        "Correction to something from earlier: {s} is {v}.",
    ),
    "aside": (
        "Can you also pull the {w} report for {day}? It'll look different now that {s} is {v}, "
        "which {who} changed yesterday.",
        "While you're in there, check the {w} figures - and since {s} moved to {v}, anything "
        "downstream needs redoing.",
        "I'm off to a call with {who} about the {w} thing (oh, {s} is {v} now, btw), back in "
        "{n} minutes.",
        "Run the {w} check again with {s} at {v} this time and tell me what moves.",
        "{who} asked whether the {w} summary reflects {s} being {v} - does it?",
    ),
    "self": (
        "Correction on my side: {s} is {v}, not {o}.",
        "I need to fix something I said earlier: {s} is {v}.",
        "Revised: {s} is {v}. I'll use that from here on.",
        "Re-checking my notes, {s} should read {v} rather than {o}.",
    ),
    "after_tool": (
        "That output shows I had {s} wrong - it's {v}, not {o}. Updating my notes.",
        "Note the revision flag above: {s} is now {v}, so I'll stop using the old value.",
        "Per the latest record, {s} changed; it reads {v} at this point.",
        "Good thing we looked: turns out {s} is {v}. Everything downstream uses that now.",
    ),
}
_FIX_DECISION: dict[str, tuple[str, ...]] = {
    "marker": (
        "We're switching from {o} to {v} for {s}: {why}.",
        "{o} is out, {v} is in for {s} - {why}.",
        "No wait, let's do {v} for {s} after all. {Why}.",
        "Scratch the earlier call on {s}. New plan: {v}, because {why}.",
        "Update: we got overruled on {s}; it's {v} now since {why}.",
    ),
    "no_old": (
        "Forget the earlier plan for {s}; we're doing {v} now since {why}.",
        "New direction on {s}: {v}. Reason: {why}.",
    ),
    "self": (
        "I'm reversing my recommendation on {s}: {v} instead of {o}, because {why}.",
        "Revised plan for {s}: {v} - {why}.",
    ),
    "after_tool": (
        "Given what that output shows, {o} won't work for {s}; switching to {v} because {why}.",
        "That changes things: for {s} I'm moving to {v}, since {why}.",
    ),
}
_FIX_PREFERENCE: dict[str, tuple[str, ...]] = {
    "marker": (
        "Actually, I've changed my mind on {s}: {v}, please.",
        "Update on {s} - {v} going forward.",
        "For {s}: {o} is out, {v} is in.",
        "Scratch my earlier request about {s}; make it {v}.",
        "No wait - {v} for {s}, not {o}. Sorry for the back-and-forth.",
    ),
    "no_old": (
        "Disregard my earlier ask on {s}. {v} works better for me.",
        "New preference for {s}: {v}.",
    ),
}
_FIX_CONSTRAINT: dict[str, tuple[str, ...]] = {
    "marker": (
        "Revised: {s} is now {v}.",
        "Update from {team}: the rule on {s} changed - it's {v}, not {o}.",
        "Turns out {s} is {v}; {who} corrected me.",
        "Scratch that constraint on {s}: it's {v} now.",
    ),
    "no_old": ("The rule on {s} was updated this morning; it's {v} now.",),
}


class _Fields(Mapping[str, str]):
    """Template fields: the fact's own first, then fresh noise values by name."""

    def __init__(self, own: Mapping[str, str], noise: _Noise) -> None:
        self.own = own
        self.noise = noise

    def __getitem__(self, key: str) -> str:
        if key in self.own:
            return self.own[key]
        return self.noise[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.own)

    def __len__(self) -> int:
        return len(self.own)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# -- noise -------------------------------------------------------------------------------------


class _Noise:
    """Fresh random filler by name (``"{who} ran {n} jobs"``): people, numbers, ids, paths."""

    def __init__(self, r: random.Random, kit: _Kit) -> None:
        self.r = r
        self.kit = kit
        self.month = r.randint(1, 12)
        self.year = r.choice((2024, 2025))
        self.first_day = r.randint(1, 18)
        self._makers: dict[str, Callable[[], str]] = {
            "who": lambda: _person(r),
            "first": lambda: r.choice(_FIRST),
            "org": lambda: _org(r),
            "team": lambda: r.choice(kit.TEAMS),
            "n": lambda: str(r.randint(2, 60)),
            "nn": lambda: str(r.randint(100, 9_999)),
            "big": lambda: f"{r.randint(1_000, 480_000):,}",
            "pct": lambda: f"{r.randint(1, 99)}%",
            "ms": lambda: f"{r.randint(2, 2_400)}ms",
            "sec": lambda: f"{r.uniform(0.2, 90):.1f}s",
            "ts": self.timestamp,
            "iso": lambda: self.timestamp()[:10],
            "hh": lambda: f"{r.randint(0, 23):02d}:{r.choice((0, 10, 20, 30, 40, 50)):02d}",
            "day": lambda: r.choice(_WEEKDAYS),
            "hex": lambda: _hexes(r, 8),
            "sha": lambda: _hexes(r, 12),
            "w": lambda: r.choice(kit.WORDS),
            "W": lambda: r.choice(kit.WORDS).capitalize(),
            "path": self.path,
            "ver": lambda: f"{r.randint(1, 6)}.{r.randint(0, 40)}.{r.randint(0, 19)}",
            "ip": lambda: f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(2, 254)}",
            "city": lambda: r.choice(_NOISE_CITIES),
            "usd": lambda: f"${r.randint(3, 9_800):,}.{r.randint(0, 99):02d}",
            "eur": lambda: f"€{r.randint(3, 9_800):,}.{r.randint(0, 99):02d}",
            "gbp": lambda: f"£{r.randint(3, 9_800):,}.{r.randint(0, 99):02d}",
            "ref": lambda: f"{r.choice(('op', 'tx', 'rq', 'ev'))}-{_hexes(r, 10)}",
            "port": lambda: str(r.choice((443, 8080, 8443, 5432, 6379, 9090, 3000, 9200))),
            "month": lambda: r.choice(_MONTHS),
            "stepn": lambda: f"{r.randint(1, 40) * 500:,}",
            "next": lambda: kit.next_step(),
        }
        for name, values in kit.EXTRA.items():
            self._makers[name] = _picker(r, values)

    def __getitem__(self, name: str) -> str:
        return self._makers[name]()

    def __call__(self, template: str, **own: str) -> str:
        """``template`` with its fields filled: ``own`` values first, fresh noise otherwise."""
        return template.format_map(_Fields(own, self))

    def timestamp(self) -> str:
        r = self.r
        day = self.first_day + r.randint(0, 9)
        return (
            f"{self.year}-{self.month:02d}-{day:02d}T{r.randint(0, 23):02d}:"
            f"{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z"
        )

    def path(self) -> str:
        r = self.r
        root = r.choice(self.kit.ROOTS)
        parts = "/".join(r.choice(self.kit.WORDS) for _ in range(r.randint(1, 2)))
        return f"{root}/{parts}-{r.randint(1, 99)}.{r.choice(self.kit.EXTS)}"

    def call_id(self, style: str) -> str:
        alphabet = string.ascii_letters + string.digits
        if style == "anthropic":
            return "toolu_01" + "".join(self.r.choice(alphabet) for _ in range(22))
        return "call_" + "".join(self.r.choice(alphabet) for _ in range(24))


def _picker(r: random.Random, values: Sequence[str]) -> Callable[[], str]:
    return lambda: r.choice(values)


def _until(make: Callable[[], str], size: int, head: Sequence[str] = ()) -> list[str]:
    """Lines of ``make`` after ``head`` until about ``size`` tokens."""
    lines = list(head)
    total = sum(_TOKENS.count(line) + 1 for line in lines)
    while total < size:
        line = make()
        lines.append(line)
        total += _TOKENS.count(line) + 1
    return lines


def _scatter(r: random.Random, lines: list[str], extra: Sequence[str], *, middle: bool) -> str:
    """``lines`` joined, with each of ``extra`` at a random line boundary.

    With ``middle``, only inner boundaries: facts in tool output sit among the
    noise, not at its edges.
    """
    out = list(lines)
    for line in extra:
        if middle and len(out) >= 4:
            out.insert(r.randint(1, len(out) - 1), line)
        else:
            out.insert(r.randint(0, len(out)), line)
    return "\n".join(out)


# -- what a tool result carries --------------------------------------------------------------


@dataclass(slots=True)
class _Plant:
    """A statement a tool result carries: a fact, its correction, or a stale-value flag.

    ``what`` is ``plant`` (a value), ``stmt`` (a decision's or constraint's
    sentence), ``change`` (old and new values), ``hint`` (the stored value is
    stale, no value shown) or ``error`` (the result is the failure).
    """

    what: str
    topic: _Topic
    value: str = ""
    old: str = ""
    stmt: str = ""


# -- the builder ------------------------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    args: dict[str, Any]


@dataclass(slots=True)
class _Result:
    call_id: str
    content: str
    error: bool = False


@dataclass(slots=True)
class _Turn:
    role: str  # system, user, assistant, results
    text: str | None = None
    calls: list[_Call] = field(default_factory=list)
    results: list[_Result] = field(default_factory=list)


class _Builder:
    """One conversation: a plan of facts, episodes of work around them, then the values."""

    def __init__(self, domain: str, seed: int, rng: random.Random) -> None:
        self.domain = domain
        self.seed = seed
        self.r = rng
        self.style = style_of(domain, seed)
        kit_type = _KITS[domain]
        self.kit = kit_type(rng)
        self.noise = _Noise(rng, self.kit)
        self.kit.noise = self.noise
        self.turns: list[_Turn] = []
        self.count = 0
        self.tool_count = 0
        self.chat_count = 0
        self.chat_tokens = 0
        self.tokens = 0
        self.episode = 0
        index = DOMAINS.index(domain)
        tier = _TIERS[(5 * index + seed) % len(_TIERS)]
        self.target_tokens = tier * rng.uniform(0.95, 1.05)
        self.target_count = rng.randint(232, 358)
        self.dump_at = rng.uniform(0.1, 0.8)
        self.dumps = 0

    # -- planning -----------------------------------------------------------------------

    def _plan(self) -> list[_Plan]:
        r = self.r
        pools = {kind: list(topics) for kind, topics in self.kit.topics().items()}
        for topics in pools.values():
            r.shuffle(topics)
        wanted = r.randint(20, 40)
        chosen = [pools[kind].pop() for kind in KINDS]
        while len(chosen) < wanted:
            kinds = [k for k in KINDS if pools[k]]
            kind = r.choices(kinds, [_KIND_WEIGHTS[k] for k in kinds])[0]
            chosen.append(pools[kind].pop())
        r.shuffle(chosen)
        plans = [
            _Plan(n, topic, r.uniform(0.02, 0.93), _weighted(r, _VOICES[topic.kind]))
            for n, topic in enumerate(chosen)
        ]
        fixable = [p for p in plans if p.kind != "error" and p.at < 0.72]
        used: list[str] = []
        for plan in r.sample(fixable, min(len(fixable), r.randint(3, 6))):
            plan.fix_at = r.uniform(plan.at + 0.1, 0.97)
            group = plan.kind if plan.kind in _MODE_WEIGHTS else "plain"
            weights = _MODE_WEIGHTS[group]
            fresh = [(m, w) for m, w in weights.items() if m not in used]
            plan.mode = _weighted(r, fresh or list(weights.items()))
            used.append(plan.mode)
            plan.fix_voice = self._fix_voice(plan)
        return plans

    @staticmethod
    def _fix_voice(plan: _Plan) -> str:
        if plan.mode in ("marker", "no_old", "aside"):
            return "user"
        if plan.mode in ("self", "after_tool"):
            return "assistant"
        if plan.mode == "tool":
            return "tool"
        # silent: the same voice restates it (preferences and constraints: the user)
        return plan.voice if plan.kind in _PLAIN or plan.kind == "decision" else "user"

    def _due(self, plans: list[_Plan], progress: float, final: bool) -> list[_Item]:
        due: list[_Item] = []
        for plan in plans:
            if not plan.planted and (plan.at <= progress or final):
                plan.planted = True
                plan.planted_episode = self.episode
                due.append(_Item(plan, False))
            elif (
                plan.fix_at is not None
                and plan.planted
                and not plan.fixed
                and plan.planted_episode < self.episode
                and (plan.fix_at <= progress or final)
            ):
                plan.fixed = True
                due.append(_Item(plan, True))
        return due

    # -- bookkeeping ----------------------------------------------------------------------

    def _add(self, turn: _Turn) -> None:
        self.turns.append(turn)
        if turn.role == "results":
            n = len(turn.results) if self.style == "openai" else 1
            self.count += n
            self.tool_count += n
            self.tokens += sum(_TOKENS.count(res.content) + 8 for res in turn.results)
            return
        size = _TOKENS.count(turn.text or "") + 5
        size += sum(_TOKENS.count(json.dumps(c.args)) + 10 for c in turn.calls)
        self.count += 1
        self.tokens += size
        if turn.role != "system":
            self.chat_count += 1
            self.chat_tokens += size

    def _size(self, *, failing: bool = False) -> int:
        """How big the next tool result is, steering the total towards the target."""
        r = self.r
        left = max(1, self.target_count - self.count)
        share = self.tool_count / self.count if self.count > 40 else 0.42
        share = min(max(share, 0.25), 0.6)
        chat_mean = self.chat_tokens / self.chat_count if self.chat_count > 10 else 75.0
        tools_left = max(1.0, left * share)
        need = (self.target_tokens - self.tokens - left * (1 - share) * chat_mean) / tools_left
        need = min(max(need, 50.0), 2_600.0)
        if not failing:
            chance = 0.1 if need > 1_200 else 0.05 if need > 650 else 0.02 if need > 300 else 0.005
            overdue = not self.dumps and self.count >= self.dump_at * self.target_count
            if overdue or r.random() < chance:
                self.dumps += 1
                return r.randint(3_000, 5_400)
        size = need * math.exp(r.gauss(0.0, 0.7) - 0.245)
        return int(min(max(size, 50.0), 700.0 if failing else 1_500.0))

    # -- statements ------------------------------------------------------------------------

    def _own(self, plan: _Plan, value: str, old: str = "") -> dict[str, str]:
        topic = plan.topic
        why = self.r.choice(topic.why) if topic.why else ""
        return {
            "s": topic.subject,
            "S": _cap(topic.subject),
            "v": value,
            "o": old,
            "f": topic.field,
            "why": why,
            "Why": _cap(why),
        }

    def _statement(self, item: _Item) -> str:
        """The sentence a user or the assistant says to plant or correct a fact."""
        r, plan = self.r, item.plan
        kind, voice = plan.kind, item.voice
        old, new = _old(plan.number), _new(plan.number)
        if not item.fix:
            return self._plant_sentence(plan, voice, old)
        if plan.mode == "silent":
            return self._plant_sentence(plan, voice, new, avoid=plan.template)
        own = self._own(plan, new, old)
        if kind == "decision":
            templates = _FIX_DECISION[plan.mode]
        elif kind == "preference":
            templates = _FIX_PREFERENCE[plan.mode]
        elif kind == "constraint":
            templates = _FIX_CONSTRAINT[plan.mode]
        else:
            templates = _FIX_PLAIN[plan.mode]
        return self.noise(r.choice(templates), **own)

    def _plant_sentence(self, plan: _Plan, voice: str, value: str, avoid: str = "") -> str:
        r, topic = self.r, plan.topic
        own = self._own(plan, value)
        if topic.says:
            options = [t for t in topic.says if t != avoid] or list(topic.says)
            template = r.choice(options)
            plan.template = plan.template or template
            stmt = self.noise(template, **own)
            wraps = _PREFERENCE_WRAPS if topic.kind == "preference" else _CONSTRAINT_WRAPS
            return self.noise(r.choice(wraps), stmt=stmt)
        options = [t for t in _PLANT[(topic.kind, voice)] if t != avoid]
        template = r.choice(options or _PLANT[(topic.kind, voice)])
        plan.template = plan.template or template
        return self.noise(template, **own)

    def _plant_for_tool(self, item: _Item) -> _Plant:
        """What a tool result carries for a due item."""
        plan, topic = item.plan, item.plan.topic
        old, new = _old(plan.number), _new(plan.number)
        if not item.fix:
            if topic.kind == "error":
                return _Plant("error", topic, old)
            if topic.kind in ("decision", "constraint"):
                return _Plant("stmt", topic, old, stmt=self._tool_stmt(plan, old))
            return _Plant("plant", topic, old)
        if plan.mode == "silent":
            if topic.kind in ("decision", "constraint"):
                return _Plant("stmt", topic, new, stmt=self._tool_stmt(plan, new))
            return _Plant("plant", topic, new)
        # mode "tool": the change itself
        if topic.kind == "decision":
            why = self.r.choice(topic.why)
            stmt = f"DECISION UPDATED - {topic.subject}: {new} replaces {old}; rationale: {why}"
            return _Plant("stmt", topic, new, old, stmt=stmt)
        if topic.kind == "constraint":
            stmt = self.r.choice(
                (
                    f"POLICY UPDATE: {topic.subject} changed from {old} to {new}",
                    f"Amended rule ({self.noise['iso']}): {topic.subject} is now {new} "
                    f"(previously {old})",
                )
            )
            return _Plant("stmt", topic, new, old, stmt=stmt)
        return _Plant("change", topic, new, old)

    def _tool_stmt(self, plan: _Plan, value: str) -> str:
        topic, r = plan.topic, self.r
        own = self._own(plan, value)
        if topic.kind == "constraint":
            return self.noise(r.choice(topic.says), **own)
        return self.noise(
            r.choice(
                (
                    "{S}: {v} (rationale: {why})",
                    "decided to use {v} for {s}, because {why}",
                    "{v} approved for {s} - {why}",
                )
            ),
            **own,
        )

    def _compose_user(self, ask: str, sentences: list[str]) -> str:
        """A user message: the ask and details, with fact sentences among them."""
        r, kit = self.r, self.kit
        details = kit.details(r.choice((0, 1, 1, 2, 2, 3)))
        shape = r.random()
        if sentences and shape < 0.22:
            # a pasted note, the facts in its middle
            note = kit.note_lines(r.randint(5, 12))
            for sentence in sentences:
                note.insert(r.randint(1, len(note) - 1), sentence)
            intro = self.noise(r.choice(_PASTE_INTROS))
            return f"{intro}\n\n" + "\n".join(f"> {line}" for line in note) + f"\n\n{ask}"
        if (sentences or details) and shape < 0.45:
            items = details + sentences
            r.shuffle(items)
            if len(items) < 3:
                items += kit.details(3 - len(items))
            lead = self.noise(r.choice(_LIST_LEADS))
            return f"{ask}\n\n{lead}\n" + "\n".join(f"- {item}" for item in items)
        parts = [ask, *details]
        for sentence in sentences:
            parts.insert(r.randint(1, len(parts)), sentence)
        return " ".join(parts)

    def _compose_report(self, sentences: list[str], *, worked: bool) -> str:
        """An assistant report, with fact sentences in it (prose, a list, or confirmation first)."""
        r, kit = self.r, self.kit
        body = kit.reports(r.randint(1, 3) if worked else 1)
        shape = r.random()
        if sentences and shape < 0.3:
            items = body + sentences
            r.shuffle(items)
            lead = r.choice(("Status:", "Where things stand:", "Summary so far:", "Update:"))
            return lead + "\n" + "\n".join(f"{i + 1}. {item}" for i, item in enumerate(items))
        if sentences and shape < 0.5:
            return " ".join([*sentences, *body])
        parts = list(body)
        for sentence in sentences:
            parts.insert(r.randint(0, len(parts)), sentence)
        return " ".join(parts)

    # -- episodes ---------------------------------------------------------------------------

    def _episode(self, due: list[_Item]) -> None:
        r, kit = self.r, self.kit
        user_items = [i for i in due if i.voice == "user"]
        tool_items = [i for i in due if i.voice == "tool"]
        after = [i for i in due if i.fix and i.plan.mode == "after_tool"]
        spoken = [i for i in due if i.voice == "assistant" and i not in after]
        user_lines = [self._statement(i) for i in user_items]
        asides = [s for s, i in zip(user_lines, user_items, strict=True) if i.plan.mode == "aside"
                  and i.fix]  # fmt: skip
        if not tool_items and not after and r.random() < 0.15:
            text = kit.chatter()
            if user_lines:
                text = self._compose_user(text, [s for s in user_lines if s not in asides])
                if asides:
                    text = " ".join([text, *asides])
            self._add(_Turn("user", text))
            reply = kit.chatter_reply()
            if spoken:
                reply = self._compose_report([self._statement(i) for i in spoken], worked=False)
            self._add(_Turn("assistant", reply))
            return
        ask = kit.ask()
        if asides:
            ask = " ".join([ask, *asides])
        plain = [s for s in user_lines if s not in asides]
        self._add(_Turn("user", self._compose_user(ask, plain)))
        if r.random() < 0.08 and not tool_items and not after:
            # a clarifying question first
            self._add(_Turn("assistant", kit.question()))
            self._add(_Turn("user", kit.answer()))
        if tool_items or after:
            rounds = r.choice((1, 1, 2, 2, 3))
        else:
            rounds = r.choices((0, 1, 2, 3, 4), (0.12, 0.38, 0.3, 0.14, 0.06))[0]
        where: dict[int, list[_Plant]] = {}
        for item in tool_items:
            where.setdefault(r.randrange(rounds), []).append(self._plant_for_tool(item))
        for item in after:
            where.setdefault(rounds - 1, []).append(_Plant("hint", item.plan.topic))
        mentions: list[str] = []
        for round_ in range(rounds):
            plants = where.get(round_, [])
            calls = self._calls(plants)
            preamble = kit.preamble() if r.random() < 0.3 else None
            self._add(_Turn("assistant", preamble, calls=calls))
            self._add(_Turn("results", results=self._results(calls, plants)))
            for plant in plants:
                if plant.what == "plant" and r.random() < 0.45:
                    own = {"f": plant.topic.field, "s": plant.topic.subject}
                    mentions.append(self.noise(r.choice(_MENTIONS), **own))
        sentences = [self._statement(i) for i in spoken]
        fixes = [self._statement(i) for i in after]
        report = self._compose_report(sentences + mentions, worked=rounds > 0)
        if fixes:
            report = " ".join([*fixes, report]) if r.random() < 0.6 else " ".join([report, *fixes])
        self._add(_Turn("assistant", report))
        if r.random() < 0.1:
            self._add(_Turn("user", kit.chatter()))
            self._add(_Turn("assistant", kit.chatter_reply()))

    def _calls(self, plants: list[_Plant]) -> list[_Call]:
        r = self.r
        errors = sum(p.what == "error" for p in plants)
        others = len(plants) > errors
        n = r.choices((1, 2, 3, 4), (0.62, 0.26, 0.09, 0.03))[0]
        n = max(n, errors + (1 if others else 0))
        calls = []
        for _ in range(n):
            name, args = self.kit.call()
            calls.append(_Call(self.noise.call_id(self.style), name, args))
        return calls

    def _results(self, calls: list[_Call], plants: list[_Plant]) -> list[_Result]:
        r, kit = self.r, self.kit
        errors = [p for p in plants if p.what == "error"]
        others = [p for p in plants if p.what != "error"]
        slots = list(range(len(calls)))
        r.shuffle(slots)
        failing = {slots.pop(): p for p in errors}
        carrying: dict[int, list[_Plant]] = {}
        for plant in others:
            carrying.setdefault(r.choice(slots), []).append(plant)
        results = []
        for n, call in enumerate(calls):
            if n in failing:
                body = kit.fail(call.name, call.args, failing[n].value, self._size(failing=True))
                results.append(_Result(call.id, body, True))
                continue
            content = kit.result(call.name, call.args, self._size(), carrying.get(n, []))
            results.append(_Result(call.id, content))
        return results

    # -- the whole conversation ---------------------------------------------------------------

    def build(self) -> tuple[Conversation, list[tuple[str, str, str]]]:
        plans = self._plan()
        self._add(_Turn("system", self.kit.system()))
        while True:
            final = self.count >= self.target_count - 12
            due = self._due(plans, self.count / self.target_count, final)
            self._episode(due)
            self.episode += 1
            if final and all(p.planted and (p.fix_at is None or p.fixed) for p in plans):
                break
        self._add(_Turn("user", self.kit.wrap_up()))
        messages = _render(self.turns, self.style, self.r)
        self._draw(plans, messages)
        where: dict[str, int] = {}
        for index, message in enumerate(messages):
            for match in _SLOT.finditer(text_of(message)):
                where.setdefault(match.group(0), index)
        values: dict[str, str] = {}
        facts = []
        for plan in plans:
            values[_old(plan.number)] = plan.old
            fact = Fact(
                plan.kind, plan.old, where[_old(plan.number)], plan.topic.subject, plan.voice
            )
            if plan.fix_at is not None:
                values[_new(plan.number)] = plan.new
                fact = Fact(
                    plan.kind,
                    plan.old,
                    fact.index,
                    plan.topic.subject,
                    plan.voice,
                    old_key=plan.old,
                    new_key=plan.new,
                    corrected_at=where[_new(plan.number)],
                )
            facts.append(fact)
        messages = [_fill(m, values) for m in messages]
        facts.sort(key=lambda f: f.index)
        modes = [(p.topic.subject, p.mode, p.fix_voice) for p in plans if p.fix_at is not None]
        conversation = Conversation(
            self.domain, self.seed, self.style, messages, facts, call_points(messages)
        )
        return conversation, modes

    def _draw(self, plans: list[_Plan], messages: list[dict[str, Any]]) -> None:
        """Draw every value so that none occurs anywhere else, nor inside another value."""
        text = _SLOT.sub("\n", "\n".join(text_of(m) for m in messages)).lower()
        taken: list[str] = []
        for plan in plans:
            plan.old = self._value(plan.topic, text, taken)
            taken.append(plan.old.lower())
            if plan.fix_at is not None:
                plan.new = self._value(plan.topic, text, taken)
                taken.append(plan.new.lower())

    def _value(self, topic: _Topic, text: str, taken: list[str]) -> str:
        for _ in range(300):
            value = topic.draw(self.r)
            low = value.lower()
            if (
                len(value) >= 4
                and not value.isdigit()
                and '"' not in value
                and "\\" not in value
                and low not in text
                and all(low not in t and t not in low for t in taken)
            ):
                return value
        raise _Collision(f"no unique value for {topic.subject!r}")


def _fill(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _SLOT.sub(lambda m: values[m.group(0)], value) if "§" in value else value
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    return value


def _render(turns: list[_Turn], style: str, r: random.Random) -> list[dict[str, Any]]:
    """The turns as OpenAI Chat or Anthropic Messages dicts."""
    out: list[dict[str, Any]] = []
    for turn in turns:
        if turn.role == "system":
            out.append({"role": "system", "content": turn.text})
        elif turn.role == "user":
            if style == "openai":
                out.append({"role": "user", "content": turn.text})
            else:
                out.append({"role": "user", "content": [{"type": "text", "text": turn.text}]})
        elif turn.role == "assistant" and style == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": turn.text}
            if turn.calls:
                message["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(call.args, ensure_ascii=False),
                        },
                    }
                    for call in turn.calls
                ]
            out.append(message)
        elif turn.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if turn.text:
                blocks.append({"type": "text", "text": turn.text})
            blocks += [
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.args}
                for call in turn.calls
            ]
            out.append({"role": "assistant", "content": blocks})
        elif style == "openai":
            out += [
                {"role": "tool", "tool_call_id": res.call_id, "content": res.content}
                for res in turn.results
            ]
        else:
            blocks = []
            for res in turn.results:
                content: Any = res.content
                if r.random() < 0.35:
                    content = [{"type": "text", "text": res.content}]
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": res.call_id,
                    "content": content,
                }
                if res.error:
                    block["is_error"] = True
                blocks.append(block)
            out.append({"role": "user", "content": blocks})
    return out


_PASTE_INTROS = (
    "Forwarding the notes {who} sent after the {w} sync:",
    "Pasting the relevant bit of the thread with {who}:",
    "Here's what came in from {team} this morning:",
    "From the handover doc (written by {who}):",
    "Copying the email from {who} below, it has the context:",
)
_LIST_LEADS = (
    "A few things:",
    "Context, in no particular order:",
    "Some details that might matter:",
    "Notes:",
    "Also:",
)

# -- tool output: how a carried statement looks in each shape ------------------------------------


def _line(noise: _Noise, shape: str, plant: _Plant, component: str) -> str:
    """The line(s) of text-shaped tool output that carry ``plant``.

    ``shape`` is ``log`` (timestamped lines), ``kv`` (config or key-value
    output), ``prose`` (documents), ``row`` (a table: the first two cells
    are a label and a value) or ``diff`` (a redline or patch).
    """
    r, topic = noise.r, plant.topic
    own = {
        "s": topic.subject,
        "S": _cap(topic.subject),
        "f": topic.field,
        "v": plant.value,
        "o": plant.old,
        "stmt": plant.stmt,
        "c": component,
    }
    options: dict[str, tuple[str, ...]]
    if plant.what == "hint":
        options = {
            "log": ("{ts} WARN  {c}: stored {f} is stale (record revised {ts}, rev {n})",),
            "kv": ("# WARNING: {f} differs from the current record (revised {iso})",),
            "prose": ("Note: the value of {s} in older copies of this record is superseded.",),
            "row": ("{S} | (revised - stored copy is stale) | {iso}",),
            "diff": ("! {f}: revised upstream since your copy",),
        }
    elif plant.what == "stmt":
        label = "DECISION" if topic.kind == "decision" else "POLICY"
        options = {
            "log": ("{ts} NOTICE {c}: {stmt}", "{ts} INFO  change-log: " + label + " {stmt}"),
            "kv": ("# " + label + ": {stmt}", label.lower() + ": {stmt}"),
            "prose": ("{stmt_cap}.", "Recorded " + label.lower() + ": {stmt}."),
            "row": (label.capitalize() + " | {stmt} | {iso}",),
            "diff": ("+ " + label + ": {stmt}",),
        }
        own["stmt_cap"] = _cap(plant.stmt)
    elif plant.what == "change":
        options = {
            "log": (
                "{ts} AUDIT {c}: {f} changed {o} -> {v} by {who}",
                "{ts} INFO  {c}: updated {s} to {v} (was {o})",
            ),
            "kv": ("{f}: {v}   # was {o}, changed {iso}", "{f} = {v}  (previous: {o})"),
            "prose": ("As amended, {s} is {v} (previously {o}).",),
            "row": ("{S} | {v} | was {o}",),
            "diff": ("- {f}: {o}\n+ {f}: {v}",),
        }
    else:
        options = {
            "log": (
                "{ts} INFO  {c}: {f}={v}",
                "{ts} NOTICE {c}: resolved {s} to {v}",
                "{ts} INFO  {c}: using {v} for {s}",
            ),
            "kv": ("{f}: {v}", "{f} = {v}   # {s}", "{f}: {v}  # set by {first}"),
            "prose": (
                "Per this record, {s} is {v}.",
                "{S}: {v}.",
                "The document gives {s} as {v}.",
            ),
            "row": ("{S} | {v} | {iso}",),
            "diff": ("+ {f}: {v}",),
        }
    return noise(r.choice(options[shape]), **own)


def _fields(noise: _Noise, plant: _Plant) -> list[tuple[str, str]]:
    """The JSON fields of a record that carry ``plant``."""
    topic = plant.topic
    if plant.what == "hint":
        return [
            ("warning", f"{topic.field} was revised after your last sync; cached value is stale")
        ]
    if plant.what == "stmt":
        return [("decision" if topic.kind == "decision" else "policy", plant.stmt)]
    if plant.what == "change":
        return [
            (topic.field, plant.value),
            (f"{topic.field}_previous", plant.old),
            ("changed_by", noise["who"]),
        ]
    return [(topic.field, plant.value)]


# -- domains -------------------------------------------------------------------------------------


class _Kit:
    """A domain's content: prompts, asks, reports, tools, their output and its fact topics."""

    SYSTEM = ""
    TEAMS: tuple[str, ...] = ()
    WORDS: tuple[str, ...] = ()
    ROOTS: tuple[str, ...] = ()
    EXTS: tuple[str, ...] = ()
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {}
    ASKS: tuple[str, ...] = ()
    DETAILS: tuple[str, ...] = ()
    NOTES: tuple[str, ...] = ()
    REPORTS: tuple[str, ...] = ()
    PREAMBLES: tuple[str, ...] = ()
    QUESTIONS: tuple[str, ...] = ()
    TOOLS: tuple[tuple[str, float], ...] = ()
    CHATTER = (
        "ok, thanks",
        "Give me {n} minutes, {first} is at my desk.",
        "Nice, that's progress.",
        "Hmm. Let me think about that.",
        "Can you recap where we are in two lines?",
        "Back. Sorry, that meeting ran long.",
        "Good. Keep going.",
        "Wait, are you sure about the last part?",
        "I'm on mobile for the next hour, keep replies short.",
        "lol ok",
        "That matches what {first} said this morning.",
        "Right, and then what?",
        "Perfect, ty.",
    )
    CHATTER_REPLIES = (
        "Sure.",
        "Recap: we've gone through {n} items; next up is {next}.",
        "Yes - I double-checked it against the output above. Next I'll look at {next}.",
        "No rush. When you're back I'll pick up with {next}.",
        "Understood, I'll keep it short.",
        "Of course. The open item is {next}.",
        "Will do.",
    )
    ANSWERS = (
        "The first one, please.",
        "Either is fine, your call.",
        "Go with the second option.",
        "Just do what's fastest for now.",
        "Yes, go ahead.",
    )
    WRAP_UPS = (
        "That's it for today. Write me a handover: what we decided, every number, name, id, "
        "path and date that matters, open problems, and what's next.",
        "Please close this out with a full recap I can forward - decisions with reasons, "
        "key figures, owners, references and deadlines.",
        "Before I log off: one message with everything the next person needs to pick this "
        "up tomorrow, including anything we changed along the way.",
    )

    def __init__(self, rng: random.Random) -> None:
        self.r = rng
        self.noise: _Noise

    def topics(self) -> dict[str, list[_Topic]]:
        raise NotImplementedError

    def system(self) -> str:
        return self.noise(self.SYSTEM)

    def ask(self) -> str:
        return self.noise(self.r.choice(self.ASKS))

    def details(self, k: int) -> list[str]:
        return self._distinct(self.DETAILS, k)

    def note_lines(self, k: int) -> list[str]:
        return self._distinct(self.NOTES + self.DETAILS, k)

    def reports(self, k: int) -> list[str]:
        return self._distinct(self.REPORTS, k)

    def _distinct(self, pool: Sequence[str], k: int) -> list[str]:
        """``k`` sentences from distinct templates of ``pool`` (repeats only past its size)."""
        picked = self.r.sample(pool, min(k, len(pool)))
        picked += [self.r.choice(pool) for _ in range(k - len(picked))]
        return [self.noise(t) for t in picked]

    def preamble(self) -> str:
        return self.noise(self.r.choice(self.PREAMBLES))

    def question(self) -> str:
        return self.noise(self.r.choice(self.QUESTIONS))

    def answer(self) -> str:
        return self.noise(self.r.choice(self.ANSWERS))

    def chatter(self) -> str:
        return self.noise(self.r.choice(self.CHATTER))

    def chatter_reply(self) -> str:
        return self.noise(self.r.choice(self.CHATTER_REPLIES), next=self.next_step())

    def next_step(self) -> str:
        return self.noise(self.r.choice(self.NEXT))

    NEXT: tuple[str, ...] = ("the next item",)

    def wrap_up(self) -> str:
        return self.r.choice(self.WRAP_UPS)

    def call(self) -> tuple[str, dict[str, Any]]:
        name = _weighted(self.r, self.TOOLS)
        return name, self.args(name)

    def args(self, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def result(self, name: str, args: dict[str, Any], size: int, plants: list[_Plant]) -> str:
        raise NotImplementedError

    def fail(self, name: str, args: dict[str, Any], key: str, size: int) -> str:
        raise NotImplementedError

    # shared output shapes

    def lines(
        self,
        size: int,
        templates: Sequence[str],
        plants: Sequence[_Plant],
        shape: str,
        component: str,
        head: Sequence[str] = (),
    ) -> str:
        """Text output: lines of ``templates`` to ``size`` tokens, carrying ``plants``."""
        noise, r = self.noise, self.r
        body = _until(lambda: noise(r.choice(templates)), size, [noise(h) for h in head])
        extra = [_line(noise, shape, p, component) for p in plants]
        if head:
            rest = _scatter(r, body[len(head) :], extra, middle=True)
            return "\n".join([*body[: len(head)], rest])
        return _scatter(r, body, extra, middle=True)

    def table(
        self,
        size: int,
        columns: Sequence[str],
        cell: Callable[[str], str],
        plants: Sequence[_Plant],
        footer: str = "",
    ) -> str:
        """A pipe table to ``size`` tokens; plants become rows (label and value first)."""
        noise, r = self.noise, self.r
        head = [" | ".join(columns), " | ".join("-" * len(c) for c in columns)]
        body = _until(lambda: " | ".join(cell(c) for c in columns), size, head)
        extra = []
        for plant in plants:
            line = _line(noise, "row", plant, "")
            cells = line.count(" | ") + 1
            extra.append(line + " | -" * max(0, len(columns) - cells))
        text = "\n".join(body[:2]) + "\n" + _scatter(r, body[2:], extra, middle=True)
        return text + ("\n" + noise(footer) if footer else "")

    def record(self, base: dict[str, Any], plants: Sequence[_Plant], spot: str = "") -> str:
        """A JSON record with the plants' fields inside (under ``spot`` when given)."""
        noise, r = self.noise, self.r
        fields: list[tuple[str, str]] = []
        for plant in plants:
            fields += _fields(noise, plant)
        target: dict[str, Any] = base
        if spot:
            target = base.setdefault(spot, {})
        items = list(target.items())
        for key, value in fields:
            items.insert(r.randint(min(1, len(items)), len(items)), (key, value))
        target.clear()
        target.update(items)
        return json.dumps(base, indent=2, ensure_ascii=False)

    def rows_json(self, size: int, make: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
        """Records from ``make`` until their JSON is about ``size`` tokens."""
        rows: list[dict[str, Any]] = []
        total = 40
        while total < size:
            row = make()
            rows.append(row)
            total += _TOKENS.count(json.dumps(row, indent=2, ensure_ascii=False)) + 2
        return rows

    def prose(self, size: int, sentences: Sequence[str], plants: Sequence[_Plant]) -> str:
        """Paragraphs of ``sentences`` to ``size`` tokens, with the plants' sentences inside."""
        noise, r = self.noise, self.r

        def paragraph() -> str:
            return " ".join(noise(r.choice(sentences)) for _ in range(r.randint(2, 5)))

        paragraphs = _until(paragraph, size)
        for plant in plants:
            sentence = _line(noise, "prose", plant, "")
            n = r.randrange(len(paragraphs))
            parts = re.split(r"(?<=[.!?])\s+", paragraphs[n])
            parts.insert(r.randint(0, len(parts)), sentence)
            paragraphs[n] = " ".join(parts)
        return "\n\n".join(paragraphs)


_KITS: dict[str, type[_Kit]] = {}


def _error_output(noise: _Noise, key: str, size: int, head: Sequence[str], lines: Sequence[str],
                  tail: Sequence[str] = ()) -> str:  # fmt: skip
    """A failure: ``head`` (``KEY`` is the error), context lines to ``size``, ``tail``."""
    body = _until(lambda: noise(noise.r.choice(lines)), max(40, size - 40))
    keep = body[: max(2, len(body) // 2)] if len(body) > 2 else body
    return "\n".join([*(h.replace("KEY", key) for h in head), *keep, *tail])


# -- incident: infrastructure incident response ----------------------------------------------

_INC_WORDS = (
    "checkout", "ledger", "ingress", "cart", "search", "auth", "quota", "replica", "pool",
    "shard", "probe", "rollout", "canary", "node", "egress", "mesh", "cache", "queue", "cron",
    "backup",
)  # fmt: skip
_INC_SVCS = (
    "checkout", "ledger-api", "search-edge", "auth-gw", "ingest", "cart", "inventory-sync",
    "notifier", "pricing", "profile", "media-resizer", "recs",
)  # fmt: skip
_INC_RULES = ("require-limits", "no-latest-tag", "restricted-psp", "signed-images", "team-label")


def _incident_error(*which: int) -> Draw:
    """Error strings of the patterns numbered ``which`` (those that fit the subject)."""

    def draw(r: random.Random) -> str:
        ip = f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(2, 254)}"
        options = (
            "OOMKilled (exit code 137)",
            f"dial tcp {ip}:{r.choice((5432, 6379, 8443, 9092))}: i/o timeout",
            "x509: certificate has expired",
            "Error acquiring the state lock",
            "CrashLoopBackOff",
            f"{r.choice(_INC_RULES)} policy violation",
            f"Readiness probe failed: HTTP {r.choice((502, 503, 504))}",
        )
        return options[r.choice(which)]

    return draw


class _Incident(_Kit):
    SYSTEM = (
        "You are the on-call copilot for the platform SRE team of an online marketplace. Tools: "
        "kubectl(command, context) runs read-only kubectl; terraform(dir, command) runs plan, "
        "show or state list (never apply); query_metrics(query, range) queries Prometheus; "
        "search_runbooks(query) searches the runbook wiki; pagerduty(action, incident) reads "
        "incidents and their log entries; grafana_panel(dashboard, panel) returns a panel's "
        "data points. Keep a timeline with UTC timestamps, state one hypothesis at a time, "
        "prefer reversible mitigations, and ask the incident commander before anything that "
        "writes. Clusters: {cluster} and {cluster}; mesh: Istio 1.{n}; alerts go to #inc-bridge."
    )
    TEAMS = ("the platform team", "the payments squad", "the SRE guild", "the CAB", "security",
             "the DBA group")  # fmt: skip
    WORDS = _INC_WORDS
    ROOTS = ("infra/envs/prod", "deploy/charts", "/var/log/pods", "monitoring/dashboards",
             "ops/scripts")  # fmt: skip
    EXTS = ("yaml", "tf", "json", "log", "sh")
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {
        "svc": _INC_SVCS,
        "ns": ("prod-eu", "prod-us", "platform", "edge", "data", "payments"),
        "cluster": ("prod-eu-west-1", "prod-us-east-2", "shared-ops", "dr-eu-central"),
        "region": ("eu-west-1", "us-east-2", "eu-central-1", "ap-southeast-1"),
        "code": ("500", "502", "503", "504", "429"),
        "panel": ("Error ratio", "Latency p99", "Saturation", "Pod restarts", "Queue depth"),
    }
    ASKS = (
        "Alert fired for {svc}: 5xx at {pct}. What's going on?",
        "Can you check whether the {svc} rollout in {ns} finished?",
        "p99 on {svc} is {ms} against a usual {ms}. Dig in?",
        "Pull the last {n} minutes of logs for {svc}.",
        "Is the terraform for {w} drifted from what's live?",
        "Check node pressure on {cluster}, {first} thinks we're out of memory.",
        "What does the runbook say about {w} saturation?",
        "Who else got paged for this? Look at the incident in PagerDuty.",
        "Compare error rates before and after the {hh} deploy.",
        "Any certificate trouble on the {w} ingress?",
        "Look at the {svc} dashboard and tell me what's abnormal.",
        "Can we safely scale {svc} up? Check quotas first.",
    )
    DETAILS = (
        "It started around {hh} UTC.",
        "{who} is on the bridge from {team}.",
        "Customers in {region} noticed first.",
        "Version {ver} went out this morning.",
        "Grafana shows {big} requests per minute at the peak.",
        "Last time this happened was {n} days ago, see {ref}.",
        "The canary looked fine for {n} minutes.",
        "Don't touch {ns} yet, {first} is mid-migration there.",
        "Status page is still green, oddly.",
        "The dashboard JSON is in {path}.",
        "{first} restarted two pods at {hh} before escalating.",
    )
    NOTES = (
        "{hh} - {first} acked the page",
        "{hh} - error ratio on {svc} at {pct}",
        "{hh} - rolled {svc} to {ver}, no change",
        "Action: {first} to check the {w} pool config",
        "Open question: is {region} affected too?",
        "{hh} - {code}s from the {w} ingress, {big} in ten minutes",
    )
    REPORTS = (
        "The {svc} pods in {ns} show {n} restarts in the last hour; the latest exit came {sec} "
        "after start.",
        "Error ratio peaked at {pct} around {hh} and is trending down.",
        "Terraform shows {n} resources drifted, none of them in the {w} module.",
        "Hypothesis: the {w} pool is saturated - {n} of {n} connections in use.",
        "Nothing abnormal on {cluster}; node memory tops out at {pct}.",
        "Step {n} of the runbook applies: cordon the bad node and watch the {w} queue.",
        "Timeline updated: {hh} deploy, {hh} first {code}s, {hh} page.",
        "I'd hold off on scaling until the {w} metrics settle.",
        "Latency on {svc} is back to {ms} at p99.",
    )
    PREAMBLES = (
        "Checking the pods and the metrics together.",
        "Pulling logs.",
        "Let me look at the terraform state.",
        "Querying Prometheus.",
        "Looking up the runbook.",
    )
    QUESTIONS = (
        "Do you want me to start with {svc} or with the ingress?",
        "Should I include {cluster} or only {cluster}?",
    )
    NEXT = ("the {svc} logs", "the ingress metrics", "the terraform drift", "the runbook for {w}")
    TOOLS = (
        ("kubectl", 4.0),
        ("terraform", 1.8),
        ("query_metrics", 3.0),
        ("search_runbooks", 1.4),
        ("pagerduty", 1.2),
        ("grafana_panel", 1.5),
    )

    def topics(self) -> dict[str, list[_Topic]]:
        w = _INC_WORDS
        return {
            "number": _topics(
                "number",
                [
                    ("the HPA max replicas for checkout", _count(40, 480, "replicas")),
                    ("the burn-rate alert threshold", _decimal(2.1, 14.4, 1, "x")),
                    ("the p99 latency SLO", _count(180, 1_900, "ms")),
                    ("the payments DB connection pool size", _comma(1_000, 6_000)),
                    ("the node group's max size", _count(24, 300, "nodes")),
                    ("the public API rate limit", _comma(1_200, 40_000, " rps")),
                    ("the disk usage alert threshold", _percent(71, 94)),
                    ("the peak 5xx ratio during the incident", _percent(0.3, 9.9, 2)),
                ],
            ),
            "path": _topics(
                "path",
                [
                    (
                        "the runbook for the checkout outage",
                        _shape("runbooks/{w}/{w}-{w}-recovery.md", w),
                    ),
                    (
                        "the Terraform module for the VPC",
                        _shape("infra/modules/{w}-vpc-{D2}/main.tf", w),
                    ),
                    (
                        "the Helm values file for prod",
                        _shape("deploy/charts/{w}/values-prod-{w}.yaml", w),
                    ),
                    ("the postmortem draft", _shape("docs/postmortems/{Y}-{M}-{w}-{w}.md", w)),
                    ("the alert rules file", _shape("monitoring/rules/{w}_{w}_alerts.yml", w)),
                    ("the kubeconfig for the DR cluster", _shape("~/.kube/{w}-dr-{D2}.yaml", w)),
                ],
            ),
            "name": _topics(
                "name",
                [
                    ("the incident commander", _person),
                    ("the database on-call", _person),
                    ("the CDN vendor with the degraded POP", _org),
                    ("the service owner for payments", _person),
                    ("the comms lead for the status page", _person),
                ],
            ),
            "identifier": _topics(
                "identifier",
                [
                    ("the incident ticket", _shape("INC-{D5}")),
                    ("the bad deploy's image tag", _shape("sha-{X7}")),
                    ("the change request", _shape("CHG{D7}")),
                    ("the PagerDuty incident", _shape("Q{A6}")),
                    ("the Terraform state lock id", _shape("{X8}-{X4}-{X4}")),
                ],
            ),
            "date": _topics(
                "date",
                [
                    ("the change freeze start", _day),
                    ("the postmortem review", _day),
                    ("the edge certificate expiry", _day),
                    ("the DR failover test", _day),
                    ("the kernel patch window", _day),
                ],
            ),
            "error": _topics(
                "error",
                [
                    ("the error the rollout is stuck on", _incident_error(4, 5, 6)),
                    ("the terraform plan failure", _incident_error(1, 3)),
                    ("what the readiness probe reports", _incident_error(1, 2, 6)),
                    ("the crash in the checkout pods", _incident_error(0, 1, 4)),
                ],
            ),
            "constraint": _said(
                "constraint",
                [
                    (
                        "the change window",
                        lambda r: (lambda h: f"{h:02d}:00-{h + 2:02d}:00 UTC")(r.randint(0, 21)),
                        (
                            "Nothing gets applied to prod outside {v}; that's the CAB rule.",
                            "Prod changes only happen in the {v} window, full stop.",
                        ),
                    ),
                    (
                        "the drain limit",
                        _count(2, 9, "nodes"),
                        ("Never drain more than {v} at a time, the PDBs are tight.",),
                    ),
                    (
                        "the protected namespace",
                        _shape("{w}-critical", w),
                        ("Hands off the {v} namespace unless the IC says otherwise.",),
                    ),
                    (
                        "the daily spend ceiling for extra capacity",
                        _cash("$", 1_200, 25_000),
                        ("Any scale-up costing more than {v} a day needs finance sign-off.",),
                    ),
                ],
            ),
            "decision": _choices_topics(
                [
                    (
                        "the mitigation",
                        (
                            "rolling back to the previous ReplicaSet",
                            "failing over to the secondary region",
                            "shedding non-critical traffic",
                            "pinning the old image digest",
                        ),
                        (
                            "it's the fastest reversible option",
                            "the last deploy is the only change in the window",
                            "the primary control plane is unhealthy",
                        ),
                    ),
                    (
                        "the rollout strategy going forward",
                        (
                            "blue-green with manual promotion",
                            "Argo canary in 5% steps",
                            "surge-only rolling updates",
                        ),
                        (
                            "it gives us a clean abort path",
                            "it caught the last two regressions in staging",
                            "it keeps capacity flat during deploys",
                        ),
                    ),
                    (
                        "where postmortem action items are tracked",
                        ("the SRE Jira board", "a Linear project", "GitHub issues in infra-live"),
                        ("that's where the owners already look", "it links to the deploy history"),
                    ),
                    (
                        "the alerting approach",
                        (
                            "multi-window burn-rate alerts",
                            "static p99 thresholds",
                            "anomaly detection on request volume",
                        ),
                        ("it pages less for blips", "the SLO doc asks for it"),
                    ),
                ]
            ),
            "preference": _said(
                "preference",
                [
                    (
                        "the format of status updates",
                        _choice(
                            "a TL;DR line first",
                            "one bullet per workstream",
                            "timestamps on every line",
                        ),
                        (
                            "Status updates: {v}, please - people skim these on their phones.",
                            "Format status updates with {v}.",
                        ),
                    ),
                    (
                        "the timezone for the timeline",
                        _choice(
                            "Pacific time",
                            "Central European time",
                            "Singapore time",
                            "Eastern time",
                        ),
                        ("Put timeline entries in {v}; the execs read it there.",),
                    ),
                    (
                        "how commands are shared",
                        _choice(
                            "copy-pasteable one-liners",
                            "commands with --dry-run=server first",
                            "one script per step",
                        ),
                        ("When you suggest commands, give me {v}.",),
                    ),
                    (
                        "the default graph window",
                        _choice("six-hour windows", "24-hour windows", "90-minute windows"),
                        ("Default graphs to {v} unless I say otherwise.",),
                    ),
                ],
            ),
        }

    def args(self, name: str) -> dict[str, Any]:
        n, r = self.noise, self.r
        if name == "kubectl":
            command = n(
                r.choice(
                    (
                        "get pods -n {ns} -o wide",
                        "describe deploy/{svc} -n {ns}",
                        "logs deploy/{svc} -n {ns} --since={n}m",
                        "get events -n {ns} --sort-by=.lastTimestamp",
                        "get configmap {svc}-config -n {ns} -o yaml",
                    )
                )
            )
            return {"command": command, "context": n["cluster"]}
        if name == "terraform":
            return {
                "dir": n("infra/envs/prod/{w}"),
                "command": r.choice(("plan -refresh-only", "state list", "show -no-color")),
            }
        if name == "query_metrics":
            svc = n["svc"]
            query = r.choice(
                (
                    f'sum(rate(http_requests_total{{service="{svc}",code=~"5.."}}[5m]))',
                    f"histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_"
                    f'bucket{{service="{svc}"}}[5m])))',
                    f'container_memory_working_set_bytes{{namespace="{n["ns"]}"}}',
                )
            )
            return {"query": query, "range": r.choice(("30m", "1h", "3h", "6h"))}
        if name == "search_runbooks":
            return {"query": n("{w} {w} mitigation")}
        if name == "pagerduty":
            return {"action": "get_incident", "incident": "P" + n.r.choice(_SAFE_UPPER) + n["nn"]}
        return {"dashboard": n("{svc}-overview"), "panel": n["panel"]}

    def result(self, name: str, args: dict[str, Any], size: int, plants: list[_Plant]) -> str:
        n, r = self.noise, self.r
        if name == "kubectl":
            command = str(args.get("command", ""))
            if command.startswith("get pods"):
                head = ["NAME                              READY   STATUS    RESTARTS   AGE   IP"]
                return self.lines(
                    size,
                    ("{svc}-{hex}-{hex}   1/1     Running   {n}          {n}h   {ip}",
                     "{svc}-{hex}-{hex}   0/1     Pending   0          {n}m   <none>",
                     "{svc}-{hex}-{hex}   1/1     Running   0          {n}d   {ip}"),
                    plants, "kv", "deploy", head,
                )  # fmt: skip
            if command.startswith("logs") or command.startswith("get events"):
                return self.lines(
                    size,
                    ('{ts} level=info msg="request served" svc={svc} status=200 dur={ms}',
                     '{ts} level=warn msg="slow upstream" upstream={svc} dur={ms}',
                     "{ts} Normal   Pulled     pod/{svc}-{hex}   image already present",
                     "{ts} Warning  BackOff    pod/{svc}-{hex}   back-off {n}s",
                     '{ts} level=error msg="upstream reset" peer={ip}:{port} retry={n}'),
                    plants, "log", n["svc"],
                )  # fmt: skip
            return self.lines(
                size,
                ("  {w}.replicas: {n}", "  {w}_timeout_ms: {nn}", "  {w}_endpoint: {ip}:{port}",
                 "    Limits: cpu {n}00m, memory {nn}Mi", "  image: registry.internal/{svc}:{ver}",
                 "  Annotation ops/{w}-owner: {first}"),
                plants, "kv", "configmap",
                ("Name:         {svc}", "Namespace:    {ns}", "Labels:       team={w}"),
            )  # fmt: skip
        if name == "terraform":
            return self.lines(
                size,
                ("  # aws_autoscaling_group.{w}_{n} will be updated in-place",
                 "      ~ desired_capacity = {n} -> {n}",
                 '      ~ tags             = {{ "owner" = "{first}" }}',
                 "  # aws_security_group_rule.{w}_{hex} has changed outside of Terraform",
                 "module.{w}.aws_db_instance.{w}", "module.{w}.aws_lb_listener.https_{n}",
                 "      ~ instance_type    = m6i.{n}xlarge -> m6i.{n}xlarge"),
                plants, "kv", "terraform",
                ("Refreshing state... [id={hex}]", "Terraform used the selected providers."),
            )  # fmt: skip
        if name == "query_metrics":
            series = self.rows_json(
                size,
                lambda: {
                    "metric": {"service": n["svc"], "pod": n("{svc}-{hex}"), "code": n["code"]},
                    "values": [[n["nn"] + "." + n["n"], f"{r.uniform(0, 90):.3f}"]
                               for _ in range(r.randint(3, 9))],
                },
            )  # fmt: skip
            base: dict[str, Any] = {
                "status": "success",
                "data": {"resultType": "matrix", "result": series},
            }
            if plants:
                base["annotations"] = {"source": n("grafana/{w}"), "query_ms": n["ms"]}
            return self.record(base, plants, "annotations" if plants else "")
        if name == "search_runbooks":
            return self.prose(
                size,
                (
                    "## Step {n}: check {w} saturation",
                    "Run `kubectl top pods -n {ns}` and compare against the limits in {path}.",
                    "If the {w} queue is above {big}, page {team}.",
                    "Escalate after {n} minutes without improvement.",
                    "Last reviewed by {who} on {iso}.",
                    "Rollbacks are done with `helm rollback {svc} {n}`.",
                ),
                plants,
            )
        if name == "pagerduty":
            entries = self.rows_json(
                size,
                lambda: {
                    "type": r.choice(("notify", "acknowledge", "annotate", "escalate")),
                    "at": n["ts"],
                    "agent": n["who"],
                    "summary": n(r.choice(("Paged {first} via SMS", "Escalated to {team}",
                                           "{first} added a note: {w} looks off"))),
                },
            )  # fmt: skip
            base = {
                "id": args.get("incident"),
                "title": n("[{code}] {svc} error budget burn"),
                "urgency": "high",
                "status": r.choice(("triggered", "acknowledged")),
                "log_entries": entries,
            }
            return self.record(base, plants)
        return self.table(
            size,
            ("time", "value", "series", "threshold"),
            lambda c: {"time": n["ts"], "value": f"{r.uniform(0, 99):.2f}", "series": n["svc"],
                       "threshold": n["n"]}[c],
            plants,
            footer="panel '{panel}' - {n} series, step 30s",
        )  # fmt: skip

    def fail(self, name: str, args: dict[str, Any], key: str, size: int) -> str:
        n = self.noise
        if name == "terraform":
            return _error_output(
                n, key, size,
                ["╷", "│ Error: KEY", "│"],
                ["│   with module.{w}.aws_{w}.{w}_{n},", "│   on {w}.tf line {nn}:",
                 "│ Retry after {n}s or check the {w} backend."],
                ["╵"],
            )  # fmt: skip
        if name == "kubectl":
            return _error_output(
                n, key, size,
                ["Error from server: KEY"],
                ["  Warning  {w}Failed  {n}s  kubelet  {svc}-{hex}: see events",
                 "  Normal   Scheduled  {n}m  default-scheduler  assigned to {ip}"],
            )  # fmt: skip
        body = json.dumps({"status": "error", "errorType": "execution", "error": "KEY"})
        return _error_output(n, key, size, [body], ["retry hint: {ms} backoff, attempt {n}"])


# -- legal: contract review ------------------------------------------------------------------------

_LEGAL_WORDS = (
    "indemnity", "liability", "termination", "renewal", "confidentiality", "warranty",
    "assignment", "payment", "audit", "subprocessor", "notice", "schedule", "exhibit",
    "insurance", "escrow", "service-levels", "transfer", "severability",
)  # fmt: skip


def _legal_error(*which: int) -> Draw:
    """Error strings of the patterns numbered ``which`` (those that fit the subject)."""

    def draw(r: random.Random) -> str:
        words = ("ANCHOR", "TAB", "SIGNER", "RECIPIENT", "ROUTING", "FIELD", "TEMPLATE")
        states = ("MISSING", "LOCKED", "EXPIRED", "MISMATCH", "INVALID", "DUPLICATE")
        options = (
            f"ENVELOPE_{r.choice(words)}_{r.choice(states)}",
            f"IndexShardFailure on shard {r.randint(2, 40)}",
            f"CLM-{_digits(r, 4)}: record locked",
            f"OCR confidence {r.randint(21, 58)}% below threshold",
            "PDF/A validation failed",
        )
        return options[r.choice(which)]

    return draw


class _Legal(_Kit):
    SYSTEM = (
        "You are a contract-review assistant for an in-house legal team. Tools: "
        "search_documents(query, matter), read_clause(doc, section), compare_versions(doc, "
        "base, revised), lookup_party(name), list_obligations(contract), "
        "calendar_deadlines(matter). Quote clause text exactly with its section number, flag "
        "deviations from the playbook, never give a final legal opinion, and mark anything "
        "that needs partner review. Current matter: renewal of the master services agreement "
        "with {party}, with two data processing addenda and an order form."
    )
    TEAMS = ("procurement", "the privacy office", "finance", "the partner", "the deal desk",
             "compliance")  # fmt: skip
    WORDS = _LEGAL_WORDS
    ROOTS = ("matters/archive", "dms://legal", "shared/contracts", "templates/clauses")
    EXTS = ("docx", "pdf", "txt", "msg")
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {
        "party": ("Brightfold Media", "Castor Freight", "Delmont Pharma", "Everly Retail",
                  "Fairhaven Bank", "Gorse Analytics"),
        "doc": ("MSA", "DPA", "SOW-3", "NDA", "Order Form 2", "Amendment 1"),
        "sec": ("4.2", "7.1(b)", "9.3", "12.4", "14.1", "3.5(c)", "18.2", "6.6"),
        "role": ("Supplier", "Customer", "Processor", "Controller", "Licensor"),
        "year_note": ("2022", "2023", "old", "short-form"),
    }  # fmt: skip
    ASKS = (
        "Can you find every place the {doc} talks about {w}?",
        "Read me clause {sec} of the {doc} and tell me if it's off-playbook.",
        "What changed in {w} between the last two drafts?",
        "Look up {party} in the registry - who signs for them?",
        "List the obligations in the {doc} that fall on us.",
        "Which deadlines do we have on this matter in the next {n} days?",
        "Is their {w} wording stricter than ours?",
        "Summarise the {w} section for {first}, who hasn't seen it.",
        "Do the {doc} and the {doc} contradict each other on {w}?",
        "Check whether the {w} carve-outs survive termination.",
        "Pull the precedent we used with {party} last year.",
    )
    DETAILS = (
        "{who} from {team} needs this by {day}.",
        "Their counsel sent a new draft at {hh}.",
        "We used the {year_note} template last time.",
        "The {doc} runs to {n} pages plus schedules.",
        "There are {n} open comments from {first}.",
        "Section {sec} was the sticking point in the last round.",
        "The old draft is at {path}.",
        "Total contract value is around {eur} per month, ballpark.",
        "{first} flagged the {w} language as aggressive.",
    )
    NOTES = (
        "{party} accepted our {w} wording in principle",
        "Open: {w} cap still under discussion",
        "Their redline removed section {sec}",
        "{first} to circulate a clean copy by {day}",
        "Call with their counsel at {hh}, {n} minutes",
    )
    REPORTS = (
        "Section {sec} deviates from the playbook in {n} places; the most material is the "
        "{w} carve-out.",
        "I found {n} hits for {w} across the {doc} and its schedules.",
        "The redline between the drafts touches {n} clauses; {n} are substantive.",
        "Their {w} language is broader than ours: it adds indirect losses.",
        "{party}'s registry entry lists {n} directors; none match the signature block.",
        "Obligations on our side: {n}, of which {n} have hard dates.",
        "Flagging section {sec} for partner review.",
        "No conflict between the {doc} and the {doc} on {w}.",
    )
    PREAMBLES = ("Searching the documents.", "Pulling the clause and the redline.",
                 "Checking the registry.", "Listing the obligations.")  # fmt: skip
    QUESTIONS = ("Should I compare against the {doc} or the playbook?",
                 "Do you want the full clause text or just the deviations?")  # fmt: skip
    NEXT = ("clause {sec}", "the {w} schedule", "the obligations list", "the redline")
    TOOLS = (
        ("search_documents", 3.0),
        ("read_clause", 3.5),
        ("compare_versions", 1.6),
        ("lookup_party", 1.2),
        ("list_obligations", 1.5),
        ("calendar_deadlines", 1.0),
    )

    def topics(self) -> dict[str, list[_Topic]]:
        w = _LEGAL_WORDS
        return {
            "number": _topics(
                "number",
                [
                    ("the liability cap", _cash("€", 250_000, 9_000_000)),
                    ("the late payment interest rate", _percent(1.5, 9.5, 2)),
                    ("the termination notice period", _count(31, 180, "days")),
                    ("the annual fee in the renewal", _cash("$", 40_000, 2_400_000)),
                    ("the service credit for missed uptime", _percent(2, 25)),
                    ("the indemnity basket", _cash("£", 10_000, 500_000)),
                    ("the uptime commitment", lambda r: f"99.{r.randint(50, 99)}%"),
                ],
            ),
            "path": _topics(
                "path",
                [
                    (
                        "the clean redline",
                        _shape("matters/{D4}-{w}/redlines/MSA_v{D1}_clean.docx", w),
                    ),
                    ("the signed NDA", _shape("dms://signed/NDA-{D5}.pdf")),
                    (
                        "the negotiation playbook",
                        _shape("legal/playbooks/{w}-{w}-playbook-{Y}.pdf", w),
                    ),
                    ("the DPA draft", _shape("shared/{w}/DPA_draft{D1}_{L4}.docx", w)),
                    ("the closing checklist", _shape("matters/{D4}/closing/checklist_{w}.xlsx", w)),
                ],
            ),
            "name": _topics(
                "name",
                [
                    ("the counterparty's general counsel", _person),
                    ("the supervising partner", _person),
                    ("the subprocessor flagged in the DPA", _org),
                    ("the signatory on our side", _person),
                    ("the guarantor entity", _org),
                ],
            ),
            "identifier": _topics(
                "identifier",
                [
                    ("the matter number", _shape("M-{D4}-{D3}")),
                    ("the contract id in the CLM", _shape("CLM-{A3}-{D5}")),
                    ("the DocuSign envelope", _shape("{X8}-{X4}-{X4}")),
                    ("the counterparty's registration number", _shape("HRB {D6}")),
                    ("the purchase order in schedule 2", _shape("PO{D8}")),
                ],
            ),
            "date": _topics(
                "date",
                [
                    ("the renewal deadline", _day),
                    ("the signing date", _day),
                    ("the amendment's effective date", _day),
                    ("the deadline for their comments", _day),
                    ("the opt-out notice cut-off", _day),
                ],
            ),
            "error": _topics(
                "error",
                [
                    ("the error the e-signature upload returns", _legal_error(0, 4)),
                    ("what the CLM import fails with", _legal_error(2, 3)),
                    ("the error from the document search index", _legal_error(1, 3)),
                ],
            ),
            "constraint": _said(
                "constraint",
                [
                    (
                        "the acceptable governing law",
                        _choice(
                            "Irish law",
                            "Swiss law",
                            "English law",
                            "Dutch law",
                            "Delaware law",
                        ),
                        (
                            "We only accept {v} as governing law; anything else goes to "
                            "the partner.",
                            "Governing law has to be {v}. That one isn't up for negotiation.",
                        ),
                    ),
                    (
                        "the maximum liability we accept",
                        _cash("€", 100_000, 5_000_000),
                        ("No uncapped exposure - our ceiling is {v}.",),
                    ),
                    (
                        "the longest non-solicit we accept",
                        _count(4, 24, "months"),
                        ("Non-solicit can't run longer than {v}; that's HR policy.",),
                    ),
                    (
                        "the CFO approval threshold",
                        _cash("$", 250_000, 3_000_000),
                        ("Anything over {v} in total contract value needs the CFO's signature.",),
                    ),
                ],
            ),
            "decision": _choices_topics(
                [
                    (
                        "our position on the indemnity clause",
                        (
                            "a mutual indemnity capped at fees",
                            "accepting their carve-outs",
                            "an IP-only indemnity",
                        ),
                        (
                            "it's what we agreed with them in 2022",
                            "the playbook allows it",
                            "their insurer won't cover more",
                        ),
                    ),
                    (
                        "the dispute resolution forum",
                        (
                            "ICC arbitration in Geneva",
                            "LCIA arbitration",
                            "the courts of Amsterdam",
                        ),
                        ("enforcement is simpler across borders", "both sides have counsel there"),
                    ),
                    (
                        "how we handle auto-renewal",
                        (
                            "a 90-day opt-out window",
                            "striking auto-renewal entirely",
                            "annual renewal by written consent",
                        ),
                        ("finance wants a checkpoint every year", "procurement asked for it"),
                    ),
                    (
                        "the data transfer mechanism",
                        (
                            "the SCCs module two",
                            "an intra-group agreement",
                            "the EU-US Data Privacy Framework",
                        ),
                        ("their subprocessors sit in the US", "it's already signed group-wide"),
                    ),
                ]
            ),
            "preference": _said(
                "preference",
                [
                    (
                        "the redline format",
                        _choice(
                            "tracked changes with margin comments",
                            "a separate issues list",
                            "compare PDFs",
                        ),
                        (
                            "Send redlines as {v}; that's what the partner reads.",
                            "I like {v} for redlines.",
                        ),
                    ),
                    (
                        "how clause references are written",
                        _choice(
                            "section-sign references",
                            "Clause 4.2(b) style",
                            "schedule-first references",
                        ),
                        ("Please write clause references using {v}.",),
                    ),
                    (
                        "the shape of summaries",
                        _choice(
                            "two-column risk tables",
                            "RAG-rated bullet points",
                            "one paragraph per party",
                        ),
                        ("Summaries work best for me as {v}.",),
                    ),
                ],
            ),
        }

    def args(self, name: str) -> dict[str, Any]:
        n = self.noise
        if name == "search_documents":
            return {"query": n("{w} {w}"), "matter": n("M-{nn}")}
        if name == "read_clause":
            return {"doc": n["doc"], "section": n["sec"]}
        if name == "compare_versions":
            return {"doc": n["doc"], "base": f"v{self.r.randint(1, 5)}", "revised": "latest"}
        if name == "lookup_party":
            return {"name": n["party"]}
        if name == "list_obligations":
            return {"contract": n("CT-{nn}")}
        return {"matter": n("M-{nn}")}

    def result(self, name: str, args: dict[str, Any], size: int, plants: list[_Plant]) -> str:
        n, r = self.noise, self.r
        if name == "search_documents":
            return self.lines(
                size,
                ('{n}. {doc} §{sec} (score 0.{nn}) - "...the {role} shall {w} within {n} days..."',
                 '{n}. {doc} Schedule {n} (score 0.{nn}) - "...subject to the {w} cap in {sec}..."',
                 '{n}. email from {who} {iso} - "re: {w} wording, see attached"'),
                plants, "prose", "search",
            )  # fmt: skip
        if name == "read_clause":
            return self.prose(
                size,
                (
                    "{sec} The {role} shall maintain {w} insurance of not less than {eur}.",
                    "Neither party shall be liable for {w} losses arising under this Agreement.",
                    "Notices under clause {sec} must be given in writing to the address in "
                    "Schedule {n}.",
                    "The {role} may audit compliance once in any {n}-month period.",
                    "This clause survives termination for {n} years.",
                    "Subject to clause {sec}, the {role} indemnifies the other against {w} claims.",
                    "Fees are payable within {n} days of a valid invoice.",
                ),
                plants,
            )
        if name == "compare_versions":
            return self.lines(
                size,
                ("- {sec} The {role} shall {w} within {n} days.",
                 "+ {sec} The {role} shall {w} within {n} business days.",
                 "  {sec} (unchanged) Notices to {who}, {city}.",
                 "~ comment [{first}]: why is {w} deleted?"),
                plants, "diff", "redline",
                ("Comparing {doc} v{n} -> latest ({n} changes)",),
            )  # fmt: skip
        if name == "lookup_party":
            base = {
                "name": args.get("name"),
                "registered_office": n("{n} {W} Street, {city}"),
                "incorporated": n["iso"],
                "directors": [n["who"] for _ in range(r.randint(2, 5))],
                "filings": self.rows_json(
                    size, lambda: {"date": n["iso"], "type": n("{W} return"), "ref": n["ref"]}
                ),
            }
            return self.record(base, plants)
        if name == "list_obligations":
            return self.table(
                size,
                ("obligation", "owner", "due", "clause", "status"),
                lambda c: {"obligation": n("{W} {w} report"), "owner": n["first"],
                           "due": n["iso"], "clause": n["sec"],
                           "status": r.choice(("open", "met", "waived"))}[c],
                plants,
            )  # fmt: skip
        return self.lines(
            size,
            ("{iso}  {doc}  {w} notice due ({first})", "{iso}  {doc}  {w} report window opens",
             "{iso}  internal  {team} review of {w}"),
            plants, "log", "deadlines",
        )  # fmt: skip

    def fail(self, name: str, args: dict[str, Any], key: str, size: int) -> str:
        n = self.noise
        if name in ("search_documents", "calendar_deadlines"):
            body = json.dumps({"ok": False, "error": "KEY", "took_ms": n["nn"]})
            return _error_output(n, key, size, [body], ["  at {w}.query ({path}:{nn})"])
        return _error_output(
            n, key, size,
            ["Request failed: KEY"],
            ["  trace {ref}: {w} service answered in {ms}", "  retried {n} times"],
        )  # fmt: skip


# -- travel: event and travel planning ----------------------------------------------------------

_TRAVEL_WORDS = (
    "kickoff", "summit", "venue", "hotel", "flight", "coach", "dinner", "badge", "stage",
    "breakout", "catering", "visa", "transfer", "lounge", "agenda", "sponsor", "rehearsal",
    "shuttle",
)  # fmt: skip


def _travel_error(*which: int) -> Draw:
    """Error strings of the patterns numbered ``which`` (those that fit the subject)."""

    def draw(r: random.Random) -> str:
        words = ("FARE", "SEAT", "HOLD", "ROOM", "QUOTE", "RATE")
        states = ("EXPIRED", "UNAVAILABLE", "MISMATCH", "REJECTED", "SOLD_OUT", "STALE")
        options = (
            f"{r.choice(words)}_{r.choice(states)}",
            "HTTP 409 hold_conflict",
            "3DS challenge failed",
            f"roster sync aborted: {r.randint(3, 90)} invalid emails",
            f"GDS timeout after {r.randint(31, 120)}s",
            "card_declined: do_not_honor",
        )
        return options[r.choice(which)]

    return draw


class _Travel(_Kit):
    SYSTEM = (
        "You are the events and travel coordinator assistant for a company's sales kickoff and "
        "its customer summit. Tools: search_flights(origin, destination, date), "
        "search_venues(city, capacity), hotel_availability(hotel, check_in, nights, rooms), "
        "get_booking(reference), attendee_roster(event, filter), budget_sheet(tab, range). "
        "Place holds before you book, never pay without approval, keep the travel policy and "
        "per-diems in mind, and keep a running list of open items. Attendees fly in from "
        "{city}, {city} and {city}; the event team is {who} and {who}."
    )
    TEAMS = ("the event team", "finance", "the exec office", "sales ops", "HR", "procurement")
    WORDS = _TRAVEL_WORDS
    ROOTS = ("events/archive", "drive/travel", "exports/roster", "quotes")
    EXTS = ("pdf", "xlsx", "csv", "docx", "ics")
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {
        "airport": ("LHR", "FRA", "AMS", "CDG", "MAD", "ZRH", "CPH", "DUB", "WAW", "VIE"),
        "airline": ("LX", "LH", "KL", "AF", "IB", "SK", "EI", "LO", "OS"),
        "hotel": ("Hotel Marlowe", "The Carden", "Hotel Vireo", "Alder House", "The Wexley",
                  "Hotel Orsa"),
        "room": ("Hall B", "the Orangery", "Studio 4", "the Atrium", "Room Kepler"),
        "diet": ("vegetarian", "vegan", "gluten-free", "halal", "none", "nut allergy"),
    }  # fmt: skip
    ASKS = (
        "Find flights from {airport} for the {w} crowd, arriving the day before.",
        "Which venues in {city} can seat {nn} people?",
        "Check {hotel} for {n} rooms over {n} nights.",
        "Can you pull up booking {ref} and check what's included?",
        "How many people on the roster still haven't booked travel?",
        "Where are we against budget on the {w} line?",
        "Draft the {w} schedule for day {n}.",
        "Any cheaper option for the {airport} group? The fares look high.",
        "What are the dietary numbers for the {w}?",
        "Compare the two venue quotes for {room}.",
        "Who needs a visa letter?",
    )
    DETAILS = (
        "{who} from {team} keeps asking about this.",
        "About {nn} people registered so far.",
        "The last quote was {eur} for the whole block.",
        "{first} prefers morning flights.",
        "The {w} contract is in {path}.",
        "The CEO lands at {hh} on {day}.",
        "Last year's event had {n} no-shows.",
        "We still have {n} people without a hotel.",
        "The {airline} group desk replied in {n} hours last time.",
    )
    NOTES = (
        "{first}: {w} numbers confirmed at {nn}",
        "Open: shuttle from {airport} on {day}",
        "{team} approved the {w} spend of {eur}",
        "Venue walk-through with {who} at {hh}",
        "{n} speakers still need hotel rooms",
    )
    REPORTS = (
        "Found {n} flights from {airport}; the cheapest direct one is {usd} with {airline}.",
        "{hotel} has {n} rooms free over those nights at {eur} a night.",
        "The roster has {nn} attendees; {n} haven't booked travel yet.",
        "The {w} line is at {pct} of budget with {usd} committed.",
        "{room} seats {nn} theatre-style, fewer for banquet.",
        "I placed a 48-hour hold on the {w} block; nothing is paid.",
        "Dietary split: {n} vegetarian, {n} vegan, {n} gluten-free.",
        "Next open item: {next}.",
    )
    PREAMBLES = ("Searching flights and hotels in parallel.", "Checking the roster.",
                 "Pulling the budget sheet.", "Looking up the booking.")  # fmt: skip
    QUESTIONS = ("Do you want direct flights only, or is one stop fine?",
                 "Should I hold {hotel} or keep looking?")  # fmt: skip
    NEXT = ("the {w} quotes", "the visa letters", "the shuttle plan", "the roster gaps")
    TOOLS = (
        ("search_flights", 2.6),
        ("search_venues", 1.5),
        ("hotel_availability", 2.0),
        ("get_booking", 1.5),
        ("attendee_roster", 1.8),
        ("budget_sheet", 1.8),
    )

    def topics(self) -> dict[str, list[_Topic]]:
        w = _TRAVEL_WORDS
        return {
            "number": _topics(
                "number",
                [
                    ("the total event budget", _cash("$", 120_000, 2_400_000)),
                    ("the expected headcount", _count(120, 950, "attendees")),
                    ("the per-night hotel cap", _cash("€", 120, 480)),
                    ("the catering minimum spend", _cash("$", 8_000, 90_000)),
                    ("the room block size", _count(40, 420, "rooms")),
                    ("the AV quote", _cash("£", 4_000, 60_000, cents=True)),
                    ("the daily per-diem", _cash("€", 45, 140, cents=True)),
                ],
            ),
            "path": _topics(
                "path",
                [
                    ("the attendee export", _shape("exports/{w}/roster_{Y}{M}_{D3}.csv", w)),
                    ("the run-of-show", _shape("events/{w}-{Y}/run-of-show-v{D1}.docx", w)),
                    ("the venue contract scan", _shape("contracts/venues/{w}_{D4}_signed.pdf", w)),
                    ("the travel policy", _shape("policies/travel/{w}-policy-{D2}.pdf", w)),
                    ("the seating plan", _shape("events/{w}/seating/{w}_tables_{D2}.xlsx", w)),
                ],
            ),
            "name": _topics(
                "name",
                [
                    ("the venue's event manager", _person),
                    ("the keynote speaker", _person),
                    ("the destination management company", _org),
                    ("the executive sponsor", _person),
                    ("the caterer", _org),
                    ("the travel agent handling visas", _person),
                ],
            ),
            "identifier": _topics(
                "identifier",
                [
                    ("the venue hold reference", _shape("HLD-{A2}{D5}")),
                    ("the group flight PNR", _shape("{A6}")),
                    ("the hotel group code", _shape("GRP{D4}{A2}")),
                    ("the travel insurance policy", _shape("TRV-{D3}-{D6}")),
                    ("the visa invitation batch", _shape("VL-{D5}-{A2}")),
                ],
            ),
            "date": _topics(
                "date",
                [
                    ("the kickoff's first day", _day),
                    ("the hotel cut-off date", _day),
                    ("the venue deposit deadline", _day),
                    ("the site visit", _day),
                    ("the speaker rehearsal", _day),
                ],
            ),
            "error": _topics(
                "error",
                [
                    ("the error from the booking API", _travel_error(0, 1, 4)),
                    ("what the payment link returns", _travel_error(2, 5)),
                    ("the roster sync failure", _travel_error(3)),
                ],
            ),
            "constraint": _said(
                "constraint",
                [
                    (
                        "the cabin class rule",
                        _choice("premium economy", "economy plus", "standard economy"),
                        (
                            "Nobody books above {v}, the CFO signed that off.",
                            "Flights are {v} or lower, for everyone including execs.",
                        ),
                    ),
                    (
                        "the maximum journey time",
                        _count(4, 11, "hours"),
                        ("No attendee should travel more than {v} door to door.",),
                    ),
                    (
                        "the accessibility requirement",
                        _choice(
                            "step-free access to every room",
                            "hearing loops in the main hall",
                            "accessible restrooms on each floor",
                        ),
                        ("The venue must have {v}, non-negotiable.",),
                    ),
                    (
                        "the cancellation terms we accept",
                        _count(7, 45, "days"),
                        ("Only sign with a venue giving us at least {v} of free cancellation.",),
                    ),
                ],
            ),
            "decision": _choices_topics(
                [
                    (
                        "the summit city",
                        ("Lisbon", "Valencia", "Edinburgh", "Krakow", "Ljubljana"),
                        (
                            "flights from all three hubs are direct",
                            "the venue quote is lowest there",
                            "half the customers are within a short train ride",
                        ),
                    ),
                    (
                        "the ground transport",
                        ("chartered coaches", "rideshare credits", "the airport rail link"),
                        ("arrivals are spread over the whole day", "it's cheapest per head"),
                    ),
                    (
                        "the dinner format",
                        ("a seated three-course dinner", "food stations", "a standing reception"),
                        ("it keeps people mixing", "the room can't fit round tables"),
                    ),
                    (
                        "the venue",
                        (
                            "Old Customs House",
                            "Riverside Conference Centre",
                            "Botanical Garden Pavilion",
                        ),
                        (
                            "it has breakout rooms on the same floor",
                            "it's walkable from the hotels",
                        ),
                    ),
                ]
            ),
            "preference": _said(
                "preference",
                [
                    (
                        "seating on flights",
                        _choice("aisle seats", "window seats", "seats near the front"),
                        ("Book me {v} whenever there's a choice.",),
                    ),
                    (
                        "how itineraries are sent",
                        _choice(
                            "one PDF per traveller",
                            "calendar invites with the PNR",
                            "one shared spreadsheet tab",
                        ),
                        ("Send itineraries as {v}; people lose emails.",),
                    ),
                    (
                        "the currency for quotes",
                        _choice(
                            "Norwegian kroner",
                            "Singapore dollars",
                            "Czech koruna",
                            "Canadian dollars",
                        ),
                        ("Quote everything in {v} - that's our reporting currency this year.",),
                    ),
                    (
                        "the hotel style",
                        _choice("boutique hotels in walking distance", "chain hotels with points"),
                        ("I'd like {v} for the speakers.",),
                    ),
                ],
            ),
        }

    def args(self, name: str) -> dict[str, Any]:
        n = self.noise
        if name == "search_flights":
            return {"origin": n["airport"], "destination": n["airport"], "date": n["iso"]}
        if name == "search_venues":
            return {"city": n["city"], "capacity": int(n["nn"]) % 900 + 80}
        if name == "hotel_availability":
            return {"hotel": n["hotel"], "check_in": n["iso"], "nights": int(n["n"]) % 5 + 1,
                    "rooms": int(n["n"])}  # fmt: skip
        if name == "get_booking":
            return {"reference": n("BK{nn}{hex}").upper()}
        if name == "attendee_roster":
            return {
                "event": n("{w}-{nn}"),
                "filter": self.r.choice(("all", "unbooked", "speakers")),
            }
        return {"tab": n("{W}"), "range": f"A1:F{self.r.randint(20, 400)}"}

    def result(self, name: str, args: dict[str, Any], size: int, plants: list[_Plant]) -> str:
        n, r = self.noise, self.r
        if name == "search_flights":
            return self.table(
                size,
                ("flight", "depart", "arrive", "stops", "fare", "seats"),
                lambda c: {"flight": n("{airline}{nn}"), "depart": n["hh"], "arrive": n["hh"],
                           "stops": str(r.randint(0, 2)), "fare": n["eur"], "seats": n["n"]}[c],
                plants,
                footer="{n} results, fares include taxes, cached {sec} ago",
            )  # fmt: skip
        if name == "search_venues":
            venues = self.rows_json(
                size,
                lambda: {
                    "name": n("{W} {room}"),
                    "city": n["city"],
                    "capacity_theatre": int(n["nn"]) % 1200 + 60,
                    "day_rate": n["eur"],
                    "contact": n["who"],
                    "rating": round(r.uniform(3.1, 4.9), 1),
                },
            )
            return self.record({"query": args, "count": len(venues), "venues": venues}, plants)
        if name == "hotel_availability":
            nights = self.rows_json(
                size,
                lambda: {"date": n["iso"], "available": int(n["n"]), "rate": n["eur"],
                         "room_type": r.choice(("double", "king", "twin", "suite"))},
            )  # fmt: skip
            base = {"hotel": args.get("hotel"), "currency": "EUR", "nights": nights}
            return self.record(base, plants)
        if name == "get_booking":
            return self.lines(
                size,
                ("  Guest: {who}  ({diet})", "  Room: {hotel}, {n} nights, rate {eur}",
                 "  Segment: {airline}{nn} {airport}-{airport} {iso} {hh}",
                 "  Note: {first} asked for late check-in"),
                plants, "kv", "booking",
                ("Booking {ref} - status CONFIRMED", "Created by {who} on {iso}"),
            )  # fmt: skip
        if name == "attendee_roster":
            return self.lines(
                size,
                ("{who},{first}@example.com,{team},{airport},{iso},{diet}",
                 "{who},{first}.{w}@example.com,{team},,{iso},{diet}"),
                plants, "kv", "roster",
                ("name,email,team,origin,arrival,dietary",),
            )  # fmt: skip
        return self.table(
            size,
            ("line", "budget", "committed", "owner"),
            lambda c: {"line": n("{W} {w}"), "budget": n["usd"], "committed": n["usd"],
                       "owner": n["first"]}[c],
            plants,
        )  # fmt: skip

    def fail(self, name: str, args: dict[str, Any], key: str, size: int) -> str:
        n = self.noise
        body = json.dumps({"success": False, "error": {"message": "KEY", "trace": n["ref"]}})
        return _error_output(n, key, size, [body], ["retry-after: {n}", "x-request-id: {ref}"])


# -- mlops: ML experiment tracking ----------------------------------------------------------------

_ML_WORDS = (
    "retrieval", "reranker", "tokenizer", "warmup", "eval", "shard", "dpo", "sft", "reward",
    "distill", "lora", "mixture", "curriculum", "dedup", "filter", "pretrain", "longctx",
)  # fmt: skip


def _ml_error(*which: int) -> Draw:
    """Error strings of the patterns numbered ``which`` (those that fit the subject)."""

    def draw(r: random.Random) -> str:
        options = (
            "CUDA out of memory",
            f"NCCL watchdog timeout on rank {r.randint(8, 255)}",
            f"loss is NaN at step {r.randint(1_000, 99_999):,}",
            "ChildFailedError",
            "size mismatch for lm_head.weight",
            f"dataset shard {_digits(r, 5)} is empty",
        )
        return options[r.choice(which)]

    return draw


class _Mlops(_Kit):
    SYSTEM = (
        "You are an ML engineering assistant for a team fine-tuning and evaluating a "
        "retrieval-augmented language model. Tools: list_runs(project, filter), get_run(run), "
        "tail_training_log(run, lines), launch_job(config, gpus, priority), "
        "list_checkpoints(run), eval_model(checkpoint, suite). Say which run produced which "
        "number, never delete checkpoints, and give the seed and data version with every "
        "result. Cluster: {n} nodes of 8xH100, Slurm partition {w}; tracking in MLflow."
    )
    TEAMS = ("the eval team", "infra", "the data team", "applied research", "the model council")
    WORDS = _ML_WORDS
    ROOTS = ("configs/archive", "s3://ml-scratch", "/mnt/shared/runs", "notebooks")
    EXTS = ("yaml", "json", "jsonl", "ipynb", "log")
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {
        "suite": ("mmlu-lite", "nq-open", "hotpot-dev", "internal-qa", "tox-check", "longbench"),
        "metric": ("exact_match", "f1", "ndcg@10", "recall@20", "win_rate", "rougeL"),
        "node": ("gpu-a01", "gpu-a07", "gpu-b12", "gpu-c03", "gpu-c19"),
    }
    ASKS = (
        "How is run-{hex} doing? Loss still going down?",
        "List the {w} runs from this week and their best eval scores.",
        "Launch the {w} config on {n} GPUs at low priority.",
        "Which checkpoint of the {w} run scored best on {suite}?",
        "Evaluate the latest checkpoint on {suite} and {suite}.",
        "Tail the log of the {w} run - {first} says it stalled.",
        "Compare the {w} ablation against the baseline on {metric}.",
        "Why is throughput down to {big} tokens/s?",
        "Can you check if the {w} data mix changed between runs?",
        "What's left in the GPU quota for this month?",
        "Summarise the {w} sweep so far.",
    )
    DETAILS = (
        "{who} started it at {hh} yesterday.",
        "The sweep has {n} arms.",
        "Node {node} was flaky last week.",
        "Data version {ver} is the current one.",
        "{first} wants numbers for the {day} review.",
        "The config is in {path}.",
        "Last time it diverged around step {stepn}.",
        "Throughput was {big} tokens/s before the change.",
    )
    NOTES = (
        "{first}: {suite} regressed by {pct} on the {w} arm",
        "Open: rerun {w} with seed {n}",
        "{node} drained for maintenance",
        "Decided to drop the {w} data slice for now",
        "{who} owns the {metric} dashboard",
    )
    REPORTS = (
        "run-{hex} is at step {stepn}; train loss {n}.{nn}, still trending down.",
        "Best {suite} score so far is {metric} {n}.{n} from run-{hex}.",
        "Throughput dropped on {node}; the other nodes are at {big} tokens/s.",
        "The sweep has {n} finished arms and {n} running.",
        "I launched job {nn}{nn} with {n} GPUs; it's queued behind {n} jobs.",
        "No data-mix change between the two runs; both use version {ver}.",
        "Checkpoints are every {stepn} steps; {n} are on disk.",
        "Next I'd look at {next}.",
    )
    PREAMBLES = ("Pulling the run and its log.", "Listing runs.", "Submitting the job.",
                 "Running the eval suites.")  # fmt: skip
    QUESTIONS = ("Should I evaluate every checkpoint or only the last {n}?",
                 "Low or normal priority for the job?")  # fmt: skip
    NEXT = ("the {w} ablation", "the {suite} regression", "the throughput drop", "the sweep")
    TOOLS = (
        ("list_runs", 2.0),
        ("get_run", 2.4),
        ("tail_training_log", 2.6),
        ("launch_job", 1.0),
        ("list_checkpoints", 1.4),
        ("eval_model", 2.0),
    )

    def topics(self) -> dict[str, list[_Topic]]:
        w = _ML_WORDS

        def lr(r: random.Random) -> str:
            return f"{r.choice((1, 1.5, 2, 2.5, 3, 4, 5, 6, 8))}e-{r.choice((4, 5, 6))}"

        return {
            "number": _topics(
                "number",
                [
                    ("the peak learning rate", lr),
                    ("the global batch size", _comma(1_024, 8_192)),
                    ("the warmup length", _comma(1_000, 9_000)),
                    ("the best validation loss", _decimal(1.1, 3.9, 4)),
                    ("the target accuracy on the held-out set", _percent(61, 93, 2)),
                    ("the weight decay", _decimal(0.011, 0.2, 3)),
                    ("the GPU-hour budget", _comma(1_200, 40_000)),
                    (
                        "the max context length",
                        _choice("8,192", "16,384", "12,288", "24,576"),
                    ),
                ],
            ),
            "path": _topics(
                "path",
                [
                    ("the training config", _shape("configs/{w}/{w}_{w}_v{D1}.yaml", w)),
                    ("the best checkpoint", _shape("s3://ml-ckpts/{w}/run-{L6}/step_{D5}/", w)),
                    ("the eval dataset", _shape("gs://eval-sets/{w}-{w}-{D3}.jsonl", w)),
                    ("the tokenizer files", _shape("/mnt/shared/tokenizers/{w}-{D2}k/", w)),
                    ("the launch script", _shape("scripts/launch_{w}_{w}.sbatch", w)),
                ],
            ),
            "name": _topics(
                "name",
                [
                    ("the owner of the eval harness", _person),
                    (
                        "the base model",
                        _choice(
                            "Llama-3.1-8B",
                            "Qwen2.5-7B",
                            "Mistral-Nemo-12B",
                            "Gemma-2-9B",
                            "Phi-3-medium",
                        ),
                    ),
                    ("the reviewer for the model card", _person),
                    ("the labeling vendor", _org),
                    ("the cluster admin", _person),
                ],
            ),
            "identifier": _topics(
                "identifier",
                [
                    ("the baseline run", _shape("run-{L8}")),
                    ("the dataset version", _shape("ds-v{D1}.{D2}-{X6}")),
                    ("the Slurm job", _shape("slurm-{D7}")),
                    ("the MLflow experiment", _shape("exp-{D4}-{w}", w)),
                    ("the commit of the training code", _shape("{X10}")),
                ],
            ),
            "date": _topics(
                "date",
                [
                    ("the paper submission deadline", _day),
                    ("the data freeze", _day),
                    ("the cluster maintenance", _day),
                    ("the model review meeting", _day),
                    ("the start of the A/B test", _day),
                ],
            ),
            "error": _topics(
                "error",
                [
                    ("the crash of the long-context run", _ml_error(0, 1, 2)),
                    ("what the eval job dies with", _ml_error(0, 3, 4)),
                    ("the error from the data loader", _ml_error(3, 5)),
                    ("the failure on the new nodes", _ml_error(1, 3)),
                ],
            ),
            "constraint": _said(
                "constraint",
                [
                    (
                        "the GPU cap per job",
                        _count(16, 256, "GPUs"),
                        ("No single job gets more than {v}; the cluster is shared.",),
                    ),
                    (
                        "the excluded training data",
                        _choice(
                            "the support transcripts",
                            "the 2023 forum scrape",
                            "the EU-only partition",
                        ),
                        ("Never train on {v} - legal hasn't cleared it.",),
                    ),
                    (
                        "the serving latency budget",
                        _count(18, 95, "ms"),
                        ("Whatever we ship has to stay under {v} per token at p95.",),
                    ),
                    (
                        "the minimum number of seeds",
                        _count(3, 7, "seeds"),
                        ("Don't report anything with fewer than {v} per arm.",),
                    ),
                ],
            ),
            "decision": _choices_topics(
                [
                    (
                        "the optimizer",
                        ("AdamW with cosine decay", "Lion with linear warmup", "Adafactor"),
                        ("it was the most stable in the sweep", "it halves optimizer memory"),
                    ),
                    (
                        "the training precision",
                        ("bf16 mixed precision", "fp8 with delayed scaling", "fp32 master weights"),
                        ("we saw loss spikes otherwise", "throughput matters more this round"),
                    ),
                    (
                        "the fine-tuning method",
                        ("LoRA at rank 64", "full fine-tuning", "QLoRA on 4-bit weights"),
                        ("it fits the GPU budget", "it matched full quality in the ablation"),
                    ),
                    (
                        "the checkpoint to ship",
                        (
                            "the EMA weights",
                            "average of the last five checkpoints",
                            "the final checkpoint",
                        ),
                        ("it scored best on the held-out suite", "it's the least noisy"),
                    ),
                ]
            ),
            "preference": _said(
                "preference",
                [
                    (
                        "the headline metric",
                        _choice("exact match", "nDCG at 10", "win rate against the baseline"),
                        ("Lead every results table with {v}.",),
                    ),
                    (
                        "the plot style",
                        _choice(
                            "smoothed curves over faded raw traces",
                            "log-scale step axes",
                            "one panel per suite",
                        ),
                        ("For plots I prefer {v}.",),
                    ),
                    (
                        "how results are reported",
                        _choice(
                            "mean and stderr over seeds",
                            "a markdown table per suite",
                            "deltas against the baseline only",
                        ),
                        ("Report results as {v}, please.",),
                    ),
                ],
            ),
        }

    def args(self, name: str) -> dict[str, Any]:
        n = self.noise
        run = n("run-{hex}")
        if name == "list_runs":
            return {"project": n("{w}-{w}"), "filter": self.r.choice(("status=running", "all"))}
        if name in ("get_run", "tail_training_log", "list_checkpoints"):
            args: dict[str, Any] = {"run": run}
            if name == "tail_training_log":
                args["lines"] = self.r.choice((200, 500, 1000))
            return args
        if name == "launch_job":
            return {"config": n("configs/{w}/{w}.yaml"), "gpus": int(n["n"]) * 8,
                    "priority": self.r.choice(("low", "normal"))}  # fmt: skip
        return {"checkpoint": n("{path}"), "suite": n["suite"]}

    def result(self, name: str, args: dict[str, Any], size: int, plants: list[_Plant]) -> str:
        n, r = self.noise, self.r
        if name == "list_runs":
            return self.table(
                size,
                ("run", "status", "step", "val_loss", "lr", "created"),
                lambda c: {"run": n("run-{hex}"), "status": r.choice(("running", "done", "failed")),
                           "step": n["stepn"], "val_loss": f"{r.uniform(1.2, 3.5):.3f}",
                           "lr": f"{r.uniform(1, 9):.1f}e-05", "created": n["iso"]}[c],
                plants,
            )  # fmt: skip
        if name == "get_run":
            base = {
                "run": args.get("run"),
                "status": r.choice(("running", "finished")),
                "params": {"seed": n["n"], "data_version": n["ver"], "gpus": int(n["n"]) * 8},
                "metrics": self.rows_json(
                    size,
                    lambda: {"step": n["stepn"], "key": n["metric"],
                             "value": round(r.uniform(0, 1), 4)},
                ),
                "tags": {"owner": n["first"], "node": n["node"]},
            }  # fmt: skip
            return self.record(base, plants, "params")
        if name == "tail_training_log":
            return self.lines(
                size,
                ("step {stepn} | loss {n}.{nn} | lr {n}.{n}e-05 | tok/s {big} | grad_norm 0.{nn}",
                 "[{ts}] {node}: checkpoint saved in {sec}",
                 "[{ts}] eval {suite}: {metric}=0.{nn}",
                 "step {stepn} | loss {n}.{nn} | lr {n}.{n}e-05 | tok/s {big}"),
                plants, "log", "trainer",
            )  # fmt: skip
        if name == "launch_job":
            return self.lines(
                size,
                ("  allocating {node} ({n} GPUs free)", "  env: NCCL_DEBUG=WARN, seed={n}",
                 "  queued behind job {nn}{nn} ({who})"),
                plants, "kv", "slurm",
                ("Submitted batch job {nn}{nn}", "partition={w} qos=normal"),
            )  # fmt: skip
        if name == "list_checkpoints":
            return self.lines(
                size,
                ("s3://ml-ckpts/{w}/run-{hex}/step_{stepn}/  {n}.{n} GiB  {ts}",
                 "s3://ml-ckpts/{w}/run-{hex}/step_{stepn}/ema/  {n}.{n} GiB  {ts}"),
                plants, "kv", "ckpt",
            )  # fmt: skip
        return self.table(
            size,
            ("suite", "metric", "score", "n", "seed"),
            lambda c: {"suite": n["suite"], "metric": n["metric"],
                       "score": f"{r.uniform(0.1, 0.95):.4f}", "n": n["nn"], "seed": n["n"]}[c],
            plants,
        )  # fmt: skip

    def fail(self, name: str, args: dict[str, Any], key: str, size: int) -> str:
        n = self.noise
        return _error_output(
            n, key, size,
            ["Traceback (most recent call last):"],
            ['  File "{path}", line {nn}, in {w}_step', "    out = self.{w}(batch)",
             "[rank{n}]:[W {ts}] {node} heartbeat {ms}"],
            ["RuntimeError: KEY".replace("KEY", key)],
        )  # fmt: skip


# -- finance: month-end reconciliation -------------------------------------------------------------

_FIN_WORDS = (
    "accrual", "invoice", "ledger", "suspense", "payables", "receivables", "revaluation",
    "intercompany", "journal", "vat", "prepayment", "deferral", "treasury", "settlement",
    "payroll", "fx",
)  # fmt: skip


def _finance_error(*which: int) -> Draw:
    """Error strings of the patterns numbered ``which`` (those that fit the subject)."""

    def draw(r: random.Random) -> str:
        options = (
            f"GL-{_digits(r, 4)}: posting period closed",
            f"unique violation on uq_{r.choice(_FIN_WORDS)}_{r.choice(_FIN_WORDS)}",
            f"BANK_API {r.choice((401, 403, 409, 422))} "
            f"{r.choice(('CONSENT', 'STATEMENT', 'CURSOR'))}_"
            f"{r.choice(('EXPIRED', 'UNAVAILABLE', 'INVALID'))}",
            f"#REF! in {r.choice(('Rec', 'Summary', 'FX', 'TB'))}!{r.choice('BCDEFG')}"
            f"{r.randint(10, 999)}",
            f"out of balance by {r.randint(1, 999)}.{r.randint(1, 99):02d}",
        )
        return options[r.choice(which)]

    return draw


class _Finance(_Kit):
    SYSTEM = (
        "You are a finance operations assistant helping close the month for a group of three "
        "entities. Tools: run_sql(query) against the finance warehouse, read_sheet(workbook, "
        "range), get_invoice(invoice), bank_statement(account, start, end), "
        "ledger_entries(account, period), match_transactions(account, period, tolerance). "
        "Reconcile to the cent, never post journals yourself (propose them), and keep an "
        "audit trail of where every figure comes from. Entities: {org} UK, BV and Inc; "
        "functional currencies GBP, EUR and USD."
    )
    TEAMS = ("the controller's office", "AP", "AR", "treasury", "the auditors", "tax")
    WORDS = _FIN_WORDS
    ROOTS = ("Finance/Close/archive", "/data/bank/raw", "uploads/journals/old", "reports")
    EXTS = ("xlsx", "csv", "pdf", "sql")
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {
        "entity": ("UK01", "NL02", "US03"),
        "acct": ("1200 Bank EUR", "2100 Trade creditors", "1100 Trade debtors", "2190 Accruals",
                 "7800 FX gains/losses", "1250 Bank USD", "2400 VAT control"),
        "ccy": ("EUR", "USD", "GBP"),
        "supplier": ("Pellucid Paper", "Orbitline Telecom", "Grafton Cleaning",
                     "Mosswood Software", "Tern Logistics"),
    }  # fmt: skip
    ASKS = (
        "Reconcile {acct} for {month} - bank against ledger.",
        "Why is the {w} balance off by {usd}?",
        "Pull invoice {ref} and check it against the PO.",
        "List unmatched transactions on {acct} over {n} days old.",
        "What's in suspense for {entity} right now?",
        "Run the intercompany check between {entity} and {entity}.",
        "Can you propose the {w} journal for month end?",
        "Check the FX revaluation on the {ccy} accounts.",
        "Which {supplier} invoices are still unpaid?",
        "Compare the trial balance to last month's for {entity}.",
        "Tie the VAT return to the {w} ledger.",
    )
    DETAILS = (
        "{who} from {team} needs it before {day}.",
        "Last month we had {n} unmatched lines.",
        "The statement export is in {path}.",
        "Tolerance is a few cents, per {first}.",
        "There's a {gbp} item nobody can explain.",
        "Bank feed was down on {day}, so expect gaps.",
        "The {supplier} account has {n} open items.",
        "{entity} switched banks mid-month.",
    )
    NOTES = (
        "{acct}: {n} items cleared, {n} open",
        "{first} to chase {supplier} for a credit note",
        "FX difference of {eur} on {entity}",
        "Auditors asked for evidence on {w}",
        "Open: {w} journal reversal for {month}",
    )
    REPORTS = (
        "{acct} reconciles except {n} items totalling {usd}.",
        "The difference traces to a {w} posted twice on {iso}.",
        "{n} bank lines have no ledger match; the largest is {eur}.",
        "Suspense for {entity} holds {n} items, {gbp} in total.",
        "Intercompany between {entity} and {entity} is off by {usd} - timing, I think.",
        "Proposed journal: debit {acct}, credit {acct}, {gbp}.",
        "VAT ties out to within {gbp}.",
        "Next: {next}.",
    )
    PREAMBLES = ("Querying the ledger and the bank feed.", "Opening the workbook.",
                 "Pulling the invoice.", "Running the matcher.")  # fmt: skip
    QUESTIONS = ("Should I match on amount only, or amount and date?",
                 "Do you want the journal as a CSV or in the sheet?")  # fmt: skip
    NEXT = (
        "the {acct} reconciliation",
        "the suspense items",
        "the FX revaluation",
        "the VAT tie-out",
    )
    TOOLS = (
        ("run_sql", 3.0),
        ("read_sheet", 2.2),
        ("get_invoice", 1.4),
        ("bank_statement", 1.8),
        ("ledger_entries", 2.0),
        ("match_transactions", 1.2),
    )

    def topics(self) -> dict[str, list[_Topic]]:
        w = _FIN_WORDS
        return {
            "number": _topics(
                "number",
                [
                    (
                        "the unreconciled difference on the EUR account",
                        _cash("€", 1_000, 90_000, cents=True),
                    ),
                    ("the audit fee accrual", _cash("£", 12_000, 180_000)),
                    ("the EUR/USD rate for the revaluation", _decimal(1.0201, 1.1899, 4)),
                    ("the intercompany balance", _cash("$", 10_000, 900_000, cents=True)),
                    ("the bad-debt provision rate", _percent(0.6, 7.5, 2)),
                    ("the VAT payable for the quarter", _cash("£", 20_000, 600_000, cents=True)),
                    (
                        "the closing cash balance per bank",
                        _cash("$", 100_000, 9_000_000, cents=True),
                    ),
                ],
            ),
            "path": _topics(
                "path",
                [
                    (
                        "the reconciliation workbook",
                        _shape("Finance/Close/{Y}-{M}/{w}_rec_v{D1}.xlsx", w),
                    ),
                    ("the bank export", _shape("/data/bank/{w}/stmt_{D8}.csv", w)),
                    ("the journal upload file", _shape("uploads/journals/JE_{Y}{M}_{D3}.csv")),
                    ("the audit evidence folder", _shape("sharepoint://audit/{Y}/{w}-{w}/", w)),
                    ("the FX rates file", _shape("ref/fx/{w}_rates_{D4}.parquet", w)),
                ],
            ),
            "name": _topics(
                "name",
                [
                    ("the group controller", _person),
                    ("the auditors' engagement manager", _person),
                    ("the supplier with the duplicate invoice", _org),
                    ("the bank's relationship manager", _person),
                    ("the approver for journals over the limit", _person),
                ],
            ),
            "identifier": _topics(
                "identifier",
                [
                    ("the disputed invoice", _shape("INV-{A2}-{D6}")),
                    ("the suspense account", _shape("GL {D4}-{D2}")),
                    ("the journal batch", _shape("JB{D7}")),
                    ("the payment run", _shape("PR-{D4}-{A3}")),
                    ("the vendor id of the main supplier", _shape("V{D6}")),
                ],
            ),
            "date": _topics(
                "date",
                [
                    ("the close deadline", _day),
                    ("the start of audit fieldwork", _day),
                    ("the next payment run", _day),
                    ("the VAT filing due date", _day),
                    ("the board pack deadline", _day),
                ],
            ),
            "error": _topics(
                "error",
                [
                    ("the error when posting the upload", _finance_error(0, 4)),
                    ("the SQL error on the matching query", _finance_error(1)),
                    ("what the bank feed returns", _finance_error(2)),
                    ("the error in the reconciliation sheet", _finance_error(3)),
                ],
            ),
            "constraint": _said(
                "constraint",
                [
                    (
                        "the write-off threshold",
                        _cash("£", 5, 250, cents=True),
                        ("Anything under {v} we write off to rounding, nothing above.",),
                    ),
                    (
                        "the single-approver journal limit",
                        _cash("$", 10_000, 250_000),
                        ("Journals above {v} need a second approver, always.",),
                    ),
                    (
                        "the locked period",
                        lambda r: f"{r.choice(_MONTHS)} {r.choice((2023, 2024))}",
                        ("Do not touch the {v} period - it's locked for the auditors.",),
                    ),
                    (
                        "the fastest supplier payment terms",
                        lambda r: f"net {r.randint(21, 75)}",
                        ("We never pay suppliers faster than {v}.",),
                    ),
                ],
            ),
            "decision": _choices_topics(
                [
                    (
                        "the FX rate source",
                        (
                            "ECB reference rates",
                            "Bloomberg 4pm fixings",
                            "bank closing rates",
                        ),
                        ("the auditors accepted it last year", "it matches the treasury system"),
                    ),
                    (
                        "how to clear the suspense balance",
                        (
                            "a reclass to prepaid expenses",
                            "a write-off to sundry income",
                            "reversing last month's accrual",
                        ),
                        ("the items are all prepayments", "nobody can trace them after 90 days"),
                    ),
                    (
                        "the revaluation method",
                        ("month-end spot", "the monthly average rate"),
                        ("it's what the group policy says", "it smooths the P&L swings"),
                    ),
                    (
                        "the treatment of the duplicate payment",
                        (
                            "a credit note",
                            "a refund request",
                            "netting it against the next invoice",
                        ),
                        ("the supplier prefers it", "it closes the item this period"),
                    ),
                ]
            ),
            "preference": _said(
                "preference",
                [
                    (
                        "how amounts are shown",
                        _choice(
                            "thousands with one decimal",
                            "full cents with ISO codes",
                            "whole units with a thin-space separator",
                        ),
                        ("Show amounts as {v} in anything you send me.",),
                    ),
                    (
                        "the report layout",
                        _choice("entities as columns", "one tab per entity", "a single long table"),
                        ("I prefer {v} for the close pack.",),
                    ),
                    (
                        "the negative number style",
                        _choice("parentheses for negatives", "a leading minus in red"),
                        ("For negative amounts use {v}, please - the auditors like it.",),
                    ),
                ],
            ),
        }

    def args(self, name: str) -> dict[str, Any]:
        n = self.noise
        if name == "run_sql":
            query = n(
                self.r.choice(
                    (
                        "select account, period, sum(amount) from gl_lines where entity = "
                        "'{entity}' group by 1, 2",
                        "select * from bank_lines where matched = false and posted < now() - "
                        "interval '{n} days'",
                        "select supplier, count(*), sum(open_amount) from ap_open group by 1",
                    )
                )
            )
            return {"query": query}
        if name == "read_sheet":
            return {"workbook": n("{W} rec {month}"), "range": f"A1:H{self.r.randint(40, 600)}"}
        if name == "get_invoice":
            return {"invoice": n("{nn}-{hex}")}
        if name == "bank_statement":
            return {"account": n["acct"], "start": n["iso"], "end": n["iso"]}
        if name == "ledger_entries":
            return {"account": n["acct"], "period": n("{month}")}
        return {"account": n["acct"], "period": n("{month}"), "tolerance": 0.05}

    def result(self, name: str, args: dict[str, Any], size: int, plants: list[_Plant]) -> str:
        n, r = self.noise, self.r
        if name == "run_sql":
            return self.table(
                size,
                ("account", "entity", "period", "amount", "lines"),
                lambda c: {"account": n["acct"], "entity": n["entity"], "period": n["month"],
                           "amount": n["usd"], "lines": n["nn"]}[c],
                plants,
                footer="({nn} rows, {sec})",
            )  # fmt: skip
        if name == "read_sheet":
            counter = iter(range(2, 10_000))
            return self.table(
                size,
                ("cell", "label", "value", "source"),
                lambda c: {"cell": f"{r.choice('BCD')}{next(counter)}", "label": n("{W} {w}"),
                           "value": n["gbp"], "source": n["acct"]}[c],
                plants,
            )  # fmt: skip
        if name == "get_invoice":
            base = {
                "invoice": args.get("invoice"),
                "supplier": n["supplier"],
                "currency": n["ccy"],
                "issued": n["iso"],
                "lines": self.rows_json(
                    size,
                    lambda: {"description": n("{W} {w} services"), "qty": int(n["n"]),
                             "unit_price": n["eur"], "tax_code": r.choice(("S20", "Z0", "RC"))},
                ),
                "status": r.choice(("approved", "on hold", "paid")),
            }  # fmt: skip
            return self.record(base, plants)
        if name == "bank_statement":
            return self.lines(
                size,
                ("{iso},{ref},{supplier},-{eur},{eur}", "{iso},{ref},CUSTOMER {nn},{eur},{eur}",
                 "{iso},{ref},FX {ccy}/{ccy},-{eur},{eur}"),
                plants, "kv", "bank",
                ("date,reference,counterparty,amount,balance",),
            )  # fmt: skip
        if name == "ledger_entries":
            return self.lines(
                size,
                ("JE{nn}{nn}  {iso}  {acct}  Dr {gbp}  {w} - {first}",
                 "JE{nn}{nn}  {iso}  {acct}  Cr {gbp}  {w} reversal",
                 "JE{nn}{nn}  {iso}  {acct}  Dr {gbp}  {supplier}"),
                plants, "log", "ledger",
            )  # fmt: skip
        return self.prose(
            size,
            (
                "Matched {nn} of {nn} lines on amount and date.",
                "{n} bank lines remain open, totalling {eur}.",
                "The largest unmatched item is {usd} from {supplier}.",
                "{n} ledger lines have no bank counterpart; most are {w} accruals.",
                "Tolerance of 0.05 applied to {n} pairs.",
            ),
            plants,
        )

    def fail(self, name: str, args: dict[str, Any], key: str, size: int) -> str:
        n = self.noise
        if name == "run_sql":
            return _error_output(
                n, key, size, ["ERROR:  KEY", "LINE {n}: ...".replace("{n}", n["n"])],
                ["CONTEXT:  {w} trigger on gl_lines, row {nn}"],
            )  # fmt: skip
        body = json.dumps({"status": "failed", "message": "KEY", "correlation": n["ref"]})
        return _error_output(n, key, size, [body], ["  at {w}.sync ({ms})"])


# -- helpdesk: HR onboarding and IT helpdesk ---------------------------------------------

_HD_WORDS = (
    "laptop", "vpn", "sso", "mailbox", "badge", "printer", "license", "okta", "jamf",
    "onboarding", "offboarding", "mfa", "wifi", "dock", "monitor", "chat", "wiki", "payroll",
)  # fmt: skip


def _helpdesk_error(*which: int) -> Draw:
    """Error strings of the patterns numbered ``which`` (those that fit the subject)."""

    def draw(r: random.Random) -> str:
        options = (
            f"AADSTS{_digits(r, 5)}",
            f"0x8018{_hexes(r, 4)}",
            f"VPN error 8{_digits(r, 2)}",
            "SCIM 409: user already exists",
            "Kerberos pre-authentication failed",
            "FileVault escrow failed",
        )
        return options[r.choice(which)]

    return draw


class _Helpdesk(_Kit):
    SYSTEM = (
        "You are the IT helpdesk and onboarding assistant for a company of about nine hundred "
        "people. Tools: get_ticket(ticket), directory_lookup(query), asset_inventory(filter), "
        "access_requests(user, system), mdm_device(serial), kb_search(query). Confirm the "
        "requester's identity before changing anything, follow least privilege, log every "
        "action on the ticket, and never share passwords or MFA codes in chat. New starters "
        "get a laptop, SSO, email and the standard app bundle on day one; contractors get "
        "a reduced bundle."
    )
    TEAMS = ("people ops", "security", "the service desk", "facilities", "procurement", "legal")
    WORDS = _HD_WORDS
    ROOTS = ("it/kb/archive", "packages/old", "smb://fs01/it", "scripts/legacy")
    EXTS = ("md", "pkg", "json", "ps1", "pdf")
    EXTRA: ClassVar[dict[str, tuple[str, ...]]] = {
        "model": ("ThinkPad T14", "MacBook Air 13", "Latitude 5440", "EliteBook 840"),
        "app": ("Figma", "Salesforce", "Jira", "GitHub", "Workday", "Tableau", "Zoom", "1Password"),
        "site": ("HQ floor 3", "the Berlin office", "remote", "the Lisbon hub", "the NYC office"),
        "dept": ("Sales", "Engineering", "Finance", "Support", "Marketing", "Legal"),
    }  # fmt: skip
    ASKS = (
        "New starter in {dept} next week - what do we still need to do?",
        "{first} can't log into {app}. Can you check?",
        "Is there a spare {model} in stock at {site}?",
        "Pull up ticket {nn} and tell me what's blocking it.",
        "Who approved {first}'s access to {app}?",
        "Check the device status for serial {hex}.",
        "What does the KB say about {w} issues on macOS?",
        "Offboard {who} - last day is {day}.",
        "How many {app} licences are assigned to contractors?",
        "Reset the {w} setup for {first}, it's been broken since {day}.",
        "Can you list open access requests for {dept}?",
    )
    DETAILS = (
        "{who} is their manager.",
        "They're based at {site}.",
        "The ticket was opened at {hh}.",
        "{first} already tried restarting.",
        "We had {n} similar tickets this month.",
        "The guide is at {path}.",
        "Security wants this closed within {n} hours.",
        "They're on build {ver}.",
    )
    NOTES = (
        "{first} needs {app} and {app}",
        "Laptop shipped from {site}, tracking {ref}",
        "Open: {w} access pending manager approval",
        "{who} will do the welcome session at {hh}",
        "{n} tickets about {w} since {day}",
    )
    REPORTS = (
        "The ticket has {n} comments; it's waiting on {team}.",
        "{first}'s account is active; {app} shows {n} failed logins since {hh}.",
        "{n} {model} units are in stock at {site}.",
        "The device checked in {n} minutes ago; encryption is on, OS {ver}.",
        "Access to {app} was approved by {who} on {iso}.",
        "The KB article says to re-enroll the {w} profile and reboot.",
        "{n} of {n} onboarding steps are done.",
        "Next: {next}.",
    )
    PREAMBLES = ("Looking up the ticket and the user.", "Checking inventory.",
                 "Pulling the device record.", "Searching the KB.")  # fmt: skip
    QUESTIONS = ("Is this for an employee or a contractor?",
                 "Should I ship the laptop or have them pick it up?")  # fmt: skip
    NEXT = ("the {app} access", "the laptop shipment", "the {w} ticket", "the welcome session")
    TOOLS = (
        ("get_ticket", 2.6),
        ("directory_lookup", 2.0),
        ("asset_inventory", 1.6),
        ("access_requests", 1.8),
        ("mdm_device", 1.4),
        ("kb_search", 1.4),
    )

    def topics(self) -> dict[str, list[_Topic]]:
        w = _HD_WORDS
        return {
            "number": _topics(
                "number",
                [
                    ("the laptop budget per hire", _cash("$", 1_100, 4_200)),
                    ("the Figma seats left", _count(3, 90, "seats")),
                    ("the mailbox quota", _count(50, 400, "GB")),
                    ("the MFA grace period", _count(24, 168, "hours")),
                    ("the monitor budget", _cash("€", 180, 900, cents=True)),
                    ("the onboarding backlog", _count(11, 140, "tickets")),
                    ("the expected new-hire count this quarter", _count(14, 160, "hires")),
                ],
            ),
            "path": _topics(
                "path",
                [
                    ("the onboarding checklist", _shape("it/onboarding/{w}-checklist-v{D1}.md", w)),
                    ("the VPN profile", _shape("smb://fs01/it/vpn/{w}_{D3}.ovpn", w)),
                    (
                        "the MDM enrollment profile",
                        _shape("profiles/{w}/{w}-enroll-{D2}.mobileconfig", w),
                    ),
                    ("the app bundle manifest", _shape("packages/{w}/bundle_{w}_{D3}.json", w)),
                    ("the offboarding script", _shape("scripts/offboard_{w}_{D2}.ps1", w)),
                ],
            ),
            "name": _topics(
                "name",
                [
                    ("the new hire", _person),
                    ("the new hire's manager", _person),
                    ("the laptop reseller", _org),
                    ("the approver for admin rights", _person),
                    ("the onboarding buddy", _person),
                ],
            ),
            "identifier": _topics(
                "identifier",
                [
                    ("the laptop serial", _shape("C02{A2}{D4}{A2}")),
                    ("the onboarding ticket", _shape("HD-{D6}")),
                    ("the employee id", _shape("E{D6}")),
                    ("the asset tag", _shape("AT-{D5}")),
                    ("the Okta group", _shape("okta-grp-{w}-{D3}", w)),
                ],
            ),
            "date": _topics(
                "date",
                [
                    ("the start date", _day),
                    ("the laptop delivery date", _day),
                    ("the quarterly access review", _day),
                    ("the end of probation", _day),
                    ("the badge pickup", _day),
                ],
            ),
            "error": _topics(
                "error",
                [
                    ("the error when enrolling the laptop", _helpdesk_error(1, 5)),
                    ("what the SSO login shows", _helpdesk_error(0, 4)),
                    ("the VPN client error", _helpdesk_error(2)),
                    ("the provisioning failure", _helpdesk_error(3)),
                ],
            ),
            "constraint": _said(
                "constraint",
                [
                    (
                        "the admin-rights waiting period",
                        _count(14, 90, "days"),
                        ("Local admin only {v} after the start date - security's rule.",),
                    ),
                    (
                        "the laptop model for engineers",
                        _choice("14-inch MacBook Pro", "ThinkPad X1 Carbon", "Dell XPS 15"),
                        ("Engineers get the {v} and nothing else.",),
                    ),
                    (
                        "the contractor access expiry",
                        _count(30, 180, "days"),
                        ("Contractor accounts expire after {v} at most; HR approves extensions.",),
                    ),
                    (
                        "the shipping rule",
                        _choice(
                            "signature on delivery", "office pickup only", "tracked courier only"
                        ),
                        ("Laptops go out with {v}; we lost two last year.",),
                    ),
                ],
            ),
            "decision": _choices_topics(
                [
                    (
                        "the new hire's laptop",
                        ("a ThinkPad T16", "a 16-inch MacBook Pro", "a Latitude 7450"),
                        ("their team builds on that platform", "it's what we have in stock"),
                    ),
                    (
                        "how access is granted",
                        (
                            "a role-based Okta group",
                            "per-app requests",
                            "cloning a teammate's access",
                        ),
                        ("it's auditable", "it's faster for the first week"),
                    ),
                    (
                        "the phone setup",
                        (
                            "a company iPhone",
                            "BYOD with a work profile",
                            "no phone, desk line only",
                        ),
                        ("they're on call", "security prefers it"),
                    ),
                    (
                        "the delivery method for the laptop",
                        (
                            "courier to the home address",
                            "pickup at reception",
                            "hand-over at the welcome session",
                        ),
                        ("they start remote", "it avoids customs paperwork"),
                    ),
                ]
            ),
            "preference": _said(
                "preference",
                [
                    (
                        "the contact channel",
                        _choice("Teams chat", "email only", "phone calls after lunch"),
                        ("Reach me via {v}; I'm rarely at my desk.",),
                    ),
                    (
                        "the keyboard layout",
                        _choice("German QWERTZ", "UK ISO", "US international", "Nordic layout"),
                        ("I'd like the {v} on the new laptop.",),
                    ),
                    (
                        "how instructions are written",
                        _choice(
                            "numbered steps with screenshots",
                            "short checklists",
                            "two-minute screen recordings",
                        ),
                        ("Instructions work best for me as {v}.",),
                    ),
                ],
            ),
        }

    def args(self, name: str) -> dict[str, Any]:
        n = self.noise
        if name == "get_ticket":
            return {"ticket": int(n["nn"]) * 10 + 3}
        if name == "directory_lookup":
            return {"query": n["first"].lower()}
        if name == "asset_inventory":
            return {"filter": n("model={model} site={site}")}
        if name == "access_requests":
            return {"user": n["first"].lower(), "system": n["app"]}
        if name == "mdm_device":
            return {"serial": n["hex"].upper()}
        return {"query": n("{w} {w} macos")}

    def result(self, name: str, args: dict[str, Any], size: int, plants: list[_Plant]) -> str:
        n, r = self.noise, self.r
        if name == "get_ticket":
            comments = self.rows_json(
                size,
                lambda: {"author": n["who"], "at": n["ts"],
                         "body": n(r.choice(("Tried {w} reset, no change.",
                                             "Waiting on {team} for approval.",
                                             "User confirmed it works on {site} wifi.",
                                             "Escalated, see {ref}.")))},
            )  # fmt: skip
            base = {
                "ticket": args.get("ticket"),
                "subject": n("{W} issue for {first}"),
                "status": r.choice(("open", "pending", "in progress")),
                "requester": n["who"],
                "comments": comments,
            }
            return self.record(base, plants)
        if name == "directory_lookup":
            return self.lines(
                size,
                ("dn: uid={first}{n},ou={dept},dc=corp", "cn: {who}", "title: {W} {dept} lead",
                 "manager: {who}", "l: {site}", "memberOf: okta-{w}-{n}", ""),
                plants, "kv", "ldap",
            )  # fmt: skip
        if name == "asset_inventory":
            return self.table(
                size,
                ("asset", "model", "serial", "assigned_to", "site"),
                lambda c: {"asset": n("AST{nn}"), "model": n["model"], "serial": n["hex"].upper(),
                           "assigned_to": n["who"], "site": n["site"]}[c],
                plants,
            )  # fmt: skip
        if name == "access_requests":
            return self.lines(
                size,
                ("{ts} request {ref} {app} role=viewer by {first} -> approved by {who}",
                 "{ts} request {ref} {app} role=editor by {first} -> pending {team}",
                 "{ts} revoke {ref} {app} for {who} (offboarding)"),
                plants, "log", "iam",
            )  # fmt: skip
        if name == "mdm_device":
            base = {
                "serial": args.get("serial"),
                "model": n["model"],
                "os": n("macOS {ver}"),
                "user": n["who"],
                "last_check_in": n["ts"],
                "profiles": self.rows_json(
                    size, lambda: {"name": n("com.corp.{w}.{w}"), "installed": n["iso"]}
                ),
            }
            return self.record(base, plants)
        return self.prose(
            size,
            (
                "If the {w} client shows a certificate warning, remove the old profile first.",
                "Most {w} tickets are fixed by re-enrolling the device in {app}.",
                "Contractors don't get {app} by default; request it via {team}.",
                "See also the article on {w} from {iso} by {who}.",
                "Restart the {w} agent with the script at {path}.",
            ),
            plants,
        )

    def fail(self, name: str, args: dict[str, Any], key: str, size: int) -> str:
        n = self.noise
        body = json.dumps({"error": {"code": n["nn"], "message": "KEY"}, "request": n["ref"]})
        return _error_output(n, key, size, [body], ["  upstream {w}-api answered in {ms}"])


_KITS.update(
    {
        "incident": _Incident,
        "legal": _Legal,
        "travel": _Travel,
        "mlops": _Mlops,
        "finance": _Finance,
        "helpdesk": _Helpdesk,
    }
)

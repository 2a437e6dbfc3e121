"""Realistic agent conversations with planted facts, for the context-quality eval.

:func:`generate` builds one conversation of a domain from a seed, the same
one every time: a system prompt, then 220-380 messages of an agent at work
(user requests, assistant plans and reports, tool calls, often in parallel,
and their results), 25k to 120k cl100k tokens depending on domain and seed.
Six domains (:data:`DOMAINS`), each with its own tools and noise:

- ``coding``: read_file, run_tests, grep, edit_file (code, test logs, tracebacks);
- ``support``: orders, accounts, refunds, policies;
- ``research``: web search, fetched pages and tables full of figures;
- ``data``: SQL and pandas calls, table outputs, metrics;
- ``planning``: calendars, budgets, tasks over days;
- ``debugging``: logs, configs, commands, stack traces and error codes.

Messages are OpenAI Chat dicts (``tool_calls`` / ``role: tool``), except the
conversations in Anthropic format (content blocks, ``tool_use`` and
``tool_result``): every ``support`` one, and a seed-dependent share of the
others (:func:`style_of`).

Each conversation carries 20-40 planted :class:`Fact` s, each stated once in
natural language (user text, assistant text or a tool result; early, middle
or late), of nine kinds (:data:`KINDS`), and 3-6 corrections, where a later
message gives a new value for an earlier fact. A fact's ``key`` is the short
distinctive text that recognises it (``"2,750"``, ``"/etc/ledgerd/limits.toml"``,
``"Priya Raman"``); keys are chosen after the noise is written, so that each
occurs (case-insensitively, as a substring) only in the message that plants
it, and a corrected value only before its correction and in it.
:func:`verify` checks this, and :func:`generate` asserts it.

The phrasing varies on purpose (several templates per kind and carrier,
random subjects and values, noise full of numbers, paths and names that are
not facts): the corpus is meant for tuning a summarizer, and a different,
hidden corpus will check it.
"""

from __future__ import annotations

import json
import math
import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ctxstore import TiktokenCounter

__all__ = [
    "DOMAINS",
    "KINDS",
    "Conversation",
    "Fact",
    "call_points",
    "corpus",
    "generate",
    "style_of",
    "text_of",
    "verify",
]

DOMAINS = ("coding", "support", "research", "data", "planning", "debugging")
"""The domains, in a fixed order (it takes part in the seeding)."""

KINDS = (
    "preference",
    "decision",
    "number",
    "path",
    "error",
    "name",
    "constraint",
    "identifier",
    "date",
)
"""The kinds of planted fact."""

# Total sizes, in cl100k tokens: the tier is picked from domain and seed, so
# any two seeds cover every tier once, and 4k, 16k and 64k budgets all bite
# (three tiers are over 64k, three are not).
_TIERS = (27_000, 42_000, 57_000, 76_000, 95_000, 114_000)
_ATTEMPTS = 12


@dataclass(frozen=True, slots=True)
class Fact:
    """A fact planted in a conversation.

    Attributes:
        kind: One of :data:`KINDS`.
        key: The text that recognises the fact as first planted (for a
            corrected fact, the old value).
        index: The index of the message that plants it.
        subject: What it is about, e.g. ``"the indexer batch size"``.
        carrier: Who states it: ``user``, ``assistant`` or ``tool`` (a tool result).
        old_key: For a corrected fact, the superseded value (equal to ``key``).
        new_key: For a corrected fact, the value that holds now.
        corrected_at: For a corrected fact, the index of the correcting message.
    """

    kind: str
    key: str
    index: int
    subject: str
    carrier: str
    old_key: str | None = None
    new_key: str | None = None
    corrected_at: int | None = None

    @property
    def current(self) -> str:
        """The key that recognises what holds at the end: the new value if corrected."""
        return self.new_key if self.new_key is not None else self.key


@dataclass(frozen=True, slots=True)
class Conversation:
    """One generated conversation.

    Attributes:
        domain: One of :data:`DOMAINS`.
        seed: The seed it was generated from.
        style: ``openai`` or ``anthropic``: the message format.
        messages: The messages, a system prompt first.
        facts: The planted facts, in the order they are planted.
        call_points: Indexes after which the model is called (a view is
            read): before every assistant turn, and after the last message.
    """

    domain: str
    seed: int
    style: str
    messages: list[dict[str, Any]]
    facts: list[Fact]
    call_points: list[int]


# -- text matching --------------------------------------------------------------


def text_of(value: Any) -> str:
    """Every string value inside ``value`` (a message, a list of them...), one per line.

    Dict keys are left out, values are not: tool call arguments (a JSON
    string) and tool results count like any text. This is the text keys are
    looked for in, by the generator's checks and by the eval alike.
    """
    out: list[str] = []
    _strings(value, out)
    return "\n".join(out)


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _strings(item, out)
    elif isinstance(value, list | tuple):
        for item in value:
            _strings(item, out)


def call_points(messages: Sequence[dict[str, Any]]) -> list[int]:
    """The indexes after which a model is called: before each assistant message, and the last."""
    points = [i for i in range(len(messages) - 1) if messages[i + 1].get("role") == "assistant"]
    if messages and (not points or points[-1] != len(messages) - 1):
        points.append(len(messages) - 1)
    return points


def verify(conversation: Conversation) -> list[str]:
    """What is wrong with a conversation's facts and call points; empty when sound.

    Each key occurs only in its planting message; a corrected fact's old
    key only there and in the correcting message (which comes later), and
    its new key only in the correcting message. Every key holds a character
    other than a digit (a bare number could match inside a stream entry id).
    """
    texts = [text_of(m).lower() for m in conversation.messages]

    def where(key: str) -> list[int]:
        low = key.lower()
        return [i for i, text in enumerate(texts) if low in text]

    problems: list[str] = []
    for fact in conversation.facts:
        keys = [fact.key] if fact.new_key is None else [fact.key, fact.new_key]
        for key in keys:
            if not key or key.isdigit() or len(key) < 4:
                problems.append(f"{fact.kind} key {key!r} is too weak to recognise")
        found = where(fact.key)
        if fact.corrected_at is None:
            if found != [fact.index]:
                problems.append(f"{fact.kind} {fact.key!r} at {fact.index} also in {found}")
            continue
        assert fact.new_key is not None
        if fact.index not in found or not set(found) <= {fact.index, fact.corrected_at}:
            problems.append(f"old {fact.key!r} at {fact.index} found in {found}")
        if fact.corrected_at <= fact.index:
            problems.append(f"{fact.key!r} corrected at {fact.corrected_at} before {fact.index}")
        if where(fact.new_key) != [fact.corrected_at]:
            problems.append(
                f"new {fact.new_key!r} at {fact.corrected_at} found in {where(fact.new_key)}"
            )
    if conversation.call_points != call_points(conversation.messages):
        problems.append("call points do not precede every assistant turn")
    return problems


# -- generation ---------------------------------------------------------------------


def style_of(domain: str, seed: int) -> str:
    """The message format of a conversation: ``anthropic`` or ``openai``.

    Support conversations are always in Anthropic format; the others are
    in a quarter of the seeds, a different quarter per domain.
    """
    if domain == "support" or (DOMAINS.index(domain) + seed) % 4 == 3:
        return "anthropic"
    return "openai"


def generate(domain: str, seed: int) -> Conversation:
    """The conversation of ``domain`` for ``seed``: the same every time.

    Raises:
        ValueError: ``domain`` is not one of :data:`DOMAINS`.
        AssertionError: No attempt produced keys that occur only where planted
            (never seen: each attempt draws new values).
    """
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; one of {', '.join(DOMAINS)}")
    problems: list[str] = []
    for attempt in range(_ATTEMPTS):
        rng = random.Random(seed * 1_000_003 + DOMAINS.index(domain) * 7_919 + attempt * 104_729)
        try:
            conversation = _Builder(domain, seed, rng).build()
        except _CollisionError as exc:
            problems = [str(exc)]
            continue
        problems = verify(conversation)
        if not problems:
            return conversation
    raise AssertionError(f"{domain}/{seed}: no sound conversation: {problems[:3]}")


def corpus(seeds: Sequence[int], domains: Sequence[str] = DOMAINS) -> list[Conversation]:
    """The conversations of every domain for every seed, seed-major."""
    return [generate(domain, seed) for seed in seeds for domain in domains]


class _CollisionError(Exception):
    """No value could be found that occurs nowhere else: start the attempt over."""


Sampler = Callable[[random.Random], str]


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a fact can be about: its subject, how its value is drawn, how it is said."""

    kind: str
    subject: str
    sample: Sampler
    unit: str = ""
    says: tuple[str, ...] = ()  # statements of its own (preferences, constraints)
    why: tuple[str, ...] = ()  # reasons, for decisions

    @property
    def key_name(self) -> str:
        """The subject as a config key (``indexer_batch_size``), for tool output."""
        words = re.sub(r"[^a-z0-9]+", "_", self.subject.lower()).strip("_").split("_")
        return "_".join(w for w in words if w not in ("the", "of", "for", "a", "our"))[:32]


@dataclass(slots=True)
class _Plan:
    """A fact to plant: where, by whom, and (once drawn) its values."""

    number: int
    spec: _Spec
    at: float
    carrier: str
    fix_at: float | None = None
    fix_carrier: str = "user"
    planted: bool = False
    fixed: bool = False
    planted_round: int = -1  # the episode it went into: a correction comes in a later one
    old: str = ""
    new: str = ""


@dataclass(slots=True)
class _Item:
    """A due statement: a fact's planting or its correction."""

    plan: _Plan
    correction: bool

    @property
    def carrier(self) -> str:
        return self.plan.fix_carrier if self.correction else self.plan.carrier


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


_SLOT = re.compile(r"⟦(\d+):([12])⟧")


def _slot(number: int, which: int) -> str:
    return f"⟦{number}:{which}⟧"


_COUNTER = TiktokenCounter()


def _estimate(text: str) -> float:
    """cl100k tokens of a text (placeholders count a few; message framing is not counted)."""
    return float(_COUNTER.count(text))


class _Builder:
    """Builds one conversation: a fact plan, episodes of work around it, then values."""

    def __init__(self, domain: str, seed: int, rng: random.Random) -> None:
        self.domain = domain
        self.seed = seed
        self.r = rng
        self.style = style_of(domain, seed)
        self.noise = _Noise(rng, domain)
        self.content: _Domain = _DOMAIN_TYPES[domain](rng, self.noise)
        self.turns: list[_Turn] = []
        self.count = 0  # messages rendered so far
        self.tool_messages = 0
        self.tokens = 0.0
        self.episode = 0
        tier = _TIERS[(DOMAINS.index(domain) + seed) % len(_TIERS)]
        self.target_tokens = tier * rng.uniform(0.94, 1.05)
        self.target_count = rng.randint(228, 362)
        # Every conversation gets at least one large dump (a log, a file), by this point.
        self.big_at = rng.uniform(0.15, 0.85)
        self.bigs = 0

    # -- the plan ---------------------------------------------------------------

    def _plan(self) -> list[_Plan]:
        r = self.r
        pools = {kind: list(specs) for kind, specs in self.content.specs().items()}
        for specs in pools.values():
            r.shuffle(specs)
        wanted = r.randint(20, 40)
        weights = dict(_KIND_WEIGHTS)
        chosen: list[_Spec] = []
        # One of each kind first, so every kind is measured in every conversation.
        for kind in KINDS:
            chosen.append(pools[kind].pop())
        while len(chosen) < wanted:
            kinds = [k for k in KINDS if pools[k]]
            kind = r.choices(kinds, [weights[k] for k in kinds])[0]
            chosen.append(pools[kind].pop())
        r.shuffle(chosen)
        plans = [
            _Plan(n, spec, r.uniform(0.01, 0.95), _pick(r, _CARRIERS[spec.kind]))
            for n, spec in enumerate(chosen)
        ]
        fixable = [p for p in plans if p.spec.kind in _CORRECTABLE and p.at < 0.78]
        for plan in r.sample(fixable, min(len(fixable), r.randint(3, 6))):
            plan.fix_at = r.uniform(plan.at + 0.08, 0.98)
            carriers = _FIX_CARRIERS if plan.spec.kind in _TOOL_FIXABLE else _FIX_CARRIERS_TEXT
            plan.fix_carrier = _pick(r, carriers)
        return plans

    def _due(self, plans: list[_Plan], progress: float, final: bool) -> list[_Item]:
        due = []
        for plan in plans:
            if not plan.planted and (plan.at <= progress or final):
                plan.planted = True
                plan.planted_round = self.episode
                due.append(_Item(plan, False))
            elif (
                plan.fix_at is not None
                and plan.planted
                and not plan.fixed
                and plan.planted_round < self.episode
                and (plan.fix_at <= progress or final)
            ):
                plan.fixed = True
                due.append(_Item(plan, True))
        return due

    # -- turns -------------------------------------------------------------------

    def _add(self, turn: _Turn) -> None:
        self.turns.append(turn)
        if turn.role == "results":
            n = len(turn.results) if self.style == "openai" else 1
            self.tool_messages += n
            self.count += n
            self.tokens += sum(_estimate(res.content) + 8 for res in turn.results)
        else:
            self.count += 1
            self.tokens += _estimate(turn.text or "") + 6
            self.tokens += sum(_estimate(json.dumps(c.args)) + 12 for c in turn.calls)

    def _tool_size(self, *, small: bool = False) -> int:
        """The size of the next tool result, steering the total towards the target.

        ``small`` is for a failure's output, which never is a large dump.
        """
        r = self.r
        left = max(1, self.target_count - self.count)
        share = self.tool_messages / self.count if self.count > 30 else 0.36
        tools_left = max(1.0, left * max(share, 0.2))
        chat_left = left * (1 - share) * 70
        need = (self.target_tokens - self.tokens - chat_left) / tools_left
        need = min(max(need, 60.0), 2_400.0)
        big = 0.12 if need > 1_100 else 0.06 if need > 600 else 0.025 if need > 250 else 0.008
        due = not self.bigs and self.count >= self.big_at * self.target_count
        if not small and (r.random() < big or due):
            self.bigs += 1
            return r.randint(3_000, 6_000)
        size = need * math.exp(r.gauss(0.0, 0.75) - 0.28)
        return int(min(max(size, 50.0), 900.0 if small else 1_500.0))

    def _calls(self) -> list[_Call]:
        r = self.r
        n = r.choices((1, 2, 3), (0.66, 0.24, 0.10))[0]
        calls = []
        for _ in range(n):
            name, args = self.content.call()
            calls.append(_Call(self.noise.call_id(self.style), name, args))
        return calls

    def _say(self, text: str, items: list[_Item], carrier: str) -> str:
        """``text`` with the statements of ``items`` for ``carrier`` worked in."""
        sentences = _split_sentences(text)
        for item in items:
            if item.carrier != carrier:
                continue
            statement = _statement(self.r, item, carrier)
            sentences.insert(self.r.randint(0, len(sentences)), statement)
        return " ".join(sentences)

    def _episode(self, due: list[_Item]) -> None:
        r = self.r
        content = self.content
        tool_items = [i for i in due if i.carrier == "tool"]
        if not tool_items and r.random() < 0.16:
            self._add(_Turn("user", self._say(content.chatter(), due, "user")))
            self._add(_Turn("assistant", self._say(content.chatter_reply(), due, "assistant")))
            return
        self._add(_Turn("user", self._say(content.request(), due, "user")))
        if tool_items:
            rounds = r.choice((1, 1, 2, 2, 3))
        else:
            rounds = r.choices((0, 1, 2, 3, 4), (0.14, 0.38, 0.28, 0.14, 0.06))[0]
        placements: dict[int, list[_Item]] = {}
        for item in tool_items:
            placements.setdefault(r.randrange(rounds), []).append(item)
        for round_ in range(rounds):
            calls = self._calls()
            preamble = content.preamble() if r.random() < 0.35 else None
            self._add(_Turn("assistant", preamble, calls=calls))
            inserts: dict[int, list[_Item]] = {}
            for item in placements.get(round_, []):
                inserts.setdefault(r.randrange(len(calls)), []).append(item)
            results = []
            for n, call in enumerate(calls):
                mine = inserts.get(n, [])
                errors = [i for i in mine if i.plan.spec.kind == "error" and not i.correction]
                lines = [_tool_line(r, i) for i in mine if i not in errors]
                size = self._tool_size(small=bool(errors))
                if errors:
                    body = content.result(call.name, call.args, size, lines)
                    blocks = [self.noise.error_block(_slot(i.plan.number, 1)) for i in errors]
                    results.append(_Result(call.id, body + "\n" + "\n".join(blocks), True))
                else:
                    results.append(
                        _Result(call.id, content.result(call.name, call.args, size, lines))
                    )
            self._add(_Turn("results", results=results))
        self._add(_Turn("assistant", self._say(content.report(), due, "assistant")))

    def build(self) -> Conversation:
        plans = self._plan()
        self._add(_Turn("system", self.content.system_prompt()))
        while True:
            progress = self.count / self.target_count
            final = self.count >= self.target_count - 14
            due = self._due(plans, progress, final)
            self._episode(due)
            self.episode += 1
            if final and all(p.planted and (p.fix_at is None or p.fixed) for p in plans):
                break
        self._add(_Turn("user", self.content.wrap_up()))
        messages = _render(self.turns, self.style, self.r)
        self._draw_values(plans, messages)
        facts = self._facts(plans, messages)
        values = {}
        for plan in plans:
            values[_slot(plan.number, 1)] = plan.old
            values[_slot(plan.number, 2)] = plan.new
        messages = [_substitute(m, values) for m in messages]
        facts.sort(key=lambda f: f.index)
        return Conversation(
            self.domain, self.seed, self.style, messages, facts, call_points(messages)
        )

    # -- values ---------------------------------------------------------------------

    def _draw_values(self, plans: list[_Plan], messages: list[dict[str, Any]]) -> None:
        """Draw each fact's values so that none occurs anywhere else (nor in another's)."""
        text = _SLOT.sub(" ", "\n".join(text_of(m) for m in messages)).lower()
        taken: list[str] = []
        for plan in plans:
            plan.old = self._value(plan.spec, text, taken)
            taken.append(plan.old.lower())
            if plan.fix_at is not None:
                plan.new = self._value(plan.spec, text, taken)
                taken.append(plan.new.lower())

    def _value(self, spec: _Spec, text: str, taken: list[str]) -> str:
        for _ in range(400):
            value = spec.sample(self.r)
            low = value.lower()
            if (
                len(value) >= 4
                and not value.isdigit()
                and low not in text
                and all(low not in t and t not in low for t in taken)
            ):
                return value
        raise _CollisionError(f"no unique value for {spec.subject!r}")

    def _facts(self, plans: list[_Plan], messages: list[dict[str, Any]]) -> list[Fact]:
        where: dict[str, int] = {}
        for index, message in enumerate(messages):
            for match in _SLOT.finditer(text_of(message)):
                where.setdefault(match.group(0), index)
        facts = []
        for plan in plans:
            fact = Fact(
                plan.spec.kind,
                plan.old,
                where[_slot(plan.number, 1)],
                plan.spec.subject,
                plan.carrier,
            )
            if plan.fix_at is not None:
                fact = replace(
                    fact,
                    old_key=plan.old,
                    new_key=plan.new,
                    corrected_at=where[_slot(plan.number, 2)],
                )
            facts.append(fact)
        return facts


def _pick(r: random.Random, weighted: Sequence[tuple[str, float]]) -> str:
    return r.choices([w[0] for w in weighted], [w[1] for w in weighted])[0]


def _split_sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def _substitute(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        return _SLOT.sub(lambda m: values[m.group(0)], value) if "⟦" in value else value
    if isinstance(value, dict):
        return {k: _substitute(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, values) for v in value]
    return value


def _render(turns: list[_Turn], style: str, r: random.Random) -> list[dict[str, Any]]:
    """The turns as OpenAI Chat or Anthropic Messages dicts."""
    messages: list[dict[str, Any]] = []
    for turn in turns:
        if turn.role == "system":
            messages.append({"role": "system", "content": turn.text})
        elif turn.role == "user":
            if style == "openai":
                messages.append({"role": "user", "content": turn.text})
            else:
                messages.append({"role": "user", "content": [{"type": "text", "text": turn.text}]})
        elif turn.role == "assistant" and style == "openai":
            message: dict[str, Any] = {"role": "assistant", "content": turn.text}
            if turn.calls:
                message["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.name,
                            "arguments": json.dumps(c.args, ensure_ascii=False),
                        },
                    }
                    for c in turn.calls
                ]
            messages.append(message)
        elif turn.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if turn.text:
                blocks.append({"type": "text", "text": turn.text})
            blocks.extend(
                {"type": "tool_use", "id": c.id, "name": c.name, "input": c.args}
                for c in turn.calls
            )
            messages.append({"role": "assistant", "content": blocks})
        elif style == "openai":
            messages.extend(
                {"role": "tool", "tool_call_id": res.call_id, "content": res.content}
                for res in turn.results
            )
        else:
            results = []
            for res in turn.results:
                # Both shapes Anthropic accepts: a string, or text blocks.
                body: Any = (
                    res.content if r.random() < 0.7 else [{"type": "text", "text": res.content}]
                )
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": res.call_id,
                    "content": body,
                }
                if res.error:
                    block["is_error"] = True
                results.append(block)
            messages.append({"role": "user", "content": results})
    return messages


# -- how facts are said -------------------------------------------------------------

_KIND_WEIGHTS = {
    "preference": 0.8,
    "decision": 1.1,
    "number": 1.6,
    "path": 1.1,
    "error": 1.0,
    "name": 1.2,
    "constraint": 0.9,
    "identifier": 1.2,
    "date": 1.1,
}

_CARRIERS: dict[str, tuple[tuple[str, float], ...]] = {
    "preference": (("user", 1.0),),
    "decision": (("user", 0.5), ("assistant", 0.4), ("tool", 0.1)),
    "number": (("user", 0.4), ("assistant", 0.25), ("tool", 0.35)),
    "path": (("user", 0.3), ("assistant", 0.3), ("tool", 0.4)),
    "error": (("tool", 0.7), ("user", 0.2), ("assistant", 0.1)),
    "name": (("user", 0.5), ("assistant", 0.2), ("tool", 0.3)),
    "constraint": (("user", 0.85), ("tool", 0.15)),
    "identifier": (("user", 0.45), ("assistant", 0.15), ("tool", 0.4)),
    "date": (("user", 0.55), ("assistant", 0.2), ("tool", 0.25)),
}
_CORRECTABLE = frozenset(
    {"preference", "decision", "number", "path", "name", "constraint", "identifier", "date"}
)
_TOOL_FIXABLE = frozenset({"number", "path", "name", "identifier", "date"})
_FIX_CARRIERS = (("user", 0.6), ("assistant", 0.25), ("tool", 0.15))
_FIX_CARRIERS_TEXT = (("user", 0.7), ("assistant", 0.3))

_SAYS: dict[tuple[str, str], tuple[str, ...]] = {
    ("number", "user"): (
        "{S} is {v}{u}.",
        "FYI {s} is set to {v}{u} in our setup.",
        "Keep in mind that {s} has to be {v}{u}.",
        "We run with {s} at {v}{u} in production.",
        "Use {v}{u} for {s}.",
        "Oh, and {s}: {v}{u}.",
        "Just so you know, {s} = {v}{u} at the moment.",
        "For reference, {s} came out at {v}{u} last time I checked.",
        "Somebody asked me about {s} - it's {v}{u}.",
    ),
    ("number", "assistant"): (
        "Noted: {s} is {v}{u}, and I'll work with that.",
        "From what I can see, {s} is {v}{u}.",
        "I'll assume {s} stays at {v}{u}.",
        "{S} comes out at {v}{u}, roughly what we expected.",
        "Worth recording: {s} is {v}{u}.",
    ),
    ("path", "user"): (
        "{S} is at {v}.",
        "{S} lives in {v}, please don't move it.",
        "You'll find {s} under {v}.",
        "Heads up: {s} is {v}, not where the README says.",
        "Please put {s} in {v}.",
        "If you need {s}, it's {v}.",
    ),
    ("path", "assistant"): (
        "Found {s}: it's {v}.",
        "I'll write {s} to {v}.",
        "{S} is {v}, for the record.",
        "Located {s} at {v}.",
    ),
    ("name", "user"): (
        "{S} is {v}.",
        "Loop in {v}; they're {s}.",
        "{v} is {s}, talk to them if anything breaks.",
        "FYI {s} is {v} now.",
        "If you need a name: {s} is {v}.",
        "Ask {v} - {s} - before anything risky.",
    ),
    ("name", "assistant"): (
        "According to the roster, {s} is {v}.",
        "I've noted {v} as {s}.",
        "{S}: {v}.",
        "So {s} is {v}; I'll keep them in the loop.",
    ),
    ("identifier", "user"): (
        "{S} is {v}.",
        "Here's {s}: {v}.",
        "Please reference {v} - that's {s}.",
        "For tracking, {s} is {v}.",
        "Use {v} as {s} in anything you file.",
        "Quick one: {s} = {v}.",
    ),
    ("identifier", "assistant"): (
        "{S} is {v}.",
        "I've tagged everything with {v}, which is {s}.",
        "Found {s}: {v}.",
    ),
    ("date", "user"): (
        "{S} is on {v}.",
        "{S} is scheduled for {v}.",
        "Mark your calendar: {s} happens {v}.",
        "We locked in {v} for {s}.",
        "{S}? That's {v}.",
        "Don't forget {s} on {v}.",
    ),
    ("date", "assistant"): (
        "{S} is set for {v}.",
        "I've put {s} down for {v}.",
        "Confirmed: {s} on {v}.",
    ),
    ("error", "user"): (
        "When I run it myself I get `{v}` and then it exits.",
        "It died again with {v}, pasted from the console.",
        "I keep seeing {v} in the terminal - that's {s}.",
        "Error from my side: {v}. No idea what it means.",
        "Here's {s}: {v}",
    ),
    ("error", "assistant"): (
        "The failure is {v}; that's {s}.",
        "It crashed with {v}, which is {s}.",
        "Root of it: {v}.",
    ),
    ("decision", "user"): (
        "Let's go with {v} for {s}: {why}.",
        "Decision: {s} uses {v}, because {why}.",
        "We talked it over and picked {v} for {s} since {why}.",
        "OK, final answer on {s} is {v} - {why}.",
        "I'd rather we do {v} for {s}; {why}.",
    ),
    ("decision", "assistant"): (
        "I recommend {v} for {s} because {why}; proceeding with that.",
        "Going with {v} for {s}: {why}.",
        "Between the options, {v} wins for {s} since {why}.",
    ),
}

_TOOL_LINES: dict[str, tuple[str, ...]] = {
    "number": (
        "note: {s} = {v}{u}",
        "INFO  settings: {f} resolved to {v}{u}",
        "  - {s}: {v}{u}",
        "# {s} is {v}{u} (agreed in review)",
    ),
    "path": (
        "note: {s} is stored at {v}",
        "INFO  loading {s} from {v}",
        "{f}: {v}",
        "see {v} ({s})",
    ),
    "name": (
        "owner: {v}  ({s})",
        "note: {s} is {v}",
        "assigned_to={v}  # {s}",
    ),
    "identifier": (
        "ref: {v}  # {s}",
        "{s}: {v}",
        "INFO  linked {f}={v}",
    ),
    "date": (
        "note: {s} is set for {v}",
        "{f}: {v}",
        "scheduled: {s} on {v}",
    ),
    "constraint": ("POLICY NOTE: {stmt}", "> {stmt}"),
    "decision": ("DECISION LOG: {stmt}", "- decided: {stmt}"),
}

_FIXES: dict[str, tuple[str, ...]] = {
    "user": (
        "Actually, {s} should be {v}{u}, not {o}{u}.",
        "Correction: {s} is {v}{u} now.",
        "Scratch what I said about {s} - it's {v}{u}.",
        "Update on {s}: it changed from {o}{u} to {v}{u}.",
        "I got {s} wrong earlier. It's {v}{u}.",
        "{S} is no longer {o}{u}; use {v}{u} from now on.",
        "Small fix: {s} is {v}{u} (I typed {o}{u} before).",
    ),
    "assistant": (
        "I re-checked {s}: it is {v}{u}, not {o}{u} as I said before.",
        "Correcting myself: {s} is {v}{u}.",
        "My earlier note on {s} was wrong; the right value is {v}{u}.",
    ),
    "tool": (
        "{f}: {o}{u} -> {v}{u}",
        "UPDATE {s}: was {o}{u}, now {v}{u}",
        "changed {f} to {v}{u} (was {o}{u})",
    ),
}
_DATE_FIXES = (
    "Correction: {s} moved to {v}.",
    "{S} got pushed to {v}, not {o} anymore.",
    "Change of date - {s} is now {v}.",
)
_DECISION_FIXES = {
    "user": (
        "Change of plan for {s}: {v} instead of {o}, because {why}.",
        "We're switching {s} to {v}; {why}.",
        "Forget {o} for {s}. We go with {v} since {why}.",
    ),
    "assistant": (
        "After comparing again I'm switching {s} from {o} to {v}, since {why}.",
        "Revising my call on {s}: {v}, because {why}.",
    ),
}
_PREFERENCE_FIXES = (
    "Actually, for {s} I'd rather have {v} than {o}.",
    "Change of preference on {s}: {v} from now on.",
    "Forget what I said about {s} - {v}, please.",
)
_CONSTRAINT_FIXES = {
    "user": (
        "{S} changed: the new limit is {v}{u}.",
        "Update: for {s} the limit is now {v}{u}, not {o}{u}.",
        "Revised rule on {s}: {v}{u}.",
    ),
    "assistant": ("Per the latest message, {s} is now {v}{u} (it was {o}{u}).",),
}


def _fmt(template: str, spec: _Spec, v: str, o: str = "", stmt: str = "") -> str:
    subject = spec.subject
    return template.format(
        s=subject,
        S=subject[0].upper() + subject[1:],
        v=v,
        o=o,
        u=spec.unit,
        f=spec.key_name,
        why=spec.why[0] if spec.why else "",
        stmt=stmt,
    )


def _with_reason(r: random.Random, spec: _Spec) -> _Spec:
    return replace(spec, why=(r.choice(spec.why),)) if spec.why else spec


def _statement(r: random.Random, item: _Item, carrier: str) -> str:
    """The sentence (or line) that plants or corrects a fact."""
    plan = item.plan
    spec = _with_reason(r, plan.spec)
    kind = spec.kind
    old = _slot(plan.number, 1)
    if not item.correction:
        if spec.says:
            return _fmt(r.choice(spec.says), spec, old)
        return _fmt(r.choice(_SAYS[(kind, carrier)]), spec, old)
    new = _slot(plan.number, 2)
    if kind == "decision":
        return _fmt(r.choice(_DECISION_FIXES[carrier]), spec, new, old)
    if kind == "preference":
        return _fmt(r.choice(_PREFERENCE_FIXES), spec, new, old)
    if kind == "constraint":
        return _fmt(r.choice(_CONSTRAINT_FIXES[carrier]), spec, new, old)
    templates = _FIXES[carrier]
    if kind == "date" and carrier == "user":
        templates = templates + _DATE_FIXES
    return _fmt(r.choice(templates), spec, new, old)


def _tool_line(r: random.Random, item: _Item) -> str:
    """The line of a tool result that plants or corrects a fact."""
    spec = _with_reason(r, item.plan.spec)
    if item.correction:
        return _statement(r, item, "tool")
    if spec.kind in ("constraint", "decision"):
        stmt = _statement(r, item, "user")
        return _fmt(r.choice(_TOOL_LINES[spec.kind]), spec, "", stmt=stmt)
    return _fmt(r.choice(_TOOL_LINES[spec.kind]), spec, _slot(item.plan.number, 1))


# -- value samplers -------------------------------------------------------------------

_FIRST = (
    "Priya", "Tomasz", "Aiko", "Mateo", "Ingrid", "Kwame", "Lucia", "Dmitri", "Fatima",
    "Olumide", "Sven", "Mei", "Rafael", "Yusuf", "Chloe", "Anders", "Nadia", "Haruto",
    "Beatriz", "Emeka", "Greta", "Ravi", "Zofia", "Idris", "Maren", "Jonah", "Leila",
    "Callum", "Anouk", "Tariq", "Soren", "Amara", "Viktor", "Noor", "Esteban", "Hana",
    "Bongani", "Ilse", "Kenji", "Rosalind", "Teodor", "Yara", "Dario", "Elif", "Matthias",
)  # fmt: skip
_LAST = (
    "Raman", "Kowalski", "Tanaka", "Okafor", "Lindqvist", "Mensah", "Ferreira", "Volkov",
    "Haddad", "Adeyemi", "Nakamura", "Brennan", "Castellanos", "Eriksen", "Mbeki", "Duarte",
    "Schreiber", "Aalto", "Petrova", "Quispe", "Varga", "Oyelaran", "Halloran", "Ishikawa",
    "Moreau", "Novak", "Sandoval", "Thorsen", "Wojcik", "Abara", "Kaplan", "Lemaire",
    "Oduya", "Rasmussen", "Silva", "Takeda", "Umarov", "Whitfield", "Zielinski", "Bauer",
)  # fmt: skip
_SERVICE_A = (
    "ledger", "billing", "search", "notify", "ingest", "audit", "quota", "payments", "catalog",
    "session", "render", "export", "pricing", "identity", "inventory", "routing", "media",
)  # fmt: skip
_SERVICE_B = (
    "sync", "gateway", "worker", "api", "relay", "indexer", "scheduler", "proxy", "store",
    "daemon", "bridge", "router", "collector",
)  # fmt: skip
_SERVICE_MID = ("edge", "core", "batch", "shadow", "legacy", "internal", "async", "cold", "hot")
_COMPANY_A = (
    "Halvorsen", "Brightwater", "Kestrel", "Northwind", "Ambergate", "Tidewell", "Corvid",
    "Lumen", "Ostara", "Pinecrest", "Quarrymoor", "Redfern", "Saltmarsh", "Veldt", "Wrenfield",
    "Ashcombe", "Bellhaven", "Cobalt Ridge", "Drummond", "Elderbrook",
)  # fmt: skip
_COMPANY_B = (
    "Logistics", "Analytics", "Foods", "Labs", "Freight", "Health", "Textiles", "Robotics",
    "Energy", "Media", "Outfitters", "Systems", "Pharma", "Mobility",
)  # fmt: skip
_MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_ERR_A = (
    "Stale", "Orphaned", "Duplicate", "Expired", "Missing", "Invalid", "Corrupt", "Detached",
    "Unbound", "Overdue", "Fenced", "Dangling", "Truncated", "Skewed", "Poisoned",
)  # fmt: skip
_ERR_B = (
    "Shard", "Lease", "Cursor", "Ledger", "Invoice", "Payload", "Manifest", "Snapshot",
    "Webhook", "Quota", "Schema", "Token", "Batch", "Checkpoint", "Partition", "Watermark",
)  # fmt: skip
_REASON_WORDS = (
    "quota", "bucket", "drained", "lease", "lost", "clock", "skew", "replica", "lagging",
    "nonce", "reused", "cursor", "expired", "shard", "fenced", "payload", "truncated",
    "upstream", "reset", "schema", "drift", "budget", "exhausted", "spool", "overflow",
)  # fmt: skip
_ERRNO = ("ECONNRESET", "ETIMEDOUT", "EPIPE", "ECONNREFUSED", "EHOSTUNREACH", "ENOTCONN")


def _person(r: random.Random) -> str:
    return f"{r.choice(_FIRST)} {r.choice(_LAST)}"


def _service(r: random.Random) -> str:
    """A service name; filler uses the two-part ones only, so facts have room to be unique."""
    return f"{r.choice(_SERVICE_A)}-{r.choice(_SERVICE_B)}"


def _named_service(r: random.Random) -> str:
    if r.random() < 0.3:
        return _service(r)
    return f"{r.choice(_SERVICE_A)}-{r.choice(_SERVICE_MID)}-{r.choice(_SERVICE_B)}"


def _company(r: random.Random) -> str:
    return f"{r.choice(_COMPANY_A)} {r.choice(_COMPANY_B)}"


def _date(r: random.Random) -> str:
    day, month = r.randint(1, 28), r.choice(_MONTHS)
    return f"{day} {month}" if r.random() < 0.55 else f"{month} {day}"


def _weekdays(r: random.Random) -> str:
    return r.choice(_WEEKDAYS) + "s"


def _error(r: random.Random) -> str:
    style = r.random()
    if style < 0.4:
        return f"{r.choice(_ERR_A)}{r.choice(_ERR_B)}Error"
    if style < 0.65:
        words = r.sample(_REASON_WORDS, 3)
        return "_".join(words)
    if style < 0.85:
        words = r.sample(_REASON_WORDS, 2)
        return f"ERR_{words[0].upper()}_{words[1].upper()}"
    return f"{r.choice(_ERRNO)} 10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(2, 254)}"


def _thousands(lo: int, hi: int) -> Sampler:
    return lambda r: f"{r.randint(lo, hi):,}"


def _decimal(lo: float, hi: float, places: int) -> Sampler:
    return lambda r: f"{r.uniform(lo, hi):.{places}f}"


def _percent(lo: float, hi: float) -> Sampler:
    def sample(r: random.Random) -> str:
        value = f"{r.uniform(lo, hi):.1f}"
        # "12.0%" reads as a rounded figure; a real decimal is more distinctive.
        return (value if not value.endswith(".0") else value[:-2] + ".5") + "%"

    return sample


def _money(lo: int, hi: int, *, cents: bool = False) -> Sampler:
    if cents:
        return lambda r: f"${r.uniform(lo, hi):,.2f}"
    return lambda r: f"${r.randint(lo, hi):,}"


def _one_of(*options: str) -> Sampler:
    return lambda r: r.choice(options)


def _pattern(template: str, words: Sequence[str] = ()) -> Sampler:
    """Fill ``{d4}`` (digits), ``{h7}`` (hex with a letter), ``{b8}`` (base62), ``{w}`` (a word)."""

    def fill(r: random.Random, match: re.Match[str]) -> str:
        kind, size = match.group(1), int(match.group(2) or 0)
        if kind == "w":
            return r.choice(words)
        if kind == "d":
            return str(r.randint(1, 9)) + "".join(r.choice(string.digits) for _ in range(size - 1))
        if kind == "h":
            while True:
                value = "".join(r.choice("0123456789abcdef") for _ in range(size))
                if not value.isdigit():
                    return value
        return "".join(r.choice(string.ascii_letters + string.digits) for _ in range(size))

    def sample(r: random.Random) -> str:
        return re.sub(r"\{([dhbw])(\d*)\}", lambda m: fill(r, m), template)

    return sample


def _specs(kind: str, rows: Sequence[tuple[Any, ...]]) -> list[_Spec]:
    """Specs of one kind from ``(subject, sampler[, unit])`` rows."""
    return [_Spec(kind, row[0], row[1], *(row[2:3] or ("",))) for row in rows]


def _decisions(rows: Sequence[tuple[str, Sequence[str], Sequence[str]]]) -> list[_Spec]:
    return [_Spec("decision", s, _one_of(*options), why=tuple(why)) for s, options, why in rows]


def _sayings(kind: str, rows: Sequence[tuple[str, Sampler, Sequence[str]]]) -> list[_Spec]:
    return [_Spec(kind, s, sampler, says=tuple(says)) for s, sampler, says in rows]


_LANGUAGES = (
    "Portuguese", "Dutch", "Finnish", "Polish", "Catalan", "Norwegian", "Czech", "Hungarian",
    "Romanian", "Swedish", "Turkish", "Indonesian",
)  # fmt: skip
_TIMEZONES = (
    "Europe/Lisbon", "America/Denver", "Asia/Kolkata", "Australia/Perth", "Africa/Nairobi",
    "America/Bogota", "Europe/Helsinki", "Asia/Manila", "Pacific/Auckland", "America/Halifax",
)  # fmt: skip

_COMMON_PREFERENCES = _sayings(
    "preference",
    [
        (
            "the language of replies",
            _one_of(*_LANGUAGES),
            (
                "Please always answer in {v}; my team reads these threads.",
                "Could you reply in {v} from now on?",
                "One preference: write your answers in {v}, please.",
            ),
        ),
        (
            "the time zone for times",
            _one_of(*_TIMEZONES),
            (
                "Quote any times in {v}, that's where I am.",
                "Times in {v} please, I keep getting confused by UTC.",
                "I think in {v} time, so use that for anything with a clock.",
            ),
        ),
        (
            "the date format",
            _one_of("DD/MM/YYYY", "YYYY.MM.DD", "MM-DD-YY", "DD.MM.YYYY", "YYYY/MM/DD"),
            (
                "Write dates as {v} in anything you produce.",
                "I prefer dates formatted {v}, please.",
            ),
        ),
        (
            "the length of answers",
            lambda r: f"{r.randint(61, 249)} words",
            (
                "Keep answers under {v} if you can, I read them on my phone.",
                "I prefer short replies: at most {v}.",
            ),
        ),
    ],
)


# -- noise ---------------------------------------------------------------------------------

_WORDS: dict[str, tuple[str, ...]] = {
    "coding": (
        "billing",
        "invoice",
        "ledger",
        "user",
        "session",
        "cache",
        "queue",
        "export",
        "report",
        "auth",
        "token",
        "webhook",
        "schema",
        "client",
        "retry",
        "worker",
        "handler",
        "router",
        "config",
        "payment",
        "account",
        "search",
        "index",
        "upload",
        "storage",
        "audit",
    ),
    "support": (
        "order",
        "refund",
        "shipping",
        "return",
        "warranty",
        "account",
        "billing",
        "delivery",
        "exchange",
        "voucher",
        "loyalty",
        "invoice",
        "subscription",
        "damage",
        "courier",
    ),
    "research": (
        "battery",
        "solar",
        "grid",
        "hydrogen",
        "storage",
        "lithium",
        "wind",
        "heat",
        "pump",
        "policy",
        "tariff",
        "capacity",
        "emissions",
        "market",
        "survey",
        "adoption",
    ),
    "data": (
        "orders",
        "events",
        "users",
        "sessions",
        "payments",
        "refunds",
        "cohort",
        "funnel",
        "churn",
        "revenue",
        "signup",
        "retention",
        "campaign",
        "region",
        "device",
        "plan",
    ),
    "planning": (
        "offsite",
        "launch",
        "venue",
        "catering",
        "travel",
        "budget",
        "agenda",
        "keynote",
        "workshop",
        "sponsor",
        "vendor",
        "booth",
        "hotel",
        "badge",
        "dinner",
        "rehearsal",
    ),
    "debugging": (
        "gateway",
        "worker",
        "scheduler",
        "cache",
        "queue",
        "db",
        "proxy",
        "ingress",
        "pool",
        "shard",
        "replica",
        "consumer",
        "producer",
        "cron",
        "tls",
        "dns",
        "probe",
        "sidecar",
    ),
}

_CITIES = (
    "Rotterdam", "Leipzig", "Porto", "Gdansk", "Tampere", "Lyon", "Bilbao", "Graz", "Aarhus",
    "Brno", "Cork", "Turin", "Malmo", "Ghent", "Poznan",
)  # fmt: skip


class _Noise:
    """Random filler values, looked up by name in templates (``"{person} ran {n} jobs"``)."""

    def __init__(self, rng: random.Random, domain: str) -> None:
        self.r = rng
        self.words = _WORDS[domain]
        self.year = rng.choice((2024, 2025))
        self.month = rng.randint(1, 12)
        self.day = rng.randint(1, 20)
        r = rng
        self._makers: dict[str, Callable[[], str]] = {
            "person": lambda: _person(r),
            "first": lambda: r.choice(_FIRST),
            "service": lambda: _service(r),
            "company": lambda: _company(r),
            "n": lambda: str(r.randint(2, 60)),
            "big": lambda: str(r.randint(100, 99_999)),
            "k": lambda: f"{r.randint(1, 950)}k",
            "pct": lambda: f"{r.randint(1, 99)}%",
            "ms": lambda: f"{r.randint(3, 2_900)}ms",
            "secs": lambda: f"{r.uniform(0.1, 95):.2f}s",
            "ts": self.timestamp,
            "time": lambda: f"{r.randint(7, 19):02d}:{r.choice((0, 15, 30, 45)):02d}",
            "day": lambda: r.choice(_WEEKDAYS),
            "hex": lambda: self.hex(8),
            "w": lambda: r.choice(self.words),
            "W": lambda: r.choice(self.words).capitalize(),
            "path": self.path,
            "file": lambda: f"{r.choice(self.words)}_{r.choice(self.words)}.py",
            "func": lambda: f"{r.choice(_VERBS)}_{r.choice(self.words)}",
            "ver": lambda: f"{r.randint(1, 9)}.{r.randint(0, 30)}.{r.randint(0, 12)}",
            "ip": lambda: f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(2, 254)}",
            "city": lambda: r.choice(_CITIES),
            "money": lambda: f"${r.randint(5, 990)}.{r.randint(0, 99):02d}",
            "id": lambda: f"{r.choice(('req', 'evt', 'job', 'msg'))}_{self.b62(10)}",
            "step": lambda: r.choice(_STEPS[domain]),
        }

    def __getitem__(self, name: str) -> str:
        return self._makers[name]()

    def fill(self, template: str) -> str:
        """``template`` with every ``{name}`` replaced by a fresh random value."""
        return template.format_map(self)

    def hex(self, n: int) -> str:
        return "".join(self.r.choice("0123456789abcdef") for _ in range(n))

    def b62(self, n: int) -> str:
        return "".join(self.r.choice(string.ascii_letters + string.digits) for _ in range(n))

    def timestamp(self) -> str:
        r = self.r
        day = self.day + r.randint(0, 6)
        return (
            f"{self.year}-{self.month:02d}-{day:02d}T{r.randint(0, 23):02d}:"
            f"{r.randint(0, 59):02d}:{r.randint(0, 59):02d}.{r.randint(0, 999):03d}Z"
        )

    def path(self) -> str:
        r = self.r
        root = r.choice(("src", "lib", "app", "services", "/srv", "/etc", "/var/lib", "tests"))
        depth = r.randint(1, 3)
        parts = [r.choice(self.words) for _ in range(depth)]
        ext = r.choice(("py", "yaml", "json", "sql", "md", "toml", "log", "csv", "sh"))
        return f"{root}/{'/'.join(parts)}_{r.randint(1, 9)}.{ext}"

    def call_id(self, style: str) -> str:
        if style == "anthropic":
            return "toolu_01" + self.b62(22)
        return "call_" + self.b62(24)

    def error_block(self, key: str) -> str:
        """An error as a tool shows it (traceback, log line or HTTP body), naming ``key``."""
        r = self.r
        detail = self.fill(
            r.choice(
                (
                    "while processing {id} after {ms}",
                    "{n} of {big} items affected",
                    "lease held by {service} on {ip}",
                    "expected version {ver}, got {ver}",
                    "at offset {big} of {path}",
                )
            )
        )
        frames = "\n".join(
            self.fill('  File "{path}", line {big}, in {func}\n    {func}(ctx, {w}={w})')
            for _ in range(r.randint(2, 6))
        )
        shape = r.random()
        if shape < 0.45:
            return f"Traceback (most recent call last):\n{frames}\n{key}: {detail}"
        if shape < 0.75:
            return self.fill("{ts} ERROR [{service}] request failed: ") + f"{key} ({detail})"
        body = json.dumps({"error": "KEY", "detail": detail, "request_id": self["id"]})
        return (
            "HTTP/1.1 " + r.choice(("500", "502", "409", "422")) + "\n" + body.replace("KEY", key)
        )


_VERBS = (
    "load", "parse", "build", "flush", "sync", "fetch", "apply", "resolve", "render", "commit",
    "emit", "merge", "check", "refresh", "compute", "dispatch",
)  # fmt: skip
_STEPS: dict[str, tuple[str, ...]] = {
    "coding": (
        "reproduce the failure locally",
        "read the relevant code paths",
        "write a failing test first",
        "run the full suite",
        "draft the change",
        "double-check the edge cases",
    ),
    "support": (
        "confirm the customer's identity",
        "check the carrier's latest scan",
        "draft the reply to the customer",
        "add a note to the ticket",
        "ask the warehouse for photos",
        "check the refund status with billing",
    ),
    "research": (
        "cross-check the figures with a second source",
        "read the methodology appendix",
        "pull the underlying table",
        "write up the findings",
        "compare against last year's edition",
        "note the caveats for the brief",
    ),
    "data": (
        "check the row counts",
        "compare against last week's numbers",
        "look for duplicates in the join",
        "plot the weekly series",
        "write up the findings",
        "validate the filters with the stakeholder",
    ),
    "planning": (
        "confirm with the owner",
        "update the run-of-show",
        "check the budget lines",
        "send the calendar invites",
        "chase the vendor quotes",
        "draft the agenda",
    ),
    "debugging": (
        "check the config in staging",
        "compare the pod logs before and after the deploy",
        "look at the connection pool metrics",
        "update the incident timeline",
        "update the runbook",
        "confirm with the incident commander",
    ),
}


def _lines_until(make: Callable[[], str], size: int, head: Sequence[str] = ()) -> list[str]:
    """Lines from ``make`` after ``head`` until about ``size`` tokens."""
    lines = list(head)
    tokens = sum(_COUNTER.count(line) + 1 for line in lines)
    while tokens < size:
        line = make()
        lines.append(line)
        tokens += _COUNTER.count(line) + 1
    return lines


def _place(r: random.Random, lines: list[str], inserts: Sequence[str]) -> str:
    """Join ``lines`` with each insert at a random line boundary."""
    out = list(lines)
    for insert in inserts:
        out.insert(r.randint(0, len(out)), insert)
    return "\n".join(out)


# -- domains ---------------------------------------------------------------------------------


class _Domain:
    """The noise of one domain: prompts, requests, chatter, tools and their results."""

    name = ""
    SYSTEM = ""
    REQUESTS: tuple[str, ...] = ()
    DETAILS: tuple[str, ...] = ()
    REPORTS: tuple[str, ...] = ()
    PREAMBLES: tuple[str, ...] = ()
    CHATTER = (
        "Thanks, that helps.",
        "Sorry, got pulled into a call for {n} minutes. Where were we?",
        "Coffee break, back in {n}.",
        "ok",
        "Makes sense. Keep going.",
        "Hmm, not sure about that, let me think for a sec.",
        "Can you restate the plan so far?",
        "Great progress today, honestly.",
        "My laptop is at {pct} battery so let's be quick.",
        "{first} says hi, by the way.",
        "Let's pause here for lunch, it's {time} already.",
        "Nice. What's next?",
        "Wait, did that actually work? Double-check please.",
    )
    CHATTER_REPLIES = (
        "No problem.",
        "Sure. Plan so far: 1) {step}, 2) {step}, 3) {step}. We're about {pct} through.",
        "Of course - I'll keep the thread going. Next up: {step}.",
        "Here's where we are: we've covered {n} items, {n} remain, and the next thing is "
        "to {step}.",
        "Sounds good. When you're back, I'll {step} and then {step}.",
        "Understood. I'll wait for your go-ahead before I {step}.",
        "Yes, it ran: {n} checks passed in {secs}. Next I'll {step}.",
    )
    WRAP_UP = (
        "Before we stop for today: write me a status with everything we decided, the open "
        "issues, and the next steps, with owners and dates.",
        "OK, wrap it up. Give me the summary I can paste into the ticket: decisions, numbers, "
        "names, ids, deadlines, anything I'd need tomorrow.",
        "Last thing: a complete handover note for whoever picks this up next, please.",
    )

    def __init__(self, rng: random.Random, noise: _Noise) -> None:
        self.r = rng
        self.noise = noise

    def specs(self) -> dict[str, list[_Spec]]:
        """Every spec this domain can plant, by kind (subjects unique within a domain)."""
        raise NotImplementedError

    def system_prompt(self) -> str:
        return self.noise.fill(self.SYSTEM)

    def _sentences(self, pool: Sequence[str], more: Sequence[str], lo: int, hi: int) -> str:
        """One sentence of ``pool``, then ``lo``-``hi`` distinct ones of ``more``."""
        first = self.r.choice(pool)
        rest = [m for m in more if m != first]
        picked = self.r.sample(rest, min(len(rest), self.r.randint(lo, hi)))
        return " ".join(self.noise.fill(s) for s in [first, *picked])

    def request(self) -> str:
        return self._sentences(self.REQUESTS, self.DETAILS, 0, 4)

    def report(self) -> str:
        return self._sentences(self.REPORTS, self.REPORTS, 0, 3)

    def preamble(self) -> str:
        return self.noise.fill(self.r.choice(self.PREAMBLES))

    def chatter(self) -> str:
        return self.noise.fill(self.r.choice(self.CHATTER))

    def chatter_reply(self) -> str:
        return self.noise.fill(self.r.choice(self.CHATTER_REPLIES))

    def wrap_up(self) -> str:
        return self.r.choice(self.WRAP_UP)

    def call(self) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def result(self, name: str, args: dict[str, Any], size: int, inserts: list[str]) -> str:
        raise NotImplementedError

    # Shared shapes of tool output.

    def log_lines(self, size: int, inserts: Sequence[str], service: str | None = None) -> str:
        n = self.noise
        svc = service or n["service"]
        templates = (
            "{ts} INFO  [" + svc + "] handled {id} in {ms} status=200 bytes={big}",
            "{ts} DEBUG [" + svc + "] cache hit ratio={pct} keys={big}",
            "{ts} INFO  [" + svc + "] processed batch {hex} count={big} lag={ms}",
            "{ts} WARN  [" + svc + "] slow call to {service} took {ms} (threshold {ms})",
            "{ts} INFO  [" + svc + "] heartbeat ok pod=" + svc + "-{hex} rss={big}KiB",
            "{ts} ERROR [" + svc + "] retrying {id}: upstream timeout after {ms} (attempt {n})",
            "{ts} INFO  [" + svc + "] GET /v{n}/{w}/{big} 200 {ms}",
        )
        lines = _lines_until(lambda: n.fill(self.r.choice(templates)), size)
        return _place(self.r, lines, inserts)

    def table(self, columns: Sequence[str], cell: Callable[[str], str], size: int) -> list[str]:
        head = [" | ".join(columns), " | ".join("-" * len(c) for c in columns)]
        return _lines_until(lambda: " | ".join(cell(c) for c in columns), size, head)

    def prose(self, sentences: Sequence[str], size: int, inserts: Sequence[str]) -> str:
        paragraphs: list[str] = []

        def paragraph() -> str:
            k = self.r.randint(2, 5)
            return " ".join(self.noise.fill(self.r.choice(sentences)) for _ in range(k))

        paragraphs = _lines_until(paragraph, size)
        return _place(self.r, paragraphs, inserts).replace("\n", "\n\n")


class _Coding(_Domain):
    name = "coding"
    SYSTEM = (
        "You are a senior software engineer working in the user's repository through tools. "
        "Tools: read_file(path) returns a file with line numbers; grep(pattern, path) searches "
        "the tree; run_tests(args) runs pytest; edit_file(path, old, new) applies an exact "
        "replacement. Read before you edit, keep diffs small, run the tests after every "
        "change, and never invent file contents. The repository is a Python 3.11 service "
        "(FastAPI, SQLAlchemy, Celery) with about {big} lines of code; CI runs on every push. "
        "Explain what you changed and why in two or three sentences after each step."
    )
    REQUESTS = (
        "Can you look at why {func} fails on CI? It passed locally for me.",
        "Refactor {func} in {path} so it stops doing one query per row.",
        "Add a retry around the call to {service} in {path}.",
        "The /{w} endpoint returns 500 for about {pct} of requests. Find out why.",
        "Please write tests for {func}; coverage of {file} is terrible.",
        "Rename {func} to something clearer and update the callers.",
        "Why is the {w} job so slow? It took {secs} on the last run.",
        "Can you clean up the imports in {path}? Ruff complains about {n} of them.",
        "Check whether {func} handles an empty {w} list.",
        "Let's get the flaky test in {path} under control.",
    )
    DETAILS = (
        "It started after the deploy at {time}.",
        "CI run #{big} shows it.",
        "{person} mentioned it in standup.",
        "The last green build was {n} commits ago.",
        "Don't touch {path} for now, someone else is editing it.",
        "There's a related TODO in {file}.",
        "Locally it takes {secs}, on CI more like {secs}.",
        "The logs show {n} retries before it gives up.",
        "I think it's related to the {w} changes from last sprint.",
        "Branch is feature/{w}-{hex}.",
    )
    REPORTS = (
        "Done. The change touches {n} lines in {path}; all {big} tests pass in {secs}.",
        "I found the cause: {func} reads the {w} before it is committed. I moved the read "
        "after the flush.",
        "The test suite is green again except for {n} skipped tests that need network.",
        "I've made the edit; next I'll run the {w} tests to be sure.",
        "Summary: {func} now validates its input, and {func} no longer swallows errors.",
        "That grep shows {n} call sites; I updated all of them.",
        "No behaviour change expected; the diff is {n} lines.",
        "Plan: {step}, then {step}, then {step}.",
    )
    PREAMBLES = (
        "Let me look at the code first.",
        "I'll check the tests and the file in parallel.",
        "Searching for the call sites.",
        "Running the suite to see where we stand.",
        "Applying the change now.",
    )

    def specs(self) -> dict[str, list[_Spec]]:
        w = self.noise.words
        return {
            "number": _specs(
                "number",
                [
                    ("the indexer batch size", _thousands(1_100, 9_000)),
                    ("the HTTP client timeout", _thousands(1_100, 30_000), " ms"),
                    ("the worker memory limit", _thousands(1_024, 16_000), " MiB"),
                    ("the export row limit", _thousands(10_000, 500_000), " rows"),
                    ("the cache TTL", _thousands(1_200, 86_000), " seconds"),
                    ("the max upload size", _thousands(2_000, 50_000), " KB"),
                    ("the trace sampling ratio", _decimal(0.001, 0.2, 4)),
                    ("the retry backoff multiplier", _decimal(1.1, 3.9, 2)),
                ],
            ),
            "path": _specs(
                "path",
                [
                    ("the settings module", _pattern("src/{w}/settings/{w}_{w}.py", w)),
                    ("the migration script", _pattern("migrations/versions/{h4}_{w}_{w}.py", w)),
                    ("the flaky test", _pattern("tests/{w}/test_{w}_{w}.py", w)),
                    ("the fixture data", _pattern("tests/fixtures/{w}_{w}_{d2}.json", w)),
                    ("the deploy script", _pattern("scripts/deploy_{w}_{w}.sh", w)),
                    ("the CI workflow", _pattern(".github/workflows/{w}-{w}.yml", w)),
                ],
            ),
            "name": _specs(
                "name",
                [
                    ("the reviewer for this change", _person),
                    ("the on-call engineer this week", _person),
                    ("the service that owns refunds", _named_service),
                    ("the tech lead of the payments team", _person),
                    ("the service we call for tax rates", _named_service),
                    ("the customer who reported the bug", _company),
                ],
            ),
            "identifier": _specs(
                "identifier",
                [
                    ("the commit that introduced the regression", _pattern("{h7}")),
                    ("the ticket for this work", _pattern("PAY-{d4}")),
                    ("the pull request", _pattern("PR-{d5}")),
                    ("the failing CI job", _pattern("job-{d6}-{w}", w)),
                    ("the Sentry issue", _pattern("SENTRY-{b6}")),
                ],
            ),
            "date": _specs(
                "date",
                [
                    ("the code freeze", _date),
                    ("the next release", _date),
                    ("the deprecation of the v1 API", _date),
                    ("the security review", _date),
                    ("the migration window", _date),
                ],
            ),
            "error": _specs(
                "error",
                [
                    ("the error the nightly export dies with", _error),
                    ("what the integration test fails on", _error),
                    ("the crash in the worker", _error),
                    ("the error from the staging deploy", _error),
                    ("the exception in the webhook handler", _error),
                ],
            ),
            "constraint": _sayings(
                "constraint",
                [
                    (
                        "the minimum coverage",
                        _percent(70, 96),
                        (
                            "Coverage must not drop below {v}, CI enforces it.",
                            "Hard rule: keep coverage at {v} or above.",
                        ),
                    ),
                    (
                        "the no-deploy days",
                        _weekdays,
                        (
                            "Never deploy on {v}, that's a team rule.",
                            "No production changes on {v}, please.",
                        ),
                    ),
                    (
                        "the query budget per request",
                        lambda r: f"{r.randint(11, 95)} queries",
                        ("A request must not run more than {v}; we alert above that.",),
                    ),
                    (
                        "the protected service",
                        _named_service,
                        ("Don't touch {v} without sign-off from its owners.",),
                    ),
                ],
            ),
            "decision": _decisions(
                [
                    (
                        "the job queue",
                        ("Dramatiq", "RQ workers", "Huey", "Arq workers", "Procrastinate"),
                        (
                            "it keeps the retry semantics we need",
                            "the ops team already runs it elsewhere",
                            "it avoids the extra broker",
                        ),
                    ),
                    (
                        "the pagination style",
                        ("keyset pagination", "cursor tokens", "seek pagination"),
                        (
                            "offsets get slow past a few thousand rows",
                            "clients already handle opaque tokens",
                        ),
                    ),
                    (
                        "the locking strategy",
                        ("advisory locks", "optimistic versioning", "SELECT FOR UPDATE SKIP"),
                        (
                            "we saw deadlocks with the current approach",
                            "it keeps the hot path lock-free",
                        ),
                    ),
                    (
                        "the serialization library",
                        ("msgspec", "orjson", "ujson", "rapidjson"),
                        ("it is the fastest in our benchmark", "it validates at decode time"),
                    ),
                ]
            ),
            "preference": _COMMON_PREFERENCES
            + _sayings(
                "preference",
                [
                    (
                        "the indentation",
                        _one_of("tabs", "two-space indents", "four-space indents"),
                        ("I prefer {v} in anything new.", "Use {v}, please - it's what I like."),
                    ),
                    (
                        "the package manager",
                        _one_of("pnpm", "poetry", "pip-tools", "hatch"),
                        ("Use {v} for dependencies; I don't want anything else.",),
                    ),
                    (
                        "the commit style",
                        _one_of("Conventional Commits", "gitmoji prefixes", "imperative subjects"),
                        ("I like commit messages in {v}.", "Write commit messages with {v}."),
                    ),
                ],
            ),
        }

    def call(self) -> tuple[str, dict[str, Any]]:
        n = self.noise
        name = self.r.choices(("read_file", "run_tests", "grep", "edit_file"), (4, 3, 3, 2))[0]
        if name == "read_file":
            return name, {"path": n.path().rsplit(".", 1)[0] + ".py"}
        if name == "run_tests":
            return name, {"args": n.fill(self.r.choice(("-q tests/{w}", "-k {func}", "-x -q")))}
        if name == "grep":
            return name, {"pattern": n["func"], "path": self.r.choice(("src", "tests", "."))}
        return name, {
            "path": n.path().rsplit(".", 1)[0] + ".py",
            "old": n.fill("{func}(ctx)"),
            "new": n.fill("{func}(ctx, {w}={w})"),
        }

    def result(self, name: str, args: dict[str, Any], size: int, inserts: list[str]) -> str:
        if name == "read_file":
            return self.source(size, inserts)
        if name == "run_tests":
            return self.pytest(size, inserts)
        if name == "grep":
            lines = _lines_until(
                lambda: self.noise.fill("{path}:{big}:    result = {func}({w}, timeout={ms})"),
                size,
            )
            return _place(self.r, lines, inserts)
        line = self.r.randint(10, 900)
        head = [f"Applied 1 edit to {args.get('path')}", f"@@ -{line},7 +{line},8 @@"]
        lines = _lines_until(
            lambda: self.noise.fill(self.r.choice((" {w} = {func}({w})", "-    {func}(ctx)",
                                                   "+    {func}(ctx, {w}={w})"))),
            size,
            head,
        )  # fmt: skip
        return _place(self.r, lines, inserts)

    def source(self, size: int, inserts: Sequence[str]) -> str:
        n, r = self.noise, self.r
        statements = (
            "        {w} = await self.{func}({w}, limit={n})",
            "        if not {w}:",
            "            raise ValueError(f'no {w} for {{{w}!r}}')",
            "        log.debug('{func} took %s', elapsed)",
            "        return [{func}(x) for x in {w} if x.{w}]",
            "        # see {path}",
            "        self._{w}[{w}.id] = {w}",
            "        await session.execute(select({W}).where({W}.{w}_id == {w}_id))",
        )

        def chunk() -> str:
            if r.random() < 0.25:
                return n.fill('\nclass {W}{W}({W}Base):\n    """{W} for the {w} flow."""\n')
            body = "\n".join(n.fill(r.choice(statements)) for _ in range(r.randint(3, 8)))
            return n.fill("    async def {func}(self, {w}: {W}, {w}: int = {n}) -> {W}:\n") + body

        head = [n.fill("\"\"\"{W} {w} module.\"\"\""), "", "from __future__ import annotations",
                n.fill("from app.{w} import {W}, {W}"), "import logging", ""]  # fmt: skip
        lines = _lines_until(chunk, size, head)
        text = _place(r, lines, inserts)
        if r.random() < 0.5:  # line-numbered, as many file tools show
            text = "\n".join(f"{i + 1:>5}  {line}" for i, line in enumerate(text.split("\n")))
        return text

    def pytest(self, size: int, inserts: Sequence[str]) -> str:
        n, r = self.noise, self.r
        head = [
            "============================= test session starts ==============================",
            f"platform linux -- Python 3.11.{r.randint(2, 9)}, pytest-8.{r.randint(0, 3)}.0, "
            "pluggy-1.5.0",
            n.fill("rootdir: /srv/app, configfile: pyproject.toml, collected {big} items"),
        ]
        lines = _lines_until(
            lambda: n.fill(
                r.choice(
                    (
                        "tests/{w}/test_{w}.py::test_{func} PASSED [ {n}%]",
                        "tests/{w}/test_{w}.py::test_{func}[{w}-{n}] PASSED [ {n}%]",
                        "tests/{w}/test_{w}.py::test_{func} SKIPPED (needs {service}) [ {n}%]",
                    )
                )
            ),
            size,
            head,
        )
        if r.random() < 0.3:  # a failing run: a traceback of an ordinary error, not a fact
            failed = r.randint(1, 3)
            lines += [
                "=================================== FAILURES ===================================",
                n.fill("___________________________ test_{func} ___________________________"),
                n.fill('  File "{path}", line {big}, in test_{func}'),
                n.fill("    assert result.{w} == {n}"),
                n.fill(
                    r.choice(
                        (
                            "E   AssertionError: assert {n} == {n}",
                            "E   KeyError: '{w}_id'",
                            "E   TimeoutError: {service} did not answer within {ms}",
                            "E   ValueError: invalid {w}: {hex}",
                        )
                    )
                ),
            ]
            tail = n.fill(
                f"====== {failed} failed, {{big}} passed, {{n}} warnings in {{secs}} ======"
            )
        else:
            tail = n.fill(
                "================ {big} passed, {n} skipped, {n} warnings in {secs} ====="
            )
        return _place(r, lines, inserts) + "\n" + tail


class _Support(_Domain):
    name = "support"
    SYSTEM = (
        "You are the customer support assistant for an online outdoor-gear retailer. Be warm, "
        "concise and accurate. Tools: lookup_order(order_id), get_account(email), "
        "search_policies(query), list_tickets(account), issue_refund(order_id, amount, reason), "
        "shipment_events(tracking). Verify identity before discussing orders (name plus email "
        "or postcode). Refunds above the agent limit need a supervisor. Quote policy text "
        "exactly; never promise delivery dates the carrier has not given. Our hours are "
        "{time}-{time} on weekdays; the returns portal is open 24/7."
    )
    REQUESTS = (
        "Hi, my {w} still hasn't arrived and it's been {n} days.",
        "I was charged twice for the same {w}, can you check?",
        "How do I return a {w} that arrived damaged?",
        "Can I change the delivery address on my order? I'm moving to {city}.",
        "The tracking page says delivered but I have nothing. Courier was {company}.",
        "I'd like to cancel my subscription before the next renewal.",
        "Do you price-match? I saw the same tent for {money} elsewhere.",
        "Why did my voucher not apply at checkout?",
        "Can you tell me what happened with my refund from last month?",
        "The zip on the {w} broke after {n} uses.",
    )
    DETAILS = (
        "I ordered it on a {day}.",
        "My neighbour {first} got theirs already.",
        "The box said {n} kg but it felt lighter.",
        "I paid {money} including shipping.",
        "I called yesterday and waited {n} minutes.",
        "It's a gift so I'm a bit stressed about it.",
        "Your site showed {n} in stock at the time.",
        "I'm usually around after {time}.",
        "The courier left a note with reference {hex}.",
    )
    REPORTS = (
        "Thanks for your patience. I've checked the order and it left our warehouse in "
        "{city}; the carrier shows {n} scan events so far.",
        "I'm sorry about the trouble. I can see the charge of {money} and a pending "
        "authorisation that should drop off within {n} days.",
        "I've looked at our policy: items can be returned within {n} days if unused.",
        "Good news - the replacement is reserved for you, {n} units were left.",
        "I've added a note to your account so the team sees the history.",
        "Here's what I can do next: {step}.",
    )
    PREAMBLES = (
        "Let me pull up your order.",
        "One moment while I check the account and the policy.",
        "I'll look at the shipment events.",
    )

    def specs(self) -> dict[str, list[_Spec]]:
        w = self.noise.words
        return {
            "number": _specs(
                "number",
                [
                    ("the refund amount approved", _money(120, 4_800, cents=True)),
                    ("the customer's loyalty points balance", _thousands(1_200, 90_000), " pts"),
                    ("the parcel weight", _decimal(1.1, 38.0, 2), " kg"),
                    ("the store credit offered", _money(15, 450, cents=True)),
                    ("the account's yearly spend", _money(1_000, 40_000)),
                    ("the discount on the replacement", _percent(5, 45)),
                ],
            ),
            "path": _specs(
                "path",
                [
                    ("the refund policy page", _pattern("/help/policies/{w}-{w}-v{d1}", w)),
                    ("the return label", _pattern("/labels/{d4}/{w}_{b6}.pdf", w)),
                    ("the macro for delays", _pattern("macros/{w}/{w}_delay_{d2}.txt", w)),
                    ("the ticket export", _pattern("exports/{w}/{w}_{d6}.csv", w)),
                    ("the damage photos", _pattern("uploads/{b8}/{w}_photos.zip", w)),
                ],
            ),
            "name": _specs(
                "name",
                [
                    ("the customer", _person),
                    ("the supervisor who approved the refund", _person),
                    ("the courier for the replacement", _company),
                    ("the customer's employer on the invoice", _company),
                    ("the warehouse contact", _person),
                    ("the colleague who handled the first call", _person),
                ],
            ),
            "identifier": _specs(
                "identifier",
                [
                    ("the order in question", _pattern("ORD-{d5}")),
                    ("the support ticket", _pattern("TKT-{d5}")),
                    ("the customer's account id", _pattern("acct_{b8}")),
                    ("the return authorisation", _pattern("RMA-{d4}-{w}", w)),
                    ("the replacement's tracking number", _pattern("1Z{b6}{d6}")),
                    ("the invoice", _pattern("INV-{d4}-{d5}")),
                ],
            ),
            "date": _specs(
                "date",
                [
                    ("the original purchase date", _date),
                    ("the promised delivery date", _date),
                    ("the end of the return window", _date),
                    ("the callback the customer asked for", _date),
                    ("the renewal date of the subscription", _date),
                ],
            ),
            "error": _specs(
                "error",
                [
                    ("the error the checkout shows", _error),
                    ("what the refund tool answered", _error),
                    ("the payment gateway's error", _error),
                    ("the error on the returns portal", _error),
                ],
            ),
            "constraint": _sayings(
                "constraint",
                [
                    (
                        "the agent refund limit",
                        _money(150, 2_000),
                        (
                            "Remember the rule: refunds must not exceed {v} without a supervisor.",
                            "Policy says agents can't refund more than {v} on their own.",
                        ),
                    ),
                    (
                        "the contact hours",
                        lambda r: f"after {r.randint(6, 9)}:{r.choice(('15', '45'))} pm",
                        ("Please don't call me {v}, I have a newborn.",),
                    ),
                    (
                        "the no-contact channel",
                        _one_of("WhatsApp", "Telegram", "Messenger", "text messages"),
                        ("Never contact me via {v}, I don't use it.",),
                    ),
                    (
                        "the goodwill cap",
                        _percent(5, 30),
                        ("Goodwill credits can't go above {v} of the order value.",),
                    ),
                ],
            ),
            "decision": _decisions(
                [
                    (
                        "the resolution",
                        ("a full replacement", "store credit", "a partial refund", "an exchange"),
                        (
                            "the item is out of warranty but the customer is a regular",
                            "the carrier admitted the loss",
                        ),
                    ),
                    (
                        "the return shipping",
                        ("a prepaid label", "a courier pickup", "a drop-off voucher"),
                        ("the customer has no printer", "it is cheapest for bulky parcels"),
                    ),
                    (
                        "the escalation path",
                        ("the logistics desk", "the billing team", "the fraud queue"),
                        ("the charge looks duplicated", "the parcel was misrouted"),
                    ),
                ]
            ),
            "preference": _COMMON_PREFERENCES
            + _sayings(
                "preference",
                [
                    (
                        "how to address the customer",
                        lambda r: f"Dr. {r.choice(_LAST)}",
                        ("Please call me {v}, not by my first name.",),
                    ),
                    (
                        "the preferred contact channel",
                        _one_of("email only", "phone calls", "the chat widget"),
                        ("I prefer {v} for updates.", "If you need me, {v} is best."),
                    ),
                ],
            ),
        }

    def call(self) -> tuple[str, dict[str, Any]]:
        n, r = self.noise, self.r
        name = r.choice(
            ("lookup_order", "get_account", "search_policies", "list_tickets", "issue_refund",
             "shipment_events")
        )  # fmt: skip
        makers: dict[str, Callable[[], dict[str, Any]]] = {
            "lookup_order": lambda: {"order_id": f"W{r.randint(100_000, 999_999)}"},
            "get_account": lambda: {"email": f"{n['first'].lower()}.{n['w']}@example.com"},
            "search_policies": lambda: {"query": n.fill("{w} {w} policy")},
            "list_tickets": lambda: {"account": n.b62(10)},
            "issue_refund": lambda: {
                "order_id": f"W{r.randint(100_000, 999_999)}",
                "amount": n["money"],
                "reason": n["w"],
            },
            "shipment_events": lambda: {"tracking": n.b62(14).upper()},
        }
        return name, makers[name]()

    def result(self, name: str, args: dict[str, Any], size: int, inserts: list[str]) -> str:
        n, r = self.noise, self.r
        if name == "search_policies":
            return self.prose(
                (
                    "Items may be returned within {n} days of delivery if unused and in the "
                    "original packaging.",
                    "Refunds are issued to the original payment method within {n} business days.",
                    "Orders over {money} ship free within the mainland.",
                    "Damaged items must be reported within {n} days with photos.",
                    "Vouchers cannot be combined with {w} discounts.",
                    "Section {n}.{n} of the terms covers {w} claims.",
                ),
                size,
                inserts,
            )
        if name == "shipment_events":
            lines = _lines_until(
                lambda: n.fill("{ts}  {city}  {W} scan  facility {hex}  handler {first}"), size
            )
            return _place(r, lines, inserts)
        if name == "list_tickets":
            lines = self.table(
                ("ticket", "opened", "status", "topic", "agent"),
                lambda c: {
                    "ticket": f"#{r.randint(10_000, 99_999)}",
                    "opened": n["ts"][:10],
                    "status": r.choice(("open", "closed", "pending")),
                    "topic": n["w"],
                    "agent": n["first"],
                }[c],
                size,
            )
            return _place(r, lines, inserts)
        if name == "issue_refund":
            head = [
                f"refund rf_{n.b62(12)} queued: {args.get('amount')} to the original payment "
                f"method of {args.get('order_id')}",
                n.fill("expected settlement: {n} business days; ledger entry {hex}"),
            ]
            lines = _lines_until(lambda: n.fill("  audit: {ts} {first} {w} check ok"), size, head)
            return _place(r, lines, inserts)
        if name == "get_account":
            record: dict[str, Any] = {
                "account": n.b62(10),
                "email": args.get("email"),
                "plan": r.choice(("basic", "plus", "pro")),
                "created": n["ts"][:10],
                "orders": [],
            }
            key = "orders"
        else:
            record = {
                "id": args.get("order_id") or n.b62(10),
                "status": r.choice(("shipped", "processing", "delivered", "refunded")),
                "placed_at": n["ts"],
                "total": n["money"],
                "items": [],
            }
            key = "items"
        rows: list[dict[str, Any]] = []
        tokens = 60
        while tokens < size:
            row = {
                "sku": f"SKU-{n.hex(6).upper()}",
                "name": n.fill("{W} {W} {n}L"),
                "qty": r.randint(1, 4),
                "price": n["money"],
                "warehouse": n["city"],
            }
            if key == "orders":
                row = {
                    "order": f"W{r.randint(100_000, 999_999)}",
                    "placed": n["ts"][:10],
                    "total": n["money"],
                    "status": r.choice(("delivered", "returned")),
                }
            rows.append(row)
            tokens += _COUNTER.count(json.dumps(row, indent=1)) + 4
        record[key] = rows
        record["notes"] = list(inserts)  # where agents' tools keep free text
        return json.dumps(record, indent=1, ensure_ascii=False)


class _Research(_Domain):
    name = "research"
    SYSTEM = (
        "You are a research assistant for an energy-policy analyst. Use web_search(query), "
        "fetch_page(url) and extract_table(url) to find primary sources. Always give figures "
        "with their source and year, distinguish estimates from measurements, and flag "
        "conflicting numbers instead of averaging them. Prefer agency statistics and "
        "peer-reviewed work over press releases. Today is {ts}."
    )
    REQUESTS = (
        "Find recent numbers on {w} {w} adoption in the EU.",
        "What does the literature say about {w} costs since {n}00?",
        "Can you compare the {w} capacity figures from the two agencies?",
        "Pull the table with {w} prices by country from that report.",
        "I need a source for the claim that {w} demand grew {pct} last year.",
        "Check if the {company} white paper holds up.",
        "Summarise what {person} argues in the {w} paper.",
        "Look for survey data on household {w} use.",
    )
    DETAILS = (
        "The draft is due to {first} soon.",
        "Last time we used the {n}th edition of the outlook.",
        "The chart in section {n} looks off to me.",
        "I only trust figures after {n}0 or so.",
        "There was a webinar on this at {time}.",
        "Their methodology appendix is about {n} pages.",
        "Ignore anything from blogs.",
    )
    REPORTS = (
        "I found {n} relevant sources; the most solid is the agency report with a sample of "
        "{big} installations.",
        "The two figures differ by about {pct} because one counts {w} and the other does not.",
        "The table has {n} countries; {n} have data for every year.",
        "That claim traces back to a press release, not to measured data.",
        "Estimates range from {k} to {k} units depending on the scenario.",
        "Next I'll {step}.",
    )
    PREAMBLES = ("Searching now.", "Let me fetch both pages.", "I'll pull the table.")

    def specs(self) -> dict[str, list[_Spec]]:
        w = self.noise.words
        return {
            "number": _specs(
                "number",
                [
                    ("the market size estimate", _money(1_200, 98_000), " million"),
                    ("the survey sample size", _thousands(1_100, 60_000), " respondents"),
                    ("the adoption rate in 2023", _percent(3, 64)),
                    ("the growth figure we quote", _percent(1, 38)),
                    ("the median installed price", _money(1_050, 19_000)),
                    ("the emissions estimate", _thousands(1_100, 900_000), " tonnes"),
                    ("the capacity factor", _decimal(0.11, 0.58, 3)),
                ],
            ),
            "path": _specs(
                "path",
                [
                    ("the draft report", _pattern("drive/research/{w}-{w}/draft_v{d1}.docx", w)),
                    ("the bibliography file", _pattern("refs/{w}_{w}_{d4}.bib", w)),
                    ("the source data", _pattern("data/raw/{w}_{w}_{d4}.csv", w)),
                    ("the figure for section two", _pattern("figures/{w}_{w}_{d2}.svg", w)),
                    ("the agency PDF", _pattern("https://stats.example.org/{w}/{d4}/{w}.pdf", w)),
                ],
            ),
            "name": _specs(
                "name",
                [
                    ("the lead author of the main study", _person),
                    ("our reviewer at the institute", _person),
                    ("the commissioning client", _company),
                    ("the statistician who built the panel", _person),
                    ("the data provider", _company),
                ],
            ),
            "identifier": _specs(
                "identifier",
                [
                    ("the DOI of the main study", _pattern("10.{d4}/{w}.{d4}.{d3}", w)),
                    ("the dataset id", _pattern("DS-{d4}-{w}", w)),
                    ("the report number", _pattern("TR-{d3}-{b4}")),
                    ("the grant number", _pattern("GA-{d6}")),
                    ("the survey wave", _pattern("wave-{d2}{w}", w)),
                ],
            ),
            "date": _specs(
                "date",
                [
                    ("the draft deadline", _date),
                    ("the data cut-off", _date),
                    ("the client presentation", _date),
                    ("the peer review call", _date),
                    ("the publication date of the outlook", _date),
                ],
            ),
            "error": _specs(
                "error",
                [
                    ("the error when fetching the agency table", _error),
                    ("what the PDF extractor fails with", _error),
                    ("the error from the statistics API", _error),
                ],
            ),
            "constraint": _sayings(
                "constraint",
                [
                    (
                        "the oldest usable source",
                        lambda r: f"before {r.randint(2005, 2019)}",
                        ("Don't cite anything published {v}, the methods changed since.",),
                    ),
                    (
                        "the word limit of the brief",
                        _thousands(1_200, 9_000),
                        ("The brief must stay under {v} words, the client was explicit.",),
                    ),
                    (
                        "the excluded publisher",
                        _company,
                        ("Never use figures from {v}, they have a conflict of interest.",),
                    ),
                    (
                        "the research budget",
                        _money(1_500, 25_000),
                        ("We can't spend more than {v} on paywalled data.",),
                    ),
                ],
            ),
            "decision": _decisions(
                [
                    (
                        "the baseline scenario",
                        (
                            "the stated-policies scenario",
                            "the net-zero pathway",
                            "the low-demand case",
                        ),
                        ("the client wants a conservative view", "it matches the agency's framing"),
                    ),
                    (
                        "the price measure",
                        ("levelised cost", "installed cost per kW", "real 2022 euros"),
                        ("it is comparable across countries", "the sources agree on it"),
                    ),
                    (
                        "the study to anchor on",
                        ("the Fraunhofer meta-study", "the NREL benchmark", "the IEA review"),
                        ("it has the largest sample", "its method is public"),
                    ),
                ]
            ),
            "preference": _COMMON_PREFERENCES
            + _sayings(
                "preference",
                [
                    (
                        "the citation style",
                        _one_of("APA 7th", "Chicago author-date", "Vancouver style", "Harvard"),
                        ("I prefer citations in {v}.", "Format references as {v}, please."),
                    ),
                    (
                        "the units",
                        _one_of("metric tonnes", "short tons", "terawatt-hours", "exajoules"),
                        ("Always convert to {v} so the tables line up.",),
                    ),
                ],
            ),
        }

    def call(self) -> tuple[str, dict[str, Any]]:
        n, r = self.noise, self.r
        name = r.choices(("web_search", "fetch_page", "extract_table"), (4, 4, 2))[0]
        if name == "web_search":
            return name, {"query": n.fill("{w} {w} {w} statistics {n}")}
        return name, {"url": n.fill("https://www.example-{w}.org/{w}/{big}")}

    def result(self, name: str, args: dict[str, Any], size: int, inserts: list[str]) -> str:
        n, r = self.noise, self.r
        if name == "web_search":
            lines = _lines_until(
                lambda: n.fill(
                    "- {W} {W} outlook {n}: {w} capacity rose {pct} to {k} units "
                    "(https://{w}.example.net/{hex}) - {day}"
                ),
                size,
            )
            return _place(r, lines, inserts)
        if name == "extract_table":
            lines = self.table(
                ("country", "2019", "2020", "2021", "2022", "2023", "unit"),
                lambda c: n["city"] if c == "country" else "GW" if c == "unit" else n["big"],
                size,
            )
            return _place(r, lines, inserts)
        return self.prose(
            (
                "In {n}0 the installed base reached {k} units, up {pct} on the year before.",
                "The survey of {big} households found that {pct} plan to adopt {w} within {n} "
                "years.",
                "Costs fell to {money} per unit, according to {company}.",
                "{person} notes that the {w} figures exclude off-grid systems.",
                "Table {n} reports {w} by region; {city} leads with {k}.",
                "The authors caution that the {w} series was revised in {n}0.",
                "See the appendix at {path} for the full method.",
            ),
            size,
            inserts,
        )


class _Data(_Domain):
    name = "data"
    SYSTEM = (
        "You are a data analyst working in the company warehouse (Postgres 15) and a Python "
        "notebook (pandas 2). Tools: run_sql(query) returns up to 200 rows; "
        "run_python(code) runs in a persistent kernel; describe_table(name) shows the schema. "
        "Show the query you ran, state row counts and filters, and say when a number is "
        "sampled. Never run DELETE or UPDATE. Timestamps in the warehouse are UTC."
    )
    REQUESTS = (
        "How many {w} did we have per week since {day}?",
        "Break down {w} by {w} and {w} for last quarter.",
        "Why did {w} drop {pct} on {day}?",
        "Make a chart of {w} vs {w}, weekly.",
        "Check the {w} table for duplicates.",
        "Compute the {w} rate for the {w} cohort.",
        "Join {w} to {w} and see what doesn't match.",
        "Can you sanity-check the dashboard number of {k}?",
    )
    DETAILS = (
        "Exclude test accounts, there are about {n} of them.",
        "{person} needs it for the {day} review.",
        "The dashboard says {k} but finance says {k}.",
        "Use the {w}_v{n} view, not the raw table.",
        "It should take less than {secs} to run.",
        "We changed the tracking on {day}, careful.",
    )
    REPORTS = (
        "The query returned {big} rows in {secs}; the weekly totals are in the table above.",
        "There are {n} duplicate keys, all from the {w} backfill.",
        "The drop is explained by {w}: {pct} of the decline comes from one region.",
        "I've saved the result as a dataframe called {w}_{w} for later.",
        "Numbers match the dashboard within {pct}.",
        "Next: {step}.",
    )
    PREAMBLES = ("Let me check the schema first.", "Running the query.", "I'll do it in pandas.")

    def specs(self) -> dict[str, list[_Spec]]:
        w = self.noise.words
        return {
            "number": _specs(
                "number",
                [
                    ("the churn rate last quarter", _percent(1, 24)),
                    ("the row count of the events table", _thousands(1_000_000, 900_000_000)),
                    ("the p95 session length", _decimal(4.1, 58.0, 2), " minutes"),
                    ("the conversion rate of the spring campaign", _percent(0.5, 19)),
                    ("the average order value", _money(19, 380, cents=True)),
                    ("the number of weekly active users", _thousands(11_000, 2_400_000)),
                    ("the sampling fraction", _decimal(0.005, 0.3, 3)),
                ],
            ),
            "path": _specs(
                "path",
                [
                    ("the notebook", _pattern("notebooks/{w}/{w}_{w}_{d2}.ipynb", w)),
                    ("the exported CSV", _pattern("s3://analytics-{w}/exports/{w}_{d6}.csv", w)),
                    ("the dbt model", _pattern("models/marts/{w}/fct_{w}_{w}.sql", w)),
                    ("the dashboard definition", _pattern("dashboards/{w}-{w}-{d3}.json", w)),
                    ("the saved parquet", _pattern("/mnt/data/{w}_{w}_{d4}.parquet", w)),
                ],
            ),
            "name": _specs(
                "name",
                [
                    ("the stakeholder for this analysis", _person),
                    ("the owner of the events pipeline", _person),
                    ("the enterprise customer with the odd spike", _company),
                    ("the service that writes the events", _named_service),
                    ("the analyst who built the old dashboard", _person),
                ],
            ),
            "identifier": _specs(
                "identifier",
                [
                    ("the experiment id", _pattern("exp_{b6}")),
                    ("the anomalous account", _pattern("acct_{b8}")),
                    ("the Looker tile", _pattern("tile-{d5}")),
                    ("the data request ticket", _pattern("DATA-{d4}")),
                    ("the query id of the slow run", _pattern("q-{h7}")),
                ],
            ),
            "date": _specs(
                "date",
                [
                    ("the tracking change", _date),
                    ("the quarterly business review", _date),
                    ("the campaign start", _date),
                    ("the backfill", _date),
                    ("the board deck deadline", _date),
                ],
            ),
            "error": _specs(
                "error",
                [
                    ("the error from the warehouse", _error),
                    ("what the notebook kernel raised", _error),
                    ("the error in the nightly dbt run", _error),
                    ("the export job's failure", _error),
                ],
            ),
            "constraint": _sayings(
                "constraint",
                [
                    (
                        "the query cost cap",
                        _money(40, 900),
                        ("Any single query must cost less than {v} in warehouse credits.",),
                    ),
                    (
                        "the minimum cohort size",
                        lambda r: f"{r.randint(11, 99)} users",
                        ("Never report a cohort smaller than {v}, for privacy.",),
                    ),
                    (
                        "the restricted table",
                        _pattern("raw_{w}_pii", w),
                        ("Do not query {v} directly, it's restricted.",),
                    ),
                    (
                        "the refresh limit",
                        lambda r: f"every {r.randint(16, 55)} minutes",
                        ("The dashboard may not refresh more often than {v}.",),
                    ),
                ],
            ),
            "decision": _decisions(
                [
                    (
                        "the attribution model",
                        ("last-touch attribution", "a linear model", "time-decay weighting"),
                        ("it's what finance reports", "it is stable week to week"),
                    ),
                    (
                        "the churn definition",
                        ("thirty idle days", "a cancelled plan", "no login in a quarter"),
                        ("it matches the contract terms", "product uses it already"),
                    ),
                    (
                        "the outlier rule",
                        ("winsorising at 1%", "a 3-sigma cut", "the IQR fence"),
                        ("the whale accounts skew the mean", "it is easy to explain"),
                    ),
                ]
            ),
            "preference": _COMMON_PREFERENCES
            + _sayings(
                "preference",
                [
                    (
                        "the chart palette",
                        _one_of("viridis", "cividis", "colour-blind safe Okabe-Ito"),
                        ("Use the {v} palette for charts.", "I prefer {v} colours in plots."),
                    ),
                    (
                        "the SQL style",
                        _one_of("lowercase keywords", "CTEs over subqueries", "leading commas"),
                        ("Write SQL with {v}; it's our house style.",),
                    ),
                ],
            ),
        }

    def call(self) -> tuple[str, dict[str, Any]]:
        n, r = self.noise, self.r
        name = r.choices(("run_sql", "run_python", "describe_table"), (5, 3, 1))[0]
        if name == "run_sql":
            return name, {
                "query": n.fill(
                    "select {w}, date_trunc('week', created_at) as wk, count(*) from {w} "
                    "where created_at > now() - interval '{n} days' group by 1, 2 order by 2"
                )
            }
        if name == "run_python":
            return name, {"code": n.fill("df = {w}.groupby('{w}')['{w}'].agg(['mean', 'count'])")}
        return name, {"name": n.fill("analytics.{w}_{w}")}

    def result(self, name: str, args: dict[str, Any], size: int, inserts: list[str]) -> str:
        n, r = self.noise, self.r
        if name == "describe_table":
            lines = _lines_until(
                lambda: n.fill(
                    r.choice(("{w}_{w}  bigint  not null", "{w}_at  timestamptz", "{w}  text"))
                ),
                size,
                [n.fill("Table analytics.{w}: {big} rows, {n} GB")],
            )
            return _place(r, lines, inserts)
        if name == "run_python" and r.random() < 0.5:
            head = ["            count        mean         std    min     25%     50%     max"]
            lines = _lines_until(
                lambda: n.fill(
                    "{w:<10} {big:>8} {big:>10}.{n} {big:>9}.{n} {n:>6} {n:>7} {big:>7}"
                ),
                size,
                head,
            )
            return _place(r, lines, inserts)
        columns = ("segment", "week", "users", "orders", "revenue", "rate")
        lines = self.table(
            columns,
            lambda c: {
                "segment": n["w"],
                "week": n["ts"][:10],
                "users": n["big"],
                "orders": n["big"],
                "revenue": n["money"],
                "rate": f"0.{r.randint(10, 999)}",
            }[c],
            size,
        )
        return _place(r, lines, inserts) + "\n" + n.fill("({big} rows, {secs})")


class _Planning(_Domain):
    name = "planning"
    SYSTEM = (
        "You are an operations assistant helping plan a three-day company offsite and the "
        "product launch that follows it. Tools: list_calendar(start, end), get_budget(project), "
        "create_task(title, owner, due), search_notes(query), check_availability(people, day). "
        "Keep track of owners and deadlines, confirm before booking anything, and restate the "
        "plan when it changes. Currency is the company's reporting currency unless told."
    )
    REQUESTS = (
        "What's still open for the {w}?",
        "Can you find a slot for the {w} review with {first} and {first}?",
        "Draft the agenda for day {n}.",
        "How much of the {w} budget is left?",
        "Create tasks for the {w} and the {w}.",
        "Move the {w} sync to {day} afternoon if possible.",
        "Check the notes from the last {w} meeting.",
        "Who's responsible for the {w}?",
    )
    DETAILS = (
        "{person} is out {day} and {day}.",
        "We expect about {big} people overall.",
        "The hotel quoted {money} per night last time.",
        "Keep the {w} sessions under {n} minutes.",
        "Legal wants to see the {w} contract first.",
        "The venue in {city} is still an option.",
    )
    REPORTS = (
        "I've created {n} tasks; {n} of them are due this week.",
        "The {w} budget has {money} left after the last invoice.",
        "Everyone is free on {day} between {time} and {time}.",
        "Updated plan: day 1 {w} and {w}, day 2 workshops, day 3 {w}.",
        "The notes mention {n} open questions about the {w}.",
        "I'll {step} next.",
    )
    PREAMBLES = ("Checking calendars.", "Let me look at the budget.", "Searching the notes.")

    def specs(self) -> dict[str, list[_Spec]]:
        w = self.noise.words
        return {
            "number": _specs(
                "number",
                [
                    ("the venue deposit", _money(1_500, 30_000)),
                    ("the expected attendance at the launch", _thousands(1_100, 9_500)),
                    ("the catering cost per head", _money(21, 140, cents=True)),
                    ("the travel budget", _money(8_000, 120_000)),
                    ("the sponsorship target", _money(10_000, 400_000)),
                    ("the hotel room block", lambda r: f"{r.randint(31, 290)} rooms"),
                    ("the ticket price", _money(49, 900, cents=True)),
                ],
            ),
            "path": _specs(
                "path",
                [
                    ("the run-of-show document", _pattern("drive/events/{w}/run_of_show_v{d1}", w)),
                    ("the budget spreadsheet", _pattern("finance/{w}/{w}_budget_{d4}.xlsx", w)),
                    ("the attendee list", _pattern("exports/attendees_{w}_{d6}.csv", w)),
                    ("the floor plan", _pattern("venues/{w}/floorplan_{b4}.pdf", w)),
                    ("the speaker brief", _pattern("drive/launch/{w}-{w}-brief.md", w)),
                ],
            ),
            "name": _specs(
                "name",
                [
                    ("the owner of the venue contract", _person),
                    ("the keynote speaker", _person),
                    ("the catering vendor", _company),
                    ("who signs off on the budget", _person),
                    ("the AV supplier", _company),
                    ("the launch project manager", _person),
                ],
            ),
            "identifier": _specs(
                "identifier",
                [
                    ("the venue booking reference", _pattern("BK-{d6}")),
                    ("the purchase order", _pattern("PO-{d4}-{d3}")),
                    ("the launch epic", _pattern("LAUNCH-{d3}")),
                    ("the hotel confirmation", _pattern("HC{b8}")),
                    ("the cost centre", _pattern("CC-{d4}-{w}", w)),
                ],
            ),
            "date": _specs(
                "date",
                [
                    ("the offsite's first day", _date),
                    ("the launch date", _date),
                    ("the deadline for the venue deposit", _date),
                    ("the dress rehearsal", _date),
                    ("the budget review", _date),
                    ("the press embargo", _date),
                ],
            ),
            "error": _specs(
                "error",
                [
                    ("the error from the booking system", _error),
                    ("what the calendar sync fails with", _error),
                    ("the expense tool's error", _error),
                ],
            ),
            "constraint": _sayings(
                "constraint",
                [
                    (
                        "the total budget cap",
                        _money(20_000, 250_000),
                        (
                            "The whole thing must not exceed {v}, finance was very clear.",
                            "Hard ceiling: {v} total, no exceptions.",
                        ),
                    ),
                    (
                        "the no-meeting days",
                        _weekdays,
                        ("Never schedule anything on {v}, that's our focus day.",),
                    ),
                    (
                        "the travel rule",
                        lambda r: f"{r.randint(3, 9)} hours of flying",
                        ("Nobody should have more than {v} to get there.",),
                    ),
                    (
                        "the latest finish time",
                        lambda r: f"{r.randint(17, 20)}:{r.choice(('10', '20', '40', '50'))}",
                        ("Sessions must end by {v} so people can get home.",),
                    ),
                ],
            ),
            "decision": _decisions(
                [
                    (
                        "the venue",
                        ("the lakeside lodge", "the converted mill", "the harbour warehouse"),
                        ("it fits the headcount with breakout rooms", "it's reachable by train"),
                    ),
                    (
                        "the launch format",
                        ("a livestreamed keynote", "a press-only briefing", "a hybrid event"),
                        ("the product needs a demo", "it keeps costs predictable"),
                    ),
                    (
                        "the travel booking",
                        ("a single travel agency", "self-booking with caps", "group charter"),
                        ("it avoids twenty separate invoices", "people want flexibility"),
                    ),
                ]
            ),
            "preference": _COMMON_PREFERENCES
            + _sayings(
                "preference",
                [
                    (
                        "the currency for estimates",
                        _one_of("Swiss francs", "Swedish kronor", "Danish kroner", "zloty"),
                        ("Give me estimates in {v}, that's how finance reports.",),
                    ),
                    (
                        "the task tracker",
                        _one_of("Linear", "Trello", "Asana", "Basecamp"),
                        ("I prefer tasks in {v}; I don't check anything else.",),
                    ),
                ],
            ),
        }

    def call(self) -> tuple[str, dict[str, Any]]:
        n, r = self.noise, self.r
        name = r.choice(
            ("list_calendar", "get_budget", "create_task", "search_notes", "check_availability")
        )
        makers: dict[str, Callable[[], dict[str, Any]]] = {
            "list_calendar": lambda: {"start": n["ts"][:10], "end": n["ts"][:10]},
            "get_budget": lambda: {"project": n["w"]},
            "create_task": lambda: {
                "title": n.fill("{W} {w}"),
                "owner": n["first"],
                "due": n["ts"][:10],
            },
            "search_notes": lambda: {"query": n.fill("{w} {w}")},
            "check_availability": lambda: {"people": [n["first"], n["first"]], "day": n["day"]},
        }
        return name, makers[name]()

    def result(self, name: str, args: dict[str, Any], size: int, inserts: list[str]) -> str:
        n, r = self.noise, self.r
        if name == "list_calendar":
            lines = _lines_until(
                lambda: n.fill("{day} {time}-{time}  {W} {w} (room {n}B)  with {first}, {first}"),
                size,
            )
            return _place(r, lines, inserts)
        if name == "get_budget":
            lines = self.table(
                ("line", "planned", "committed", "actual", "owner"),
                lambda c: n["first"] if c == "owner" else n["w"] if c == "line" else n["money"],
                size,
            )
            return _place(r, lines, inserts)
        if name == "create_task":
            head = [n.fill("Created task {W}-{big}: {W} {w} (owner {first}, due {day})")]
            lines = _lines_until(lambda: n.fill("  subtask: {step} ({first})"), size, head)
            return _place(r, lines, inserts)
        if name == "check_availability":
            lines = _lines_until(lambda: n.fill("{first}: busy {time}-{time}, free after {time}"),
                                 size)  # fmt: skip
            return _place(r, lines, inserts)
        return self.prose(
            (
                "Meeting notes {ts}: attendees {first}, {first}, {first}.",
                "We discussed the {w}; {first} will follow up with {company}.",
                "Open question: do we need {n} or {n} breakout rooms?",
                "The quote from {company} came in at {money} per person.",
                "Action: {first} to confirm the {w} by {day}.",
                "Travel from {city} takes about {n} hours by train.",
            ),
            size,
            inserts,
        )


class _Debugging(_Domain):
    name = "debugging"
    SYSTEM = (
        "You are an SRE assistant investigating a production incident. Tools: "
        "tail_logs(service, lines), read_config(path), run_command(cmd) on the bastion "
        "(read-only kubectl and curl), query_metrics(expr). Form hypotheses, test one at a "
        "time, and keep a timeline. Never restart or scale anything without an explicit go "
        "from the incident commander. Cluster: prod-{w}-{n}, {n} nodes, Kubernetes 1.{n}."
    )
    REQUESTS = (
        "Error rate on {service} jumped to {pct}, what's going on?",
        "Check the logs of {service} around {time}.",
        "Is the {w} config the same in staging and prod?",
        "Latency p99 is {ms}, normally it's {ms}. Why?",
        "Pods of {service} keep restarting, {n} restarts in the last hour.",
        "Can you look at the connection pool metrics for {service}?",
        "Did anything change in the {w} deployment today?",
        "Let's verify the TLS cert on {service}.",
    )
    DETAILS = (
        "The alert fired at {time}.",
        "{person} from the {w} team joined the bridge.",
        "Customers in {city} are affected most.",
        "We rolled out version {ver} this morning.",
        "The dashboard shows {k} requests per minute.",
        "Last incident like this was {n} weeks ago.",
        "There's a thread in #inc-{hex} with more context.",
    )
    REPORTS = (
        "The logs show {n} timeouts per minute to {service}, starting at {time}.",
        "Config differs in {n} keys between staging and prod; none look related yet.",
        "Hypothesis: the pool is exhausted because {service} holds connections for {ms}.",
        "Timeline so far: {time} deploy, {time} first errors, {time} alert.",
        "Metrics confirm it: saturation at {pct} on {n} of {n} nodes.",
        "Next I'll {step}.",
    )
    PREAMBLES = ("Pulling the logs.", "Checking config and metrics together.", "Running that now.")

    def specs(self) -> dict[str, list[_Spec]]:
        w = self.noise.words
        return {
            "number": _specs(
                "number",
                [
                    ("the max open files limit", _thousands(4_096, 65_000)),
                    ("the request timeout", _thousands(1_100, 45_000), " ms"),
                    ("the JVM heap size", _thousands(1_024, 24_000), " MiB"),
                    ("the error rate at the peak", _percent(2, 70)),
                    ("the queue depth at peak", _thousands(10_000, 900_000), " messages"),
                    ("the GC pause p99", _decimal(110, 990, 1), " ms"),
                    ("the pool size in prod", lambda r: f"{r.randint(17, 480)} connections"),
                ],
            ),
            "path": _specs(
                "path",
                [
                    ("the prod config", _pattern("/etc/{w}/{w}-{w}.yaml", w)),
                    ("the Helm values file", _pattern("deploy/helm/{w}/values-{w}-{d2}.yaml", w)),
                    ("the core dump", _pattern("/var/crash/{w}-{d6}.core", w)),
                    ("the runbook", _pattern("runbooks/{w}/{w}_{w}.md", w)),
                    ("the TLS bundle", _pattern("/etc/ssl/{w}/{w}-chain-{d4}.pem", w)),
                ],
            ),
            "name": _specs(
                "name",
                [
                    ("the incident commander", _person),
                    ("the upstream that times out", _named_service),
                    ("the customer escalating", _company),
                    ("the DBA on call", _person),
                    ("the team that owns the ingress", _person),
                    ("the service with the leaking pool", _named_service),
                ],
            ),
            "identifier": _specs(
                "identifier",
                [
                    ("the incident number", _pattern("INC-{d5}")),
                    ("the bad deploy's image digest", _pattern("sha256:{h12}")),
                    ("the failing pod", _pattern("{w}-{h5}-{b5}", w)),
                    ("the change request", _pattern("CHG-{d6}")),
                    ("the trace id of the slow request", _pattern("{h16}")),
                ],
            ),
            "date": _specs(
                "date",
                [
                    ("the postmortem", _date),
                    ("the certificate expiry", _date),
                    ("the maintenance window", _date),
                    ("the previous outage", _date),
                    ("the kernel upgrade", _date),
                ],
            ),
            "error": _specs(
                "error",
                [
                    ("the error the gateway logs", _error),
                    ("what the readiness probe fails with", _error),
                    ("the database driver's error", _error),
                    ("the error in the consumer", _error),
                    ("the TLS handshake failure", _error),
                ],
            ),
            "constraint": _sayings(
                "constraint",
                [
                    (
                        "the change freeze rule",
                        _weekdays,
                        ("Never touch prod on {v} without the CTO.",),
                    ),
                    (
                        "the restart limit",
                        lambda r: f"{r.randint(2, 5)} pods at a time",
                        ("Don't restart more than {v}, or the cache stampedes.",),
                    ),
                    (
                        "the latency SLO",
                        _thousands(1_050, 4_000),
                        ("p99 must stay under {v} ms, that's the SLO we sell.",),
                    ),
                    (
                        "the untouchable cluster",
                        _pattern("prod-{w}-{d2}", w),
                        ("Do not run anything on {v}, it's the payments cluster.",),
                    ),
                ],
            ),
            "decision": _decisions(
                [
                    (
                        "the mitigation",
                        (
                            "rolling back the image",
                            "shedding bulk traffic",
                            "failing over to the replica",
                        ),
                        ("it is the fastest safe option", "the fix needs a schema change"),
                    ),
                    (
                        "the pool fix",
                        ("a pgbouncer sidecar", "a lower idle timeout", "per-tenant pools"),
                        ("it caps connections without a code change", "it isolates noisy tenants"),
                    ),
                    (
                        "the alerting change",
                        ("burn-rate alerts", "a saturation alert", "synthetic probes"),
                        ("the threshold alert fired too late", "we missed the slow burn"),
                    ),
                ]
            ),
            "preference": _COMMON_PREFERENCES
            + _sayings(
                "preference",
                [
                    (
                        "the log format",
                        _one_of("logfmt", "JSON lines", "plain key=value"),
                        ("When you paste logs, reformat them as {v}.",),
                    ),
                    (
                        "the shell",
                        _one_of("fish shell", "zsh syntax", "POSIX sh"),
                        ("Give me commands for {v}; that's what I run.",),
                    ),
                ],
            ),
        }

    def call(self) -> tuple[str, dict[str, Any]]:
        n, r = self.noise, self.r
        name = r.choices(
            ("tail_logs", "read_config", "run_command", "query_metrics"), (4, 2, 3, 2)
        )[0]
        if name == "tail_logs":
            return name, {"service": n["service"], "lines": r.choice((200, 500, 1000))}
        if name == "read_config":
            return name, {"path": n.fill("/etc/{w}/{w}.yaml")}
        if name == "run_command":
            return name, {
                "cmd": n.fill(
                    r.choice(
                        (
                            "kubectl get pods -n {w} -o wide",
                            "kubectl describe pod {service}-{hex} -n {w}",
                            "curl -sv https://{service}.internal/healthz",
                            "kubectl top pods -n {w}",
                        )
                    )
                )
            }
        return name, {"expr": n.fill('rate(http_requests_total{{service="{service}"}}[5m])')}

    def result(self, name: str, args: dict[str, Any], size: int, inserts: list[str]) -> str:
        n, r = self.noise, self.r
        if name == "tail_logs":
            return self.log_lines(size, inserts, str(args.get("service")))
        if name == "read_config":
            lines = _lines_until(
                lambda: n.fill(
                    r.choice(
                        (
                            "{w}:",
                            "  {w}_{w}: {big}",
                            "  {w}_timeout: {ms}",
                            "  host: {service}.internal",
                            "  enabled: true",
                            "  path: {path}",
                        )
                    )
                ),
                size,
            )
            return _place(r, lines, inserts)
        if name == "query_metrics":
            lines = _lines_until(lambda: n.fill("{ts}  {big}.{n}"), size, ["time  value"])
            return _place(r, lines, inserts)
        lines = self.table(
            ("NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"),
            lambda c: {
                "NAME": f"{n['service']}-{n.hex(5)}",
                "READY": "1/1",
                "STATUS": r.choice(("Running", "Running", "CrashLoopBackOff", "Pending")),
                "RESTARTS": n["n"],
                "AGE": f"{r.randint(1, 59)}m",
                "IP": n["ip"],
                "NODE": f"node-{n.hex(4)}",
            }[c],
            size,
        )
        return _place(r, lines, inserts)


_DOMAIN_TYPES: dict[str, type[_Domain]] = {
    "coding": _Coding,
    "support": _Support,
    "research": _Research,
    "data": _Data,
    "planning": _Planning,
    "debugging": _Debugging,
}

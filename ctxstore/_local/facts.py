"""Facts read from prose, for :mod:`ctxstore._local.ledger`.

Each sentence of a user's or the agent's text yields :class:`Fact` candidates:
a :class:`~ctxstore._local.entries.LedgerEntry` keyed by its subject where one
is stated ("the batch size is 512" is keyed ``batch size``), else by its value
or its wording, with what the sentence says it corrects ("instead of X", "I
got the X wrong"). Values are typed by one regex pass (URLs, emails, paths,
dates, identifiers, names, numbers with units); statements by their cue words
(constraints, decisions, preferences). Regexes and heuristics only:
deterministic and fast.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import NamedTuple

from ctxstore._local.entries import LedgerEntry
from ctxstore._local.fact_words import (
    _AS,
    _CLAUSE,
    _CONSTRAINT,
    _CORRECTIVE,
    _DECISION,
    _FENCE,
    _FILLERS,
    _ID_WORDS,
    _IMPERATIVES,
    _LIMIT_WORDS,
    _LINKS,
    _MARKER,
    _NAME_STOP,
    _NOISE_LABELS,
    _NOT_SUBJECTS,
    _NOT_TICKETS,
    _PREFER_OVER,
    _PREFERENCE,
    _PREPOSITIONS,
    _QUALIFIER,
    _REASON,
    _REPORTED,
    _REQUEST,
    _ROLE_NAME,
    _SENTENCE,
    _TOPIC,
    _VALUE,
    _VALUE_KINDS,
    _WAS,
    _WAS_MORE,
    _WORD,
    _WRONG,
    BULLET,
    FUNCTION,
    STOP,
    TOKEN,
    FactKind,
)
from ctxstore._local.fact_words import (
    ENTITIES as ENTITIES,
)
from ctxstore._local.fact_words import (
    STATEMENTS as STATEMENTS,
)


class Fact(NamedTuple):
    """A candidate entry, with what it says about correcting another."""

    entry: LedgerEntry
    was: str | None  # the value the statement says it replaces ("instead of X")
    marked: bool  # the statement says it corrects something ("actually", "update:")


class _Value(NamedTuple):
    group: str
    start: int
    end: int


# -- facts from sentences -----------------------------------------------------------


def statements(text: str) -> Iterator[tuple[str, list[Fact]]]:
    """Each sentence of a user or assistant text, with the facts it states."""
    last: LedgerEntry | None = None
    # What a correction named before giving the new value: "I got the X wrong. It's Y.",
    # "X is no longer 3.25; use 3.52", "Forget X for the Y. We go with Z."
    carry = _Carry(None, None, False)
    held = False  # the carry has passed over a sentence already: it reaches one more, no further
    for sentence in _sentences(text):
        wrong = _WRONG.search(sentence)
        named = next((g for g in wrong.groups() if g), "") if wrong else ""
        if named.lower() in ("that", "it", "this", "those", "these", "them"):
            carry = _Carry(None, carry.was, True)  # "I had that wrong": no subject named
        elif wrong:
            carry = _Carry(named, carry.was, True)
        marked = bool(_CORRECTIVE.search(sentence)) or carry.subject is not None
        found: list[Fact] = []
        for clause in _CLAUSE.split(_MARKER.sub("", sentence)):
            clause = clause.strip(" ,.!:")
            # A decision's reason, or a statement's tail ("...; that's what I run"), is its own.
            if not content(clause):
                continue  # "please", "thanks"
            tail = len(content(clause)) <= 2 and not _values(clause)
            if last is not None and last.kind in STATEMENTS and (_REASON.match(clause) or tail):
                joined = ", " if _REASON.match(clause) else "; "
                last.value = clip(f"{last.value}{joined}{clause[:1].lower()}{clause[1:]}", 200)
            elif clause:
                marked = marked or bool(_CORRECTIVE.search(clause))
                facts, carry = _clause_facts(clause, marked, carry)
                found += facts
                last = facts[-1].entry if facts else last
        if found or held or not (carry.subject or carry.was):
            carry, held = _Carry(None, None, False), False
        else:
            held = True  # "I got the X wrong. It's Y.": the next sentence gives the value
        yield sentence, found


def prose_facts(text: str, subject: str | None = None) -> list[Fact]:
    """The facts of a short text outside a conversation turn (a note in a tool's output)."""
    carry = _Carry(subject, None, False)
    return [f for c in _CLAUSE.split(text) for f in _clause_facts(c.strip(" ,.!"), False, carry)[0]]


def is_statement(text: str) -> bool:
    """Whether a text states a constraint, a decision or a preference."""
    return _statement(text) is not None


def is_request(sentence: str) -> bool:
    """Whether a user's sentence asks for something."""
    clauses = _CLAUSE.split(_MARKER.sub("", sentence))
    return len(content(sentence)) >= 3 and any(_REQUEST.search(c.strip()) for c in clauses)


def first_sentence(text: str) -> str:
    """The first sentence that says something (not a greeting or an "OK.")."""
    sentences = list(_sentences(text))
    return next((s for s in sentences if len(content(s)) >= 3), sentences[0] if sentences else "")


def _sentences(text: str) -> Iterator[str]:
    for line in _FENCE.sub("\n", text).splitlines():
        if line.startswith(("    ", "\t", "$ ", ">>> ")):
            continue  # code and shell sessions quoted in prose are not statements
        for sentence in _SENTENCE.split(BULLET.sub("", line)):
            if sentence.strip():
                yield sentence.strip()


class _Carry(NamedTuple):
    subject: str | None  # the subject a correction named ("I got the X wrong")
    was: str | None  # the value it said it replaces ("X is no longer 3.25")
    forced: bool  # the sentence is about that subject: it overrides a local one


def _clause_facts(clause: str, marked: bool, carry: _Carry) -> tuple[list[Fact], _Carry]:
    """A clause's facts, and what it leaves for the next clause when it states none."""
    question = clause.endswith("?")  # asks, so states nothing for sure
    values = [] if question else _values(clause)
    attributes = [a for i in range(len(values)) if (a := _attribute(clause, values, i, carry))]
    was, words = _was(clause) or carry.was, content(clause)
    facts = _stated(clause, marked, attributes, was, words, question)
    if facts:
        return facts, carry._replace(was=None)
    named = [e.pre.removesuffix(": ") for e, _ in attributes if e.value == was and e.strong]
    return facts, _Carry(named[0] if named else carry.subject, was, carry.forced)


def _stated(
    clause: str,
    marked: bool,
    attributes: list[tuple[LedgerEntry, str | None]],
    was: str | None,
    words: list[str],
    question: bool,
) -> list[Fact]:
    kind = None if question else _statement(clause)
    if kind is not None:
        keyed = [a for a in attributes if a[0].strong]
        if len(keyed) == 1 and not _QUALIFIER.search(clause):
            entry, replaced = keyed[0]
            if len(words) - len(content(entry.pre + entry.value)) <= 2:
                # A bare "X is V" is its attribute; a limit stays a constraint ("budget: 5 EUR").
                entry.kind = kind if kind is FactKind.CONSTRAINT else entry.kind
                entry.words = words
                return [Fact(entry, was or replaced, marked)]
        key = keyed[0][0].key if len(keyed) == 1 else signature(words)
        entry = LedgerEntry(kind, key, clip(clause, 160), strong=len(keyed) == 1, words=words)
        match = _TOPIC.search(clause) if kind in (FactKind.DECISION, FactKind.PREFERENCE) else None
        topic = next((t for t in match.groups() if t), "") if match else ""
        if topic and topic.lower() not in _NOT_SUBJECTS:
            entry.key, entry.strong = key_of(topic), True  # "use X for the store"
        return [Fact(entry, was, marked)]
    # "ctx-client: 3.2.1" already says "ctx-client"; "from 30s to 60s" states 60s, not 30s;
    # "port 5433, not 5432" states no 5432.
    said = {entry.pre.removesuffix(": ").strip() for entry, _ in attributes}
    said |= {r for _, r in attributes if r} | ({was} if was else set())
    found = []
    for entry, replaced in attributes:
        if entry.value not in said:
            entry.words = words
            found.append(Fact(entry, replaced or was, marked))
    return found


def _statement(clause: str) -> FactKind | None:
    if _CONSTRAINT.search(clause):
        return FactKind.CONSTRAINT
    if _DECISION.search(clause):
        return FactKind.DECISION
    if _PREFERENCE.search(clause):
        return FactKind.PREFERENCE
    return None


def _was(clause: str) -> str | None:
    """The value a clause says it replaces: "instead of X", "not X but", "(it was X)"..."""
    patterns = [_WAS, *_WAS_MORE, *([_PREFER_OVER] if _PREFERENCE.search(clause) else [])]
    match = next((m for p in patterns if (m := p.search(clause))), None)
    if not match:
        return None
    old = " ".join(match["old"].split()[:5])
    return old if content(old) else None


def _values(clause: str) -> list[_Value]:
    """The typed values in a clause, left to right, none overlapping."""
    found = [
        _Value("name", m.start(g), m.end(g))
        for m in _ROLE_NAME.finditer(clause)
        for g in ("v", "w")
        if m[g]
    ]
    found += [_Value("error", m.start("v"), m.end("v")) for m in _REPORTED.finditer(clause)]
    for match in _VALUE.finditer(clause):
        group, (start, end) = str(match.lastgroup), match.span()
        if any(start < v.end and v.start < end for v in found):
            continue
        if group == "name":  # sentence-initial words are capitalized too
            words = match[0].split()
            while words and words[0] in _NAME_STOP:
                start += len(words.pop(0)) + 1
            if "-" not in match[0] and (len(words) < 2 or words[-1] in _NAME_STOP):
                continue
        elif group == "id" and match[0].split("-")[0] in _NOT_TICKETS:
            continue
        found.append(_Value(group, start, end))
    return sorted(found, key=lambda v: v.start)


def _attribute(
    clause: str, values: list[_Value], index: int, carry: _Carry
) -> tuple[LedgerEntry, str | None] | None:
    """The fact one value states, keyed by its subject; and the value it replaces, if said."""
    value = values[index]
    text = clause[value.start : value.end]
    # A name or a snake_case key before a value may be its subject: "owner: Dana", "x_y to 5".
    floors = [v.end for v in values[:index] if not _subjectlike(clause[v.start : v.end], v.group)]
    before = clause[floors[-1] if floors else 0 : value.start]
    was = None
    # "from 512 to 384", "not 512 but 384", "was 512, now 384": the subject is the first one's
    previous = values[index - 1] if index else None
    ahead = clause[values[index - 2].end if index > 1 else 0 : previous.start] if previous else ""
    paired = bool(
        previous
        and re.fullmatch(r"\s*(?:[a-z]+\s+)?(?:to|but|,?\s*now)\s*|\s*(?:->|→)\s*", before)
        and (re.search(r"\b(?:from|not|was)\s*$", ahead) or re.search(r"->|→", before))
    )
    if paired and previous:
        was = clause[previous.start : previous.end]
        before = re.sub(r"\b(?:from|not|was)\s*$", "", ahead)
    label, strong, links = _subject(re.split(r"[,;(\[]", before)[-1])
    strong = strong or (paired and bool(label))
    if carry.subject and (carry.forced or not strong):
        label, strong = carry.subject, True  # "I got the X wrong. It's Y."
    elif not strong and (named_as := _AS.match(clause, value.end)):
        label, strong = named_as["s"], True  # "use fdf57f1 as the commit that broke it"
    group, lower, post, kind = value.group, key_of(label), "", _VALUE_KINDS[value.group]
    if group == "date" and ("by" in links or lower.endswith(("deadline", "due"))):
        if not lower.endswith(("deadline", "due")):  # "ship it by Friday" states a deadline
            label = f"{label} deadline" if label else "deadline"
        kind, lower, strong = FactKind.CONSTRAINT, key_of(label), True
    elif group == "number":
        last = lower.split()[-1] if lower else ""
        if last in _ID_WORDS:
            kind, strong = FactKind.IDENTIFIER, False
        elif _LIMIT_WORDS & set(lower.split()) and set(links) & {"is", ":", "of", "="}:
            kind = FactKind.CONSTRAINT  # "the budget is 4,250 EUR", not "the budget has 5 EUR left"
        of = re.match(r" of [a-z]+\b(?! the\b)", clause[value.end :])  # "5 hours of flying"
        if of:
            post = of[0]
        elif not label or re.fullmatch(r"[$€£]?[\d.,]+", text):  # "100 steps", "3 replicas"
            post = " " + _subject_after(clause[value.end :])
            if not label and not post.strip():
                return None  # a number with no subject is noise
        bare = re.fullmatch(r"\d|(?:19|20)\d\d", text) and not post  # a digit, a year
        if not strong and (last in _NOISE_LABELS or bare):
            return None
    preposition = next((w for w in links if w in _PREPOSITIONS), "")
    if group == "error":
        return LedgerEntry(kind, text.lower(), text, "error: "), was  # "error from my side: x_y"
    if strong and label:
        return LedgerEntry(kind, lower, text, f"{label}: ", post.rstrip(), strong=True), was
    if label and preposition and kind is not FactKind.NUMBER:
        return LedgerEntry(kind, text.lower(), text, f"{label} {preposition} "), was
    if label:
        keyed = kind in (
            FactKind.NUMBER,
            FactKind.CONSTRAINT,
        )  # "port 8443": a port; "order X": itself
        key = lower if keyed else f"{lower} {text}".lower()
        return LedgerEntry(kind, key, text, f"{label} ", post.rstrip()), was
    return LedgerEntry(kind, (post.strip() or text).lower(), text, post=post.rstrip()), was


def _subjectlike(text: str, group: str) -> bool:
    return group == "name" or bool(re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+", text))


def _subject(before: str) -> tuple[str, bool, list[str]]:
    """The subject words just before a value, whether a link word tied them, and the links."""
    tokens = TOKEN.findall(before)
    links: list[str] = []
    while tokens and (tokens[-1].lower() in _LINKS or tokens[-1].lower() in _FILLERS):
        links.append(tokens.pop().lower())
    words: list[str] = []
    while tokens and len(words) < 6:
        token = tokens[-1]
        # "the ticket for this work", "the row count of the events table"
        inner = [t.lower() for t in tokens[-3:]]
        determined = len(inner) == 3 and inner[2] in ("the", "this", "our", "a", "an", "my", "your")
        if words and determined and inner[1] in ("of", "for") and inner[0] not in STOP:
            words[:0] = tokens[-3:]
            del tokens[-3:]
            continue
        if words and len(inner) >= 2 and inner[-1] in ("of", "for") and inner[-2] not in STOP:
            words[:0] = tokens[-2:]
            del tokens[-2:]
            continue
        if token.lower() in STOP or token in _LINKS or not re.search(r"[A-Za-z]", token):
            break
        words.insert(0, tokens.pop())
    if words and words[0][:1].isupper() and words[0].lower() in _IMPERATIVES:
        words.pop(0)  # "Fix order ORD-7": the order, not a "fix order"
    strong = bool(words) and bool(set(links) - _FILLERS - _PREPOSITIONS)
    return " ".join(words), strong, links


@lru_cache(maxsize=16384)
def key_of(label: str) -> str:
    """A subject as a key: "the Cache_TTL" and "cache TTL" are one."""
    return re.sub(r"^(?:the|a|an|our|my) ", "", label.lower().replace("_", " ")).strip()


def _subject_after(after: str) -> str:
    words: list[str] = []
    for token in TOKEN.findall(after)[:2]:
        if token.lower() in FUNCTION or not token.isalpha():
            break
        words.append(token)
    return " ".join(words)


# -- words --------------------------------------------------------------------------


def content(text: str) -> list[str]:
    """The content words of a text, lower case, in order, once each."""
    return list(dict.fromkeys(w for w in _WORD.findall(text.lower()) if w not in FUNCTION))


def signature(words: list[str]) -> str:
    """A key from wording, for a statement with no stated subject ("~" marks it)."""
    return "~" + " ".join(words[:8])


def similar(a: list[str], b: list[str]) -> float:
    """The Jaccard similarity of two word lists."""
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa or sb else 1.0


_VALUEISH = re.compile(r"\d|[/@]|\w[._]\w")


@lru_cache(maxsize=65536)  # asked of each entry's words for every note a fold reads
def valueish(word: str) -> bool:
    """Whether a word is a value: it holds a digit, a slash, an @ or an inner dot."""
    return _VALUEISH.search(word) is not None


def plain(words: list[str]) -> list[str]:
    """The words that are not values."""
    return [w for w in words if not valueish(w)]


def named(text: str) -> set[str]:
    """The values and names a text states: what tells two statements on one subject apart."""
    tokens = TOKEN.findall(text)
    return {
        w.lower()
        for i, w in enumerate(tokens)
        if valueish(w) or (i and w.lower() not in STOP and w[:1].isupper())
    }


@lru_cache(maxsize=65536)
def norm(text: str) -> str:
    """A text as compared: lower case, outer punctuation and extra spaces gone."""
    return " ".join(text.lower().strip(" .,;:!?\"'`").split())


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return (text[: limit - 1].rsplit(" ", 1)[0] or text[: limit - 1]) + "…"

"""Search a session's whole history: BM25 over an inverted index kept beside the stream.

The index is one hash in the session's slot (``SessionKeys.index``): a header
(the epoch and life of the history it covers, the key terms are hashed with,
the last entry indexed, the entries and terms counted) and one field per
term, holding the term's postings (``entry id,term count,entry length;``).
Appends never touch it: the worker brings it up to date after each summary,
and a search first adds whatever was appended since (a page at a time, each
page one short script, so no call holds Redis for long).

Cost: a search reads the postings of its terms (at most ``MAX_QUERY_TERMS``)
and the entries it returns, so it costs O(postings of the query's terms + the
results), never a pass over the history. Catching up costs O(entries appended
since the last index update); a replace, clear or pop (a new epoch), a
delete-and-recreate (a new life) or a new encryption key starts the index
over, once.

Terms are words in lower case, snake_case words also split, plurals folded,
common English words dropped. What is indexed: every string of a message in
the three formats (text, tool names and arguments, tool results), ids and
signatures aside. With encryption on, terms are stored as keyed hashes
(HMAC-SHA256 under a key derived per tenant), never in clear.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ctxstore._layout.chain import Chain, Row
from ctxstore._layout.codec import Meta, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.keys import SessionKeys
from ctxstore._layout.validate import check_int
from ctxstore._parts.reads import Reader
from ctxstore._parts.scope import Scope
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.errors import (
    CorruptEntryError,
    EpochChangedError,
    InvalidInputError,
    StoreFullError,
)
from ctxstore.models import SearchHit

__all__ = [
    "MAX_QUERY_CHARS",
    "MAX_QUERY_TERMS",
    "Searcher",
    "message_text",
    "terms",
]

MAX_QUERY_CHARS = 2_000
"""The longest query accepted."""
MAX_QUERY_TERMS = 32
"""A query's distinct terms past this many are ignored (each is one posting list read)."""
MAX_TERM_CHARS = 48
"""Longer words (hashes, base64, minified code) are not indexed."""
BATCH = 200
"""Entries added to the index per script call: each call stays short."""
SNIPPET_CHARS = 200
_K1, _B, _DELTA = 1.2, 0.4, 1.0
"""BM25+ (Lv and Zhai, 2011): a match in a long tool result still counts; lengths matter less."""

_WORD = re.compile(r"\d+(?:[.,:]\d+)+|[^\W_]+(?:_[^\W_]+)*")
"""A number with its dots and commas (``25.2``, ``3,343``, ``10.0.0.7``, ``19:30``), or a word."""
_SPACE = re.compile(r"\s+")
_MAX_DEPTH = 64
"""Nesting past which a message's values are not searched (tool arguments are untrusted JSON)."""
_NUMBER = re.compile(r"[0-9]+")
_STOP = frozenset(
    (
        "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
        "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but",
        "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for",
        "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself",
        "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself",
        "just", "let", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of",
        "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over",
        "own", "same", "she", "should", "so", "some", "such", "than", "that", "the", "their",
        "theirs", "them", "themselves", "then", "there", "these", "they", "this", "those",
        "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what",
        "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you",
        "your", "yours", "yourself", "yourselves",
    )
)  # fmt: skip
"""Words too common to index (their postings would be most of the history)."""
_SKIPPED_FIELDS = frozenset(
    {
        "id",
        "type",
        "role",
        "call_id",
        "tool_call_id",
        "tool_use_id",
        "signature",
        "encrypted_content",
        "status",
        "cache_control",
        "data",
        "image_url",
        "media_type",
        "index",
    }
)
"""Fields whose values are protocol, ids or binary, not what a conversation said."""


def _fold(word: str) -> str:
    """A word's plural folded to its singular (``queries`` -> ``query``, ``ports`` -> ``port``)."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def terms(value: str) -> list[str]:
    """The terms of a text, in order (repeats kept): what is indexed and what a query asks."""
    found: list[str] = []
    for match in _WORD.finditer(value.lower()):
        word = match.group()
        if len(word) > MAX_TERM_CHARS:
            continue
        if "_" in word:
            found.append(word)
            found.extend(_fold(p) for p in word.split("_") if p not in _STOP)
        elif word not in _STOP:
            found.append(_fold(word))
    return found


def message_text(message: dict[str, Any]) -> str:
    """Every string a message holds, in any of the formats, one per line.

    Text, tool names, tool arguments (parsed when they are JSON, keys
    included) and tool results; ids, types, signatures and binary data left out.
    """
    parts: list[str] = []

    def walk(value: Any, field: str | None, depth: int) -> None:
        if depth > _MAX_DEPTH:
            return  # deeper than any real message: its text is not searched
        if isinstance(value, str):
            if field == "arguments" and value[:1] in "{[":
                try:
                    walk(json.loads(value), None, depth + 1)
                    return
                except (ValueError, RecursionError):
                    pass  # not JSON (or nested past what the parser takes): kept as text
            if value:
                parts.append(value)
        elif isinstance(value, dict):
            if field == "arguments":
                field = None  # Amplifier's arguments, a dict: keys included, as parsed JSON's
            for key, item in value.items():
                if key in _SKIPPED_FIELDS:
                    continue
                if field is None and key not in _MESSAGE_FIELDS:
                    parts.append(str(key))  # an argument's name: "path", "port"
                walk(item, key, depth + 1)
        elif isinstance(value, list):
            for item in value:
                walk(item, field, depth + 1)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            parts.append(str(value))

    for key, item in message.items():
        if key not in _SKIPPED_FIELDS:
            walk(item, key, 0)
    return "\n".join(parts)


_MESSAGE_FIELDS = frozenset(
    {
        "content",
        "text",
        "name",
        "input",
        "output",
        "arguments",
        "function",
        "tool_calls",
        "summary",
        "refusal",
        "reasoning_content",
        "thinking",
        "action",
        "command",
        "query",
        "results",
    }
)
"""Keys of the formats themselves, not worth indexing as words (a tool argument's are)."""


@dataclass(frozen=True, slots=True)
class _Header:
    epoch: str
    life: str
    key: str
    cursor: str
    docs: int
    length: int

    @classmethod
    def parse(cls, raw: Any) -> _Header | None:
        if raw is None:
            return None
        try:
            epoch, life, key, cursor, docs, length = text(raw).split(" ")
        except (ValueError, UnicodeDecodeError):
            return None  # not one of ours: the next commit starts the index over
        if not (_NUMBER.fullmatch(docs) and _NUMBER.fullmatch(length)):
            return None  # read as search_index.lua reads it (%d+), or started over
        return cls(epoch, "" if life == "-" else life, key, cursor, int(docs), int(length))


class Searcher:
    """One tenant's history search.

    Args:
        scope: The tenant's scope.
    """

    def __init__(self, scope: Scope, reader: Reader) -> None:
        self._scope = scope
        self._reader = reader
        keyring = scope.codec.keyring
        self._hash = None if keyring is None else keyring.index_key(scope.tenant)

    def _field(self, term: str) -> str:
        """The hash field of a term: the term, or its keyed hash with encryption on."""
        if self._hash is None:
            return "w:" + term
        digest = hmac.new(self._hash[1], term.encode(), hashlib.sha256).digest()[:12]
        return "h:" + base64.b64encode(digest).decode()

    @property
    def _key_id(self) -> str:
        """The index key's name in the header: ``-`` in clear, else a digest of its id.

        A digest, not the id: a key id may hold a space (the header's separator)
        or be ``-`` itself, and either would let a stale index pass for current.
        """
        if self._hash is None:
            return "-"
        return "k" + hashlib.blake2b(self._hash[0].encode(), digest_size=8).hexdigest()

    async def search(self, session: str, query: object, limit: object) -> list[SearchHit]:
        """The entries that best match ``query``, best first (see ``ContextStore.search``)."""
        keys = self._scope.keys(session)
        check_int(limit, "limit", low=1, high=100, session=session)
        assert isinstance(limit, int)
        if not isinstance(query, str):
            raise InvalidInputError("a search query must be a string", session=session)
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidInputError(
                f"a search query is at most {MAX_QUERY_CHARS} characters, not {len(query)}",
                session=session,
            )
        wanted = list(dict.fromkeys(terms(query)))[:MAX_QUERY_TERMS]
        if not wanted:
            return []
        fields = [self._field(t) for t in wanted]
        for _ in range(3):
            settled = await self._settle(session, keys, fields)
            if settled is None:
                return []  # no such session
            state, header, postings, _ = settled
            ranked = _rank(header, postings, limit)
            if not ranked:
                return []
            hits = await self._hits(session, keys, state, ranked, query)
            if hits is not None:
                return hits
        raise EpochChangedError(-1, -1, tenant=self._scope.tenant, session=session)

    async def index(self, session: str) -> int:
        """Bring the session's index up to date; the entries added (see ``ContextStore.index``)."""
        settled = await self._settle(session, self._scope.keys(session), [])
        return 0 if settled is None else settled[3]

    async def _settle(
        self, session: str, keys: SessionKeys, fields: list[str]
    ) -> tuple[tuple[Any, Any], _Header, list[Any], int] | None:
        """The postings of ``fields`` from an index brought up to date first.

        Returns the history's (epoch, life), the index header, the postings
        and the entries added; ``None`` when the session does not exist.
        Under a stream of appends, it settles for an index a few entries
        behind rather than chase them.

        Raises:
            EpochChangedError: The history kept changing (replaces, pops) while it read.
        """
        added = 0
        behind: tuple[tuple[Any, Any], _Header, list[Any], int] | None = None
        for _ in range(4):
            meta, index = await self._scope.connection.transaction(
                [
                    ("HMGET", keys.meta, Meta.EPOCH, Meta.LIFE, Meta.SEQ, Meta.LAST_ID),
                    ("HMGET", keys.index, "@", *fields),
                ],
                session=session,
                key=keys.meta,
            )
            epoch, life, seq, last = meta
            if seq is None:
                return None
            header = _Header.parse(index[0])
            if header is not None and self._current(header, epoch, life):
                if header.cursor == text(last or b""):
                    return (epoch, life), header, index[1:], added
                behind = (epoch, life), header, index[1:], added
            else:
                behind = None
            try:
                more = await self._catch_up(session, keys, epoch, life, header)
            except StoreFullError:  # a full Redis takes no more of the index
                if behind is not None:
                    return behind  # answer from it as it stands
                return await self._unindexed(session, keys, fields)
            if behind is not None and more == 0:
                # Nothing after the cursor (the counter's last id is ahead of
                # the stream, say): the index is as current as the stream.
                return behind
            added += more
        if behind is not None:
            return behind  # appends keep coming: answer from an index a batch behind
        raise EpochChangedError(-1, -1, tenant=self._scope.tenant, session=session)

    async def _unindexed(
        self, session: str, keys: SessionKeys, fields: list[str]
    ) -> tuple[tuple[Any, Any], _Header, list[Any], int] | None:
        """What :meth:`_settle` gives, from the whole history indexed here, kept nowhere.

        For a Redis too full to take an index the session has none of (or none
        of its current history): every entry is read, a batch at a time.
        """
        state: tuple[Any, Any] | None = None
        rows: list[Row] = []
        cursor: str | None = None
        while True:
            read, batch = await self._reader.rows(session, keys, cursor, BATCH)
            if state is not None and read != state:
                raise EpochChangedError(-1, -1, tenant=self._scope.tenant, session=session)
            state = read
            rows += batch
            if len(batch) < BATCH:
                break
            cursor = text(batch[-1][1][0])
        if not rows:
            return None
        postings, docs, length = self._batch(rows)
        epoch, life = state
        header = _Header(
            text(epoch or b"0"), text(life or b""), self._key_id, cursor or "", docs, length
        )
        return state, header, [postings.get(field) for field in fields], 0

    def _current(self, header: _Header | None, epoch: Any, life: Any) -> bool:
        return (
            header is not None
            and header.epoch == text(epoch or b"0")
            and header.life == text(life or b"")
            and header.key == self._key_id
        )

    async def _catch_up(
        self, session: str, keys: SessionKeys, epoch: Any, life: Any, header: _Header | None
    ) -> int:
        """Add the entries after the index's cursor, a batch per script; the entries added.

        Returns early (having added what it could) when another caller moved
        the index first or the history changed: the caller reads again.
        """
        fresh = not self._current(header, epoch, life)
        cursor = "" if fresh or header is None else header.cursor
        epoch_s, life_s = text(epoch or b"0"), text(life or b"")
        added = 0
        while True:
            check, rows = await self._reader.rows(session, keys, cursor or None, BATCH)
            if text(check[0] or b"0") != epoch_s or text(check[1] or b"") != life_s:
                return added
            if not rows and not fresh:
                return added
            postings, docs, length = self._batch(rows)
            last = text(rows[-1][1][0]) if rows else cursor
            args: list[Any] = [epoch_s, life_s, self._key_id, cursor, last, docs, length]
            for field, value in postings.items():
                args += (field, value)
            reply = await self._scope.connection.script(
                SCRIPTS.search_index, (keys.index, keys.meta), tuple(args), session=session
            )
            if text(reply[0]) != "ok":
                return added
            added += len(rows)
            cursor, fresh = last, False
            if len(rows) < BATCH:
                return added

    def _batch(self, rows: list[Row]) -> tuple[dict[str, str], int, int]:
        """The postings a batch of stream rows adds, by field; its entries and terms."""
        postings: dict[str, list[str]] = {}
        length = 0
        for owner, row in rows:
            try:
                stored = self._scope.codec.stored(owner, row)
            except CorruptEntryError:
                continue  # indexed as nothing; reads of it report the fault
            counts = Counter(terms(message_text(stored.message)))
            size = sum(counts.values())
            length += size
            for term, count in counts.items():
                postings.setdefault(self._field(term), []).append(
                    f"{stored.entry_id},{count},{size};"
                )
        return {f: "".join(p) for f, p in postings.items()}, len(rows), length

    async def _hits(
        self,
        session: str,
        keys: SessionKeys,
        state: tuple[Any, Any],
        ranked: list[tuple[float, str]],
        query: str,
    ) -> list[SearchHit] | None:
        """The ranked entries read back, or ``None`` when the history changed meanwhile."""
        replies = await self._scope.connection.transaction(
            [
                ("HMGET", keys.meta, Meta.EPOCH, Meta.LIFE, Meta.CHAIN),
                *(("XRANGE", keys.log, entry, entry, "COUNT", 1) for _, entry in ranked),
            ],
            session=session,
            key=keys.meta,
        )
        if tuple(replies[0][:2]) != state:
            return None
        chain = Chain.parse(replies[0][2])
        words = [w.lower() for w in _WORD.findall(query) if w.lower() not in _STOP]
        hits = []
        for (score, entry), rows in zip(ranked, replies[1:], strict=True):
            # An entry the chain holds is read from its segment (which never changes).
            found = (session, rows[0]) if rows else await self._reader.lineage.entry(chain, entry)
            if found is None:
                continue  # popped or trimmed since it was indexed
            try:
                stored = self._scope.codec.stored(*found)
            except CorruptEntryError:
                continue
            message = stored.message
            role = message.get("role") or message.get("type") or "?"
            snippet = _snippet(message_text(message), words)
            hits.append(SearchHit(stored.entry_id, str(role), snippet, round(score, 4)))
        return hits


def _rank(header: _Header, postings: Iterable[Any], limit: int) -> list[tuple[float, str]]:
    """The ``limit`` best (score, entry id) by BM25 over the terms' postings."""
    docs = max(header.docs, 1)
    average = max(header.length / docs, 1.0)
    scores: dict[str, float] = {}
    for raw in postings:
        if not raw:
            continue
        try:
            items = [_posting(item) for item in text(raw).split(";")[:-1]]
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptEntryError(f"the search index holds a malformed posting: {exc}") from None
        idf = math.log(1 + (docs - len(items) + 0.5) / (len(items) + 0.5))
        for entry, tf, size in items:
            norm = tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * size / average)) + _DELTA
            scores[entry] = scores.get(entry, 0.0) + idf * norm
    # Ties go to the newer entry: the later statement of a fact is the one in force.
    best = heapq.nlargest(limit, scores.items(), key=lambda kv: (kv[1], entry_order(kv[0])))
    return [(score, entry) for entry, score in best]


def _posting(item: str) -> tuple[str, int, int]:
    """One posting, ``entry id,tf,length``, as search_index.lua writes it.

    Raises:
        ValueError: It is not (a wrong entry id is refused by Redis when read).
    """
    entry, count, size = item.split(",")
    return entry, int(count), int(size)


def _snippet(body: str, words: list[str]) -> str:
    """About ``SNIPPET_CHARS`` of ``body`` around the first of ``words`` it holds."""
    flat = _SPACE.sub(" ", body).strip()
    # Lowered letter by letter, keeping each letter's place ('İ'.lower() is two letters).
    lower = "".join(c if len(low := c.lower()) != 1 else low for c in flat)
    found = [i for i in (lower.find(w) for w in words) if i >= 0]
    at = min(found) if found else 0
    start = max(0, at - SNIPPET_CHARS // 3)
    if start:
        space = flat.find(" ", start, at)
        start = space + 1 if space >= 0 else start
    end = min(len(flat), start + SNIPPET_CHARS)
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")

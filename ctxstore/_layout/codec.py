"""How a session is laid out in Redis: field names, entry kinds, decoding and sealing.

A message is one stream entry::

    m   the message (JSON, sealed when encryption is on)
    t   its tokens (cl100k)
    c   the tool call ids it makes, joined by US (0x1f)     (only if any)
    r   the tool call ids it answers, joined by US          (only if any)
    v   a preview of a large tool result (JSON, sealed)      (only if any)
    vt  the preview's tokens                                 (only with v)

System, developer and pinned messages also have a copy in the session's
``keep`` hash (entry id -> kind, tokens, call ids, result ids, data, joined
by RS, 0x1e), which every view reads. The cached summary is the ``view``
hash. The Lua scripts use the same names: they are spelled once here on the
Python side, next to the scripts that read them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic_core import from_json

from ctxstore._layout.formats import call_ids, result_ids
from ctxstore.encryption import MAGIC, Keyring
from ctxstore.errors import CorruptEntryError, DecryptionError
from ctxstore.models import StoredMessage, Summary

__all__ = [
    "ENTRY_PLACEHOLDER",
    "SEP",
    "SUMMARY_COPY",
    "SUMMARY_FIELDS",
    "SUMMARY_SEALED",
    "Anchor",
    "Codec",
    "Entry",
    "Kind",
    "Meta",
    "Reply",
    "SummaryLevel",
    "SummaryText",
    "current_covers",
    "ids",
    "join_ids",
    "pairs",
    "raw_pairs",
    "summary_body",
    "summary_message",
    "text",
]

ENTRY_PLACEHOLDER = "@@ctxstore-entry@@"
"""Stands for the entry id in a stored preview; filled in when it is decoded."""

SEP = "\x1f"
"""Joins tool call ids in a stream field (ids may not hold control characters)."""
_RS = b"\x1e"


class Kind(StrEnum):
    """Why a message is in the keep hash (every view sends it)."""

    SYSTEM = "s"
    """A system or developer message."""
    PINNED = "p"
    """A message pinned by the caller."""
    PLAIN = ""
    """Not kept: sent only if the budget allows."""


class Meta:
    """Field names of the session's ``meta`` hash that Python reads."""

    EPOCH = "epoch"
    LIFE = "rsv"
    """The reservation that created this life of the session: no two lives share one."""
    SEQ = "seq"
    COUNT = "count"
    TOKENS = "tokens"
    BYTES = "bytes"
    """What counts against ``session_bytes``: messages, previews, pinned and checkpoint copies."""
    TTL = "ttl"
    FIRST_ID = "first_id"
    LAST_ID = "last_id"
    WATERMARK = "wm"
    WATERMARK_TOKENS = "wm_tokens"
    SUMMARY_DUE = "sq"
    SUMMARY_DUE_AT = "sq_at"
    SUMMARY_GENERATION = "sgen"
    SUMMARY_OUTCOME = "sum_outcome"
    SUMMARY_AT = "sum_at"
    SUMMARY_MS = "sum_ms"
    SUMMARY_ERROR = "sum_err"
    SUMMARY_RUNS = "sum_runs"
    SUMMARY_FAILURES = "sum_failures"
    SUMMARY_FAILED_AT = "sum_fail_at"
    IDLE = "idle"
    """Set by a summary job that found nothing to cover; cleared when that may change."""
    KEEP_VERSION = "kv"
    """The version of the protected copies (bumped when one is added or dropped)."""
    CHAIN = "chain"
    """The frozen segments the history starts with (:class:`ctxstore._layout.chain.Chain`)."""
    BASE = "base"
    """The chain's last entry: the live log holds only entries after it."""
    ORIGIN = "origin"
    """A fork's source and the entry it was forked at (``session entry``)."""


SUMMARY_FIELDS = ("l1", "n1", "l2", "n2", "covers", "epoch")
"""The fields of the cached summary a view reads (see ``summary_commit.lua``)."""
SUMMARY_COPY = (*SUMMARY_FIELDS, "model", "state")
"""The fields a checkpoint or a fork copies (``SUMMARY_COPY`` in the scripts)."""
SUMMARY_SEALED = frozenset({"l1", "l2", "state"})
"""Those that hold text, sealed for their session."""


class Reply(StrEnum):
    """The first word of a write script's reply."""

    OK = "ok"
    CONFLICT = "conflict"
    QUOTA = "quota"
    LEASE_LOST = "lease_lost"
    STALE = "stale"
    RESERVE = "reserve"
    """The write would create the session and holds no live reservation of the index."""
    ABSENT = "absent"
    """There is no such session."""
    MISSING = "missing"
    """The entry asked for is not in the session's history."""
    RELAYOUT = "relayout"
    """The session's chain changed since it was read (a fork froze its log): read again."""
    EXISTS = "exists"
    """The session a fork or an import would create exists already."""
    BASE = "base"
    """The live log is empty and the history goes on in the chain: call again with its end."""
    KEYS = "keys"
    """An append's lean form was refused, nothing written: it needs the full form's keys."""
    EXPIRED = "expired"
    """A fork came too late to be written: the segments it reads are no longer kept for it."""


@dataclass(slots=True)
class Entry:
    """A stored message as the view sees it; decoded only when it is sent.

    Attributes:
        entry_id: Its stream entry id.
        tokens: Its tokens.
        data: The message, as stored (JSON).
        calls: The tool call ids it makes.
        results: The tool call ids it answers.
        kind: ``"s"`` for system/developer, ``"p"`` for pinned, ``""`` otherwise.
        preview_data: A smaller stand-in for a large tool result (JSON), or ``None``.
        preview_tokens: The stand-in's tokens.
    """

    entry_id: str
    tokens: int
    data: bytes
    calls: tuple[str, ...] = ()
    results: tuple[str, ...] = ()
    kind: str = ""
    preview_data: bytes | None = None
    preview_tokens: int = 0
    _message: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        entry_id: str,
        message: dict[str, Any],
        tokens: int,
        *,
        preview: dict[str, Any] | None = None,
        preview_tokens: int = 0,
        kind: str = "",
    ) -> Entry:
        """An entry built from a message dict (tests, and callers without stored bytes)."""
        return cls(
            entry_id,
            tokens,
            json.dumps(message).encode(),
            tuple(call_ids(message)),
            tuple(result_ids(message)),
            kind,
            None if preview is None else json.dumps(preview).encode(),
            preview_tokens,
            message,
        )

    @property
    def message(self) -> dict[str, Any]:
        """The decoded message (decoded once)."""
        if self._message is None:
            self._message = _decode(self.data)
        return self._message

    @property
    def preview(self) -> dict[str, Any] | None:
        """The decoded stand-in, naming this entry's id, or ``None``."""
        if self.preview_data is None:
            return None
        return _decode(
            self.preview_data.replace(ENTRY_PLACEHOLDER.encode(), self.entry_id.encode())
        )

    @property
    def cheapest(self) -> int:
        """The fewest tokens this entry can be sent in."""
        return self.preview_tokens if self.preview_data is not None else self.tokens


@dataclass(frozen=True, slots=True)
class SummaryText:
    """A cached summary, already wrapped as a message.

    Attributes:
        message: The message to send in place of the summarized turns.
        tokens: Its tokens.
        covers_upto: The last entry id it covers.
    """

    message: dict[str, Any]
    tokens: int
    covers_upto: str


@dataclass(frozen=True, slots=True)
class SummaryLevel:
    """One level of the cached summary that a view may send.

    Attributes:
        summary: The summary message at this level, and its tokens.
        level: 1 for the facts ledger, 2 for the ledger and the narrative.
    """

    summary: SummaryText
    level: int


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where a session's view starts, for one budget; kept in Redis, shared by every pod.

    A view sends the protected entries, this anchor's summary (frozen: a newer
    one is swapped in only when the anchor moves), then every entry from
    ``start`` on. Appends only extend it; when it would overflow, it moves
    once, in one step (:func:`plan_anchored`).

    Attributes:
        epoch: The history it belongs to (a replace drops it).
        start: The first raw entry sent (``""``: the first of the history).
        summary: The summary sent, or ``None``.
        level: The summary's level (0 without one).
        stamp: Names this anchor (a compare-and-set moves it).
    """

    epoch: int
    start: str
    summary: SummaryText | None
    level: int
    stamp: str


def _decode(data: bytes) -> dict[str, Any]:
    value = from_json(data)
    if not isinstance(value, dict):
        raise ValueError("a stored message is not a JSON object")
    return value


class Codec:
    """Decodes (and seals) one tenant's stored values.

    Args:
        tenant: The tenant, named in errors and bound into sealed values.
        keyring: Seals message content at rest; ``None`` stores it in clear.
    """

    def __init__(self, tenant: str, keyring: Keyring | None) -> None:
        self.tenant = tenant
        self.keyring = keyring

    def seal(self, session: str, value: bytes) -> bytes:
        """``value`` as it is stored: sealed for the session when a keyring is set."""
        return value if self.keyring is None else self.keyring.seal(self.tenant, session, value)

    def open(self, session: str, value: bytes) -> bytes:
        """A stored value in clear.

        Raises:
            DecryptionError: It is sealed and cannot be opened here.
        """
        if self.keyring is None:
            if value.startswith(MAGIC):
                raise DecryptionError(
                    "the value is encrypted and this store has no keyring",
                    tenant=self.tenant,
                    session=session,
                )
            return value
        return self.keyring.open(self.tenant, session, value)

    def reseal(self, owner: str, session: str, value: bytes) -> bytes:
        """A value stored for ``owner`` as it is stored for ``session`` (same tenant).

        A sealed value is bound to its session: one copied into another
        session (a fork's, a rewind's bridge) is opened and sealed again.
        """
        if not value or owner == session or self.keyring is None:
            return value
        return self.seal(session, self.open(owner, value))

    def entry(self, session: str, row: list[Any]) -> Entry:
        """An entry from a raw stream row ``[id, [b"m", data, b"t", tokens, ...]]``.

        Raises:
            CorruptEntryError: The row does not have the layout above.
        """
        entry_id = text(row[0])
        flat = row[1]
        try:
            if flat[0] != b"m" or flat[2] != b"t":
                raise KeyError("m and t come first")
            entry = Entry(entry_id, int(flat[3]), self.open(session, flat[1]))
            for i in range(4, len(flat), 2):
                name, value = flat[i], flat[i + 1]
                if name == b"c":
                    entry.calls = ids(value)
                elif name == b"r":
                    entry.results = ids(value)
                elif name == b"v":
                    entry.preview_data = self.open(session, value)
                elif name == b"vt":
                    entry.preview_tokens = int(value)
            return entry
        except (KeyError, ValueError, IndexError) as exc:
            raise CorruptEntryError(
                f"entry {entry_id} cannot be decoded: {exc}", tenant=self.tenant, session=session
            ) from exc

    def appended(
        self,
        session: str,
        entry_id: str,
        data: bytes,
        tokens: int,
        calls: str,
        results: str,
        preview: bytes,
        preview_tokens: int,
    ) -> Entry:
        """An entry as :meth:`entry` decodes it, from what an append sent for it.

        The values as the append script takes them: sealed, ids joined, ``b""`` for
        no preview (the script then writes no ``v`` or ``vt``).
        """
        return Entry(
            entry_id,
            tokens,
            self.open(session, data),
            ids(calls.encode()),
            ids(results.encode()),
            preview_data=self.open(session, preview) if preview else None,
            preview_tokens=preview_tokens if preview else 0,
        )

    def kept(self, session: str, entry_id: str, value: bytes) -> Entry:
        """An entry from its copy in the keep hash.

        Raises:
            CorruptEntryError: The copy is not kind, tokens, calls, results, data.
        """
        try:
            kind, tokens, calls, results, data = value.split(_RS, 4)
            return Entry(
                entry_id,
                int(tokens),
                self.open(session, data),
                ids(calls),
                ids(results),
                kind.decode(),
            )
        except ValueError as exc:
            raise CorruptEntryError(
                f"the copy of entry {entry_id} cannot be decoded: {exc}",
                tenant=self.tenant,
                session=session,
            ) from exc

    def stored(self, session: str, row: list[Any]) -> StoredMessage:
        """A history row as the caller gets it back.

        Raises:
            CorruptEntryError: The row or its message cannot be decoded.
        """
        entry = self.entry(session, row)
        try:
            message = entry.message
        except ValueError as exc:
            raise CorruptEntryError(
                f"entry {entry.entry_id} is not a JSON object: {exc}",
                tenant=self.tenant,
                session=session,
            ) from exc
        return StoredMessage(entry.entry_id, message, entry.tokens)

    def summary_levels(
        self,
        session: str,
        fields: list[Any],
        epoch: bytes,
        watermark: bytes | None,
        role: str = "user",
    ) -> list[SummaryLevel]:
        """The cached summary's levels (``SUMMARY_FIELDS``), if it is the current one.

        Level 1 is the ledger; level 2, when there is a narrative, the ledger
        and the narrative. Each is wrapped as the view sends it.
        """
        l1, n1, l2, n2, covers, summary_epoch = fields
        current = current_covers(covers, summary_epoch, epoch, watermark)
        if not l1 or current is None:
            return []
        ledger = self.open(session, l1).decode()
        levels = [SummaryLevel(SummaryText(summary_message(ledger, role), int(n1), current), 1)]
        if l2:
            both = ledger + "\n\n" + self.open(session, l2).decode()
            levels.append(
                SummaryLevel(SummaryText(summary_message(both, role), int(n2), current), 2)
            )
        return levels

    def previous(self, session: str, fields: list[Any]) -> Summary:
        """The summary a job folds into: the ledger, narrative and state (``l1 l2 state``)."""
        l1, l2, state = fields
        return Summary(
            self.open(session, l1).decode(),
            self.open(session, l2).decode() if l2 else "",
            self.open(session, state).decode() if state else None,
        )

    def anchor(
        self, session: str, value: bytes | None, body: bytes | None, role: str
    ) -> Anchor | None:
        """An anchor as stored (``anchor.lua``), or ``None``.

        Raises:
            CorruptEntryError: The value is not an anchor's.
        """
        if not value:
            return None
        try:
            epoch, start, level, tokens, covers, _, stamp = value.decode().split(" ")
            summary = None
            if int(level):
                text_ = self.open(session, body or b"").decode()
                summary = SummaryText(summary_message(text_, role), int(tokens), covers)
            return Anchor(int(epoch), "" if start == "-" else start, summary, int(level), stamp)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptEntryError(
                f"a view anchor cannot be decoded: {exc}", tenant=self.tenant, session=session
            ) from exc

    def anchor_value(self, session: str, anchor: Anchor, made_ms: int) -> tuple[str, bytes]:
        """An anchor as ``anchor.lua`` stores it: the value, and its summary's sealed body."""
        summary = anchor.summary
        value = " ".join(
            (
                str(anchor.epoch),
                anchor.start or "-",
                str(anchor.level),
                str(summary.tokens if summary else 0),
                summary.covers_upto if summary else "-",
                str(made_ms),
                anchor.stamp,
            )
        )
        body = summary_body(summary)
        return value, self.seal(session, body.encode()) if body is not None else b""


RECALL_HINT = "(These turns are stored in full: the search_history tool finds them.)"
"""Said after every summary: the recall tools (:mod:`ctxstore.recall`) reach what it condensed."""


def summary_message(body: str, role: str) -> dict[str, Any]:
    """The summary as the view sends it, in ``<summary>`` tags (its tokens are counted on it).

    The tags let the model tell the summary from user text; the line after
    them names the tool that reaches the turns it condensed.
    """
    return {"role": role, "content": "<summary>\n" + body + "\n</summary>\n" + RECALL_HINT}


def current_covers(
    covers: bytes | None, summary_epoch: bytes | None, epoch: bytes, watermark: bytes | None
) -> str | None:
    """What the cached summary covers, if it is the one of this epoch and watermark; else None.

    A commit sets the watermark and the summary together and a rewrite drops
    both, so they agree unless the view key is left from an older history.
    """
    if not covers or summary_epoch != epoch or covers != watermark:
        return None
    return covers.decode()


def summary_body(summary: SummaryText | None) -> str | None:
    """The text inside a wrapped summary (what the summarizer folds into)."""
    if summary is None:
        return None
    body = str(summary.message["content"])
    body = body.removesuffix("\n" + RECALL_HINT)
    return body.removeprefix("<summary>\n").removesuffix("\n</summary>")


def ids(joined: bytes | None) -> tuple[str, ...]:
    """Tool call ids as stored (joined by ``SEP``)."""
    return tuple(joined.decode().split(SEP)) if joined else ()


def join_ids(values: tuple[str, ...] | list[str]) -> str:
    """Tool call ids as the scripts store them."""
    return SEP.join(values)


def text(value: Any) -> str:
    """A reply value as text (bytes are UTF-8)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def pairs(flat: Any) -> dict[str, str]:
    """A hash reply as a dict of text: a flat RESP2 list or a RESP3 map."""
    if isinstance(flat, dict):
        return {text(k): text(v) for k, v in flat.items()}
    items = [text(v) for v in flat]
    return dict(zip(items[::2], items[1::2], strict=True))


def scored(reply: Any) -> list[tuple[str, Any]]:
    """A ``WITHSCORES`` reply's (member, score) pairs: a flat RESP2 list or RESP3 pairs."""
    if reply and isinstance(reply[0], list):
        return [(text(member), score) for member, score in reply]
    return [(text(reply[i]), reply[i + 1]) for i in range(0, len(reply), 2)]


def raw_pairs(reply: Any) -> list[tuple[Any, Any]]:
    """A hash reply's (field, value) pairs as sent: a flat RESP2 list or a RESP3 map."""
    if isinstance(reply, dict):
        return list(reply.items())
    return [(reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]

"""A history's chain: the frozen segments it starts with, as its session's meta stores them.

The chain is kept in the session's meta (``chain``: ``owner:id:high``, one
per segment, by a space); a branch's record holds one too. This is the pure
parsing of those records, and of the rows read from segments, shared by the
parts that read a history and by forgetting a tenant (no I/O: the segments
themselves are :mod:`ctxstore._parts.lineage`'s).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import text
from ctxstore._layout.formats import entry_order
from ctxstore.errors import CorruptEntryError, InvalidIdError

__all__ = ["Chain", "Row", "Segment", "held", "row_fields", "segments_of"]

Row = tuple[str, Any]
"""A stream row read from a segment or a log, and the session its values are sealed for."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment of a chain.

    Attributes:
        owner: The session it was frozen from (its key names it; its values
            are sealed for it).
        segment: Its random id.
        high: The last of its entries this history reads.
    """

    owner: str
    segment: str
    high: str

    def __str__(self) -> str:
        return f"{self.owner}:{self.segment}:{self.high}"


@dataclass(frozen=True, slots=True)
class Chain:
    """The segments a history starts with, oldest first (``meta`` ``chain``)."""

    segments: tuple[Segment, ...] = ()

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Chain:
        """A chain as stored.

        Raises:
            CorruptEntryError: It is not ``owner:id:high`` words.
        """
        words = text(raw).split() if raw else []
        segments = []
        for word in words:
            try:
                owner, segment, high = word.split(":")
                _keys.validate_id(owner, "session")
                entry_order(high)
            except (ValueError, InvalidIdError) as exc:
                raise CorruptEntryError(f"a session's chain cannot be read: {word[:80]!r}") from exc
            segments.append(Segment(owner, segment, high))
        return cls(tuple(segments))

    def __str__(self) -> str:
        return " ".join(map(str, self.segments))

    def __bool__(self) -> bool:
        return bool(self.segments)

    @property
    def base(self) -> str:
        """The last entry the chain holds (``""`` when empty)."""
        return self.segments[-1].high if self.segments else ""

    def ranges(self) -> Iterator[tuple[Segment, str]]:
        """Each segment, and the entry its part starts after (``""``: the first)."""
        low = ""
        for segment in self.segments:
            yield segment, low
            low = segment.high

    def holding(self, entry_id: str) -> Segment | None:
        """The segment that holds ``entry_id`` in this history, or ``None``."""
        at = entry_order(entry_id)
        for segment, low in self.ranges():
            if (not low or entry_order(low) < at) and at <= entry_order(segment.high):
                return segment
        return None

    def upto(self, entry_id: str) -> Chain:
        """The chain of the history cut after ``entry_id`` (``""``: before the first entry)."""
        if not entry_id:
            return Chain()
        at = entry_order(entry_id)
        kept = []
        for segment in self.segments:
            if at <= entry_order(segment.high):
                kept.append(Segment(segment.owner, segment.segment, entry_id))
                break
            kept.append(segment)
        return Chain(tuple(kept))

    def mentions(self, segment: str) -> bool:
        """True when one of the segments is ``segment`` (by id)."""
        return any(s.segment == segment for s in self.segments)


def held(reply: Any) -> list[tuple[str, str]]:
    """The segments a script says a session let go of (``owner:id,...``, ``-`` for none)."""
    words = text(reply)
    if words in ("", "-"):
        return []
    return [(owner, segment) for owner, _, segment in (w.partition(":") for w in words.split(","))]


def segments_of(chain: Any, branches: Iterable[Any]) -> list[tuple[str, str]]:
    """The segments a session reads: its chain's (meta ``chain``) and its branches' records'.

    A record that is not JSON is skipped (it names nothing that can be read).
    """
    found = [(s.owner, s.segment) for s in Chain.parse(chain).segments]
    for raw in branches:
        try:
            branch_chain = json.loads(raw)["chain"]
            found += [(s.owner, s.segment) for s in Chain.parse(branch_chain).segments]
        except (ValueError, TypeError, KeyError, CorruptEntryError):
            continue
    return list(dict.fromkeys(found))


def row_fields(row: Any) -> dict[bytes, bytes]:
    """A raw stream row's fields by name (``[id, [name, value, ...]]``)."""
    flat = row[1]
    return {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}

"""What a request view reads: one snapshot of the session, cold or warm.

A cold read is one MULTI/EXEC (counters, the protected copies, the anchor,
and the newest entries back to the anchor's start); a history that starts in
a fork's segments is read on past the live log (:mod:`ctxstore._parts.lineage`).

A pod keeps what its last view of a session read (:class:`WarmViews`, a
byte-bounded LRU shared by the process's tenants), and its next view reads
only the counters, the anchor's value and the entries after the last one it
holds: one round trip whose replies validate the copy (the epoch and the
session's life, the count, the pinned copies' version, the anchor), so a
replace, a pop, an expiry, a pin or another pod's anchor move is never missed:
any of them sends the view down the cold path.

How far back a read reaches is guessed from the last view (:meth:`Snapshots.expect`,
:meth:`Snapshots.started`) and read on in more round trips when the guess
fell short (:func:`entries_short`). Planning on the snapshot, and moving the
anchor, are :mod:`ctxstore._parts.anchor`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxstore._layout.chain import Chain, Row
from ctxstore._layout.codec import Anchor, Entry, Meta, raw_pairs, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.keys import SessionKeys
from ctxstore._layout.memo import Memo
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.scope import Scope
from ctxstore._plan.view import Shape, ViewPlan, form_cost
from ctxstore._plan.warm import WarmViews, _Warm, ahead_size
from ctxstore.errors import EpochChangedError

__all__ = ["Relayout", "Snapshot", "Snapshots", "entries_short"]

_WARM_LIMIT = 256
"""The most new entries a warm read takes; past that, the view reads as a cold pod does."""


@dataclass(slots=True)
class Snapshot:
    """What one view read: counters, the protected entries, the anchor, the newest entries."""

    epoch: int
    count: int
    tokens: int
    unsummarized: int = 0
    summary_due: bool = False
    summary_idle: int | None = None  # the tokens when the last job found nothing to cover
    protected: list[Entry] = field(default_factory=list)
    anchor: Anchor | None = None
    tail: list[Entry] = field(default_factory=list)  # oldest first
    complete: bool = False  # the tail starts at the first entry of the history
    base: bytes | None = None  # the history's chain ends here: older entries are in segments
    read: int = 0
    life: bytes | None = None  # meta's life token: a session written again after it expired
    keep_version: bytes | None = None  # meta's version of the protected copies
    anchor_raw: bytes | None = None  # the anchor as stored (its value, not its body)
    warm: bool = False  # read as a warm pod reads: only what was new
    held: ViewPlan | None = None  # a warm pod's last plan, on this same anchor
    new: list[Entry] = field(default_factory=list)  # what a warm read found after its copy
    own: int = 0  # of which this pod appended (not read from Redis), the first ones
    held_size: int | None = None  # the bytes of that copy
    last_id: bytes | None = None  # the newest entry when a cold read was made
    unanchored: bool = False  # planned on an anchor a full Redis would not keep
    watermark: str | None = None  # the last entry the latest committed summary covers


class Snapshots:
    """One tenant's snapshot reads for its request views.

    Args:
        scope: The tenant's scope.
        warm: The process's kept views (shared by its tenants).
        lineage: The tenant's frozen segments (a fork's history starts in them).
        shape: The view's shape, from the settings.
    """

    def __init__(self, scope: Scope, warm: WarmViews, lineage: Lineage, shape: Shape) -> None:
        self._scope = scope
        self._warm = warm
        self._lineage = lineage
        self._shape = shape
        self._counts: Memo[tuple[str, int], int] = Memo()  # entries the last view read
        self._starts: Memo[tuple[str, int], str] = Memo()  # where the last view started

    def expect(self, session: str, size: int, count: int) -> None:
        """The next cold read of ``session`` for ``size`` takes ``count`` entries at first."""
        self._counts.put((session, size), count)

    def started(self, session: str, size: int, start: str) -> None:
        """The last view of ``session`` for ``size`` started at entry ``start`` (``""``: none)."""
        self._starts.put((session, size), start)

    async def read(self, session: str, keys: SessionKeys, size: int) -> Snapshot:
        """Read what a view needs in one MULTI/EXEC, and more only if the guess fell short.

        A pod that viewed the session before reads only what is new
        (:meth:`_warm_snapshot`). Otherwise the tail is read newest first:
        back to the anchor's start (or, with no anchor, back to a budget's
        worth): back to where this process's last view of it started, if it
        has one (an anchor moves forward only, so that is no further back
        than needed, unless a replace dropped it), else as many entries as
        the budget should hold.
        """
        tenant = self._scope.tenant
        warm = self._warm.get(tenant, session, size) if self._warm.limit else None
        snap = await self._warm_snapshot(session, keys, size, warm) if warm else None
        if snap is None:
            held = warm or (self._warm.any(tenant, session) if self._warm.limit else None)
            snap = await self._cold_snapshot(session, keys, size, held)
        start = entry_order(snap.anchor.start) if snap.anchor and snap.anchor.start else None
        shape = self._shape
        while not snap.complete:
            if start is None:  # a budget's worth
                want = entries_short(snap, size, shape)
            elif snap.tail and entry_order(snap.tail[0].entry_id) <= start:
                want = 0
            else:  # back to the anchor's start, however many entries that is: twice as many
                want = min(max(len(snap.tail), 8) * 2, _READ_BACK_MOST)
            if not want:
                break
            await self.read_back(session, keys, snap, want)
        if not snap.warm:
            self._counts.put((session, size), max(8, len(snap.tail) + 4))
        return snap

    def _counters(self, meta: list[Any]) -> Snapshot:
        """A snapshot's counters from ``HMGET meta`` of :data:`_META` (entries not read yet)."""
        return Snapshot(
            epoch=int(meta[0] or 0),
            count=int(meta[1] or 0),
            tokens=int(meta[2] or 0),
            unsummarized=int(meta[2] or 0) - int(meta[3] or 0),
            summary_due=meta[4] == b"1",
            summary_idle=None if meta[5] is None else int(meta[5]),
            life=meta[6],
            keep_version=meta[7],
            base=meta[8] or None,
            watermark=text(meta[9]) if meta[9] else None,
        )

    async def _cold_snapshot(
        self, session: str, keys: SessionKeys, size: int, held: _Warm | None = None
    ) -> Snapshot:
        """Read the counters, protected copies, anchor and newest entries in one MULTI/EXEC.

        The protected copies are read once per change: a pod that keeps another
        copy of the session (``held``: this view's, invalid now, or another
        budget's) takes them from it if the epoch, the life and the keep
        version are still the session's, and reads them again (one more round
        trip) if not.
        """
        connection, codec = self._scope.connection, self._scope.codec
        count = self._counts.get((session, size)) or max(8, size // _GUESS_TOKENS)
        start = self._starts.get((session, size))
        if start:
            count *= 2  # only a cap: the read stops at the last view's start
        meta, *keep, anchor, rows = await connection.transaction(
            [
                ("HMGET", keys.meta, *_META, Meta.LAST_ID),
                *([("HGETALL", keys.keep)] if held is None else []),
                ("HMGET", keys.anchor, size, f"{size}:s"),
                ("XREVRANGE", keys.log, "+", start or "-", "COUNT", count),
            ],
            session=session,
            key=keys.log,
        )
        snap = self._counters(meta)
        snap.last_id = meta[len(_META)] or None
        if held is None:
            snap.protected = sorted(
                (codec.kept(session, text(k), v) for k, v in raw_pairs(keep[0])),
                key=lambda e: entry_order(e.entry_id),
            )
            snap.read = len(snap.protected)
        elif (snap.epoch, snap.life, snap.keep_version) == (
            held.epoch,
            held.life,
            held.keep_version,
        ):
            snap.protected = list(held.protected)
        else:
            return await self._cold_snapshot(session, keys, size)
        self._set_anchor(session, snap, anchor[0], anchor[1])
        newest_first = [codec.entry(session, row) for row in rows]
        snap.read += len(rows)
        # Short of the count, the read reached the log's first entry, unless it stopped at
        # the last view's start; a history that starts in segments goes on past the log.
        snap.complete = len(rows) < count and not start and not snap.base
        snap.tail = newest_first[::-1]
        return snap

    def _set_anchor(
        self, session: str, snap: Snapshot, value: bytes | None, body: bytes | None
    ) -> None:
        """Decode the anchor read into ``snap`` (one left from a replaced history is none)."""
        role = self._scope.settings.summary_role
        snap.anchor = self._scope.codec.anchor(session, value, body, role)
        snap.anchor_raw = value or None
        if snap.anchor is not None and snap.anchor.epoch != snap.epoch:
            snap.anchor, snap.anchor_raw = None, None  # left from a replaced history

    async def _warm_snapshot(
        self, session: str, keys: SessionKeys, size: int, warm: _Warm, *, own: bool = True
    ) -> Snapshot | None:
        """Read only what is new since this pod's last view; ``None``: read cold.

        What this pod appended since (``own``: :meth:`WarmViews.add_own`) is not
        read again, and then no entry is: the count holds the copy only if
        nothing else was appended (appends alone move it while the epoch stands:
        a pop moves the epoch); if something was, one more round trip reads
        everything after the copy.

        One round trip reads the entries after the last one kept, then the
        anchor's value (not its summary), then the counters. The copy holds
        only if the epoch and the life are the same, the count grew by exactly
        the entries read (so none was popped), and the pinned copies' version
        is the same. An anchor another pod moved costs one more round trip for
        its summary.

        The three reads are not a transaction (MULTI/EXEC costs the server a
        fifth of this read), so another client may write between them; the
        order makes that safe. The counters are read last: a rewrite, pop,
        expiry or pin that came after the entries were read changes the
        epoch, the life or the version, and an append the count, so the copy
        is refused. If none changed, the log was as read from the first read
        to the last, and an anchor moved meanwhile was planned on entries this
        pod holds.
        """
        connection, codec = self._scope.connection, self._scope.codec
        last = warm.tail[-1].entry_id if warm.tail else None
        mine = (self._warm.own_after(self._scope.tenant, session, last) if own else None) or []
        low = "(" + last if last else "-"
        # Newest first, from the stream's end: XRANGE from an id would walk the last
        # node's entries up to it (a stream node holds up to 200). A pod that appended
        # since its last view bets nobody else did: it reads no entries (the count tells).
        read = [] if mine else [("XREVRANGE", keys.log, "+", low, "COUNT", _WARM_LIMIT)]
        *found, anchor, meta = await connection.batch(
            [*read, ("HGET", keys.anchor, size), ("HMGET", keys.meta, *_META)],
            session=session,
            key=keys.log,
        )
        rows = found[0] if found else []
        snap = self._counters(meta)
        if (
            snap.epoch != warm.epoch
            or snap.life != warm.life
            or snap.keep_version != warm.keep_version
            or len(rows) >= _WARM_LIMIT
        ):
            return None
        if snap.count != warm.count + len(mine) + len(rows):
            # Another pod's came too (or a pop, if none was its own): read all that is new.
            return await self._warm_snapshot(session, keys, size, warm, own=False) if mine else None
        snap.new = [*mine, *(codec.entry(session, row) for row in reversed(rows))]
        snap.own = len(mine)
        if (anchor or None) == warm.anchor_raw:
            snap.anchor, snap.anchor_raw = warm.anchor, warm.anchor_raw
            snap.held = warm.plan
        else:
            value, body = await connection.transaction(
                [("HGET", keys.anchor, size), ("HGET", keys.anchor, f"{size}:s")],
                session=session,
                key=keys.anchor,
            )
            if value != anchor:
                return None  # moved again meanwhile
            self._set_anchor(session, snap, value, body)
        snap.protected = list(warm.protected)
        snap.held_size = warm.size - ahead_size(warm.plan)  # its entries'
        snap.tail = [*warm.tail, *snap.new]
        snap.complete = warm.complete
        snap.read = len(rows)
        snap.warm = True
        return snap

    async def read_back(self, session: str, keys: SessionKeys, snap: Snapshot, count: int) -> None:
        """Read the next ``count`` older entries into ``snap.tail`` (checking the epoch).

        Raises:
            EpochChangedError: A replace or clear came between the reads.
        """
        if snap.complete:
            return
        # Older than what was read; with nothing read yet, no newer than the log's end at
        # the first read: an entry appended since is not in the counters that read took.
        if snap.tail:
            low = "(" + snap.tail[0].entry_id
        else:
            low = text(snap.last_id) if snap.last_id else "+"
        (epoch, base, chain), rows = await self._scope.connection.transaction(
            [
                ("HMGET", keys.meta, Meta.EPOCH, Meta.BASE, Meta.CHAIN),
                ("XREVRANGE", keys.log, low, "-", "COUNT", count),
            ],
            session=session,
            key=keys.log,
        )
        if (base or None) != snap.base and int(epoch or 0) == snap.epoch:
            raise Relayout  # a fork froze the log: the same history, in another place
        if int(epoch or 0) != snap.epoch:
            raise EpochChangedError(
                snap.epoch,
                int(epoch or 0),
                tenant=self._scope.tenant,
                session=session,
                key=keys.meta,
            )
        found: list[Row] = [(session, row) for row in rows]
        if len(rows) < count and base:
            # The log is read to its start: the older entries are in the chain's segments
            # (they never change: read in round trips of their own, from their slots).
            before = text(rows[-1][0]) if rows else (snap.tail[0].entry_id if snap.tail else "")
            found += await self._lineage.older(Chain.parse(chain), before, count - len(rows))
        snap.read += len(found)
        snap.complete = len(found) < count
        older = [self._scope.codec.entry(owner, row) for owner, row in found]
        snap.tail = older[::-1] + snap.tail


_META = (
    Meta.EPOCH,
    Meta.COUNT,
    Meta.TOKENS,
    Meta.WATERMARK_TOKENS,
    Meta.SUMMARY_DUE,
    Meta.IDLE,
    Meta.LIFE,
    Meta.KEEP_VERSION,
    Meta.BASE,
    Meta.WATERMARK,
)
"""The counters every view reads (see :meth:`Snapshots._counters`)."""


class Relayout(Exception):
    """The live log was frozen under a read (a fork): read the view again."""


_GUESS_TOKENS = 150
"""The tokens of an entry, guessed before any is read."""
_READ_BACK_MOST = 10_000
"""The most entries one read back asks for."""


def entries_short(snap: Snapshot, size: int, shape: Shape) -> int:
    """How many older entries to read for the tail to hold ``size`` tokens (0: it does).

    Sized by the tail's mean entry, a quarter more and at least 8 (a short guess
    costs one more round trip): a step whose tail is a few entries short of the
    budget reads those, not twice the tail again (a hundred 1 KB entries sent for
    a handful). A tail that holds the budget but starts inside a tool exchange
    (a result whose call is older) reads on, up to twice the budget, so the plan
    sees the exchange whole and never cuts it: each read as much again as the
    tail holds past the budget, so a result whose call is gone costs a few round
    trips, not dozens.
    """
    protected = {e.entry_id for e in snap.protected}
    costs = [form_cost(e, size, shape) for e in snap.tail if e.entry_id not in protected]
    held = sum(costs)
    short = size - held
    mean = max(1.0, held / len(costs)) if costs else _GUESS_TOKENS
    if short <= 0:
        if held >= 2 * size or not _opens_inside_exchange(snap.tail):
            return 0
        short = held - size  # as much again as is held past the budget: at least 8
    return min(max(8, math.ceil(1.25 * short / mean)), _READ_BACK_MOST)


def _opens_inside_exchange(tail: Sequence[Entry]) -> bool:
    """True when an entry of ``tail`` answers a call no entry before it in ``tail`` made."""
    called: set[str] = set()
    for entry in tail:
        if any(rid not in called for rid in entry.results):
            return True
        called.update(entry.calls)
    return False

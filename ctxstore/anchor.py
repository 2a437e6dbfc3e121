"""The request view over its anchor: read, plan, and move the anchor when the view is full.

A view's start (the summary it sends, where its raw part begins) is a
per-session, per-budget *anchor* kept in Redis, so every pod serving a
session sends the same bytes and the provider's prompt cache holds: appends
only extend the view, and when it would overflow the anchor moves once, to
the low-water mark, with the newest summary swapped in then
(:func:`ctxstore.view.plan_anchored`). Moving it is a compare-and-set
(``anchor.lua``): of pods that find a view full at once, one moves it and the
others send what it chose.

A cold read is one MULTI/EXEC (counters, the protected copies, the anchor,
and the newest entries back to the anchor's start); a step reads the
summary's levels and sets the anchor, two more round trips, once per step.

A message sent as stored costs the tokens counted at append; one sent in
another form (a preview, a message a repair stripped) is counted as sent,
once per process: the counts are kept by the message's digest.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from ctxstore._codec import (
    SUMMARY_FIELDS,
    Anchor,
    Entry,
    Meta,
    Reply,
    SummaryLevel,
    raw_pairs,
    text,
)
from ctxstore._formats import entry_order
from ctxstore._keys import SessionKeys
from ctxstore._scope import Memo, Scope
from ctxstore._scripts import SCRIPTS
from ctxstore.budget import Budget
from ctxstore.errors import EpochChangedError
from ctxstore.models import RequestView, ViewStats
from ctxstore.tokens import count_message
from ctxstore.view import Shape, ViewPlan, form_cost, plan_anchored

__all__ = ["Snapshot", "Viewer"]

_ATTEMPTS = 4


@dataclass(slots=True)
class Snapshot:
    """What one view read: counters, the protected entries, the anchor, the newest entries."""

    epoch: int
    count: int
    tokens: int
    unsummarized: int = 0
    summary_due: bool = False
    summary_idle: bool = False  # the last job found nothing to cover, and nothing changed since
    protected: list[Entry] = field(default_factory=list)
    anchor: Anchor | None = None
    tail: list[Entry] = field(default_factory=list)  # oldest first
    complete: bool = False  # the tail starts at the first entry
    read: int = 0


class Viewer:
    """One tenant's request views.

    Args:
        scope: The tenant's scope.
    """

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self._counts: Memo[tuple[str, int], int] = Memo()  # entries the last view read
        self._sizes: Memo[bytes, int] = Memo()  # a message's digest -> its tokens as sent

    @property
    def shape(self) -> Shape:
        """The view's shape, from the settings."""
        s = self._scope.settings
        return Shape(s.view_low_water, s.view_summary_share, s.view_full_share)

    async def view(self, session: str, budget: Budget) -> tuple[RequestView, Snapshot]:
        """The request view for ``budget``, and the snapshot it was planned from.

        Raises:
            EpochChangedError: Replaces kept coming between the reads.
        """
        keys = self._scope.keys(session)
        size = budget.cl100k
        shape = self.shape
        for _ in range(_ATTEMPTS):
            snap = await self._snapshot(session, keys, size)
            plan, _ = self._plan(snap, size, shape, levels=None)
            if plan is None:
                plan = await self._step(session, keys, snap, size, shape)
                if plan is None:
                    continue  # the history changed under the step: read again
            self._guess_next_read(session, size, snap, plan)
            return self._result(plan, snap, budget), snap
        raise EpochChangedError(-1, -1, tenant=self._scope.tenant, session=session, key=keys.anchor)

    def _guess_next_read(self, session: str, size: int, snap: Snapshot, plan: ViewPlan) -> None:
        """How many entries the next view of ``session`` reads in its first round trip.

        What this view sent reaches back to the anchor's start; the next one
        needs that and whatever is appended meanwhile (a quarter more, at
        least 8 entries). Reading back a budget's worth instead (what a move
        may need) would send Redis several times what the view sends; a move
        reads back itself (``_step``), and a short guess costs one more round
        trip.
        """
        protected = {e.entry_id for e in snap.protected}
        sent = [entry_order(i) for i in plan.kept_ids if i not in protected]
        if not sent:
            return
        first = min(sent)
        needed = sum(1 for e in snap.tail if entry_order(e.entry_id) >= first)
        self._counts.put((session, size), needed + max(8, needed // 4))

    def _plan(
        self, snap: Snapshot, size: int, shape: Shape, levels: list[SummaryLevel] | None
    ) -> tuple[ViewPlan | None, Anchor | None]:
        """Plan from ``snap``; ``(None, None)`` when the anchor must move and no levels were given.

        ``levels`` are the summaries a step may swap in.
        """
        return plan_anchored(
            snap.protected,
            snap.tail,
            size,
            anchor=snap.anchor,
            levels=levels,
            complete=snap.complete,
            shape=shape,
            epoch=snap.epoch,
            stamp=secrets.token_urlsafe(6),
            count=self._count,
        )

    def _count(self, message: dict[str, Any]) -> int:
        """The tokens of a message sent in another form than stored (tokenized once)."""
        digest = hashlib.blake2b(json.dumps(message).encode(), digest_size=16).digest()
        tokens = self._sizes.get(digest)
        if tokens is None:
            tokens = count_message(self._scope.counter, message)
            self._sizes.put(digest, tokens)
        return tokens

    async def _step(
        self, session: str, keys: SessionKeys, snap: Snapshot, size: int, shape: Shape
    ) -> ViewPlan | None:
        """Move the anchor: the newest summary, raw entries back to the low-water mark.

        Returns ``None`` when the history changed meanwhile (read it again).
        """
        connection, codec = self._scope.connection, self._scope.codec
        role = self._scope.settings.summary_role
        meta, fields = await connection.transaction(
            [
                ("HMGET", keys.meta, Meta.EPOCH, Meta.WATERMARK),
                ("HMGET", keys.view, *SUMMARY_FIELDS),
            ],
            session=session,
            key=keys.meta,
        )
        if int(meta[0] or 0) != snap.epoch:
            return None
        levels = codec.summary_levels(session, fields, meta[0] or b"0", meta[1], role)
        while not snap.complete and _raw_cost(snap, size, shape) < size:
            await self._read_back(session, keys, snap, size, shape)
        plan, new = self._plan(snap, size, shape, levels)
        if plan is None or new is None:
            return plan
        value, body = codec.anchor_value(session, new, self._scope.wall_ms())
        reply = await connection.script(
            SCRIPTS.anchor,
            (keys.anchor, keys.meta),
            (
                size,
                snap.anchor.stamp if snap.anchor else "",
                value,
                body,
                snap.epoch,
                self._scope.settings.view_max_anchors,
            ),
            session=session,
        )
        status = text(reply[0])
        if status == Reply.OK:
            return plan
        if status == Reply.STALE:
            return None
        # Another pod moved it first: send what it chose (or move it again, if full already).
        snap.anchor = codec.anchor(session, reply[1] or None, reply[2] or None, role)
        plan, _ = self._plan(snap, size, shape, levels)
        if plan is None:
            return await self._step(session, keys, snap, size, shape)
        return plan

    async def _snapshot(self, session: str, keys: SessionKeys, size: int) -> Snapshot:
        """Read what a view needs in one MULTI/EXEC, and more only if the guess fell short.

        The tail is read newest first: back to the anchor's start (or, with no
        anchor, back to a budget's worth), as many entries as this process
        found last time (or as the budget should hold).
        """
        connection, codec = self._scope.connection, self._scope.codec
        count = self._counts.get((session, size)) or max(8, size // 150)
        meta, keep, anchor, rows = await connection.transaction(
            [
                (
                    "HMGET",
                    keys.meta,
                    Meta.EPOCH,
                    Meta.COUNT,
                    Meta.TOKENS,
                    Meta.WATERMARK_TOKENS,
                    Meta.SUMMARY_DUE,
                    Meta.IDLE,
                ),
                ("HGETALL", keys.keep),
                ("HMGET", keys.anchor, size, f"{size}:s"),
                ("XREVRANGE", keys.log, "+", "-", "COUNT", count),
            ],
            session=session,
            key=keys.log,
        )
        snap = Snapshot(
            epoch=int(meta[0] or 0),
            count=int(meta[1] or 0),
            tokens=int(meta[2] or 0),
            unsummarized=int(meta[2] or 0) - int(meta[3] or 0),
            summary_due=meta[4] == b"1",
            summary_idle=meta[5] is not None,
        )
        snap.protected = sorted(
            (codec.kept(session, text(k), v) for k, v in raw_pairs(keep)),
            key=lambda e: entry_order(e.entry_id),
        )
        snap.read = len(snap.protected)
        role = self._scope.settings.summary_role
        snap.anchor = codec.anchor(session, anchor[0], anchor[1], role)
        if snap.anchor is not None and snap.anchor.epoch != snap.epoch:
            snap.anchor = None  # left from a replaced history
        newest_first = [codec.entry(session, row) for row in rows]
        snap.read += len(rows)
        snap.complete = len(rows) < count
        snap.tail = newest_first[::-1]
        start = entry_order(snap.anchor.start) if snap.anchor and snap.anchor.start else None
        shape = self.shape
        while not snap.complete and not _reached(snap, start, size, shape):
            await self._read_back(session, keys, snap, size, shape)
        self._counts.put((session, size), max(8, len(snap.tail) + 4))
        return snap

    async def _read_back(
        self, session: str, keys: SessionKeys, snap: Snapshot, size: int, shape: Shape
    ) -> None:
        """Read the next older batch into ``snap.tail`` (checking the epoch).

        Raises:
            EpochChangedError: A replace or clear came between the reads.
        """
        if snap.complete:
            return
        count = min(max(len(snap.tail), 8) * 2, 10_000)
        low = "(" + snap.tail[0].entry_id if snap.tail else "+"
        epoch, rows = await self._scope.connection.transaction(
            [("HGET", keys.meta, Meta.EPOCH), ("XREVRANGE", keys.log, low, "-", "COUNT", count)],
            session=session,
            key=keys.log,
        )
        if int(epoch or 0) != snap.epoch:
            raise EpochChangedError(
                snap.epoch,
                int(epoch or 0),
                tenant=self._scope.tenant,
                session=session,
                key=keys.meta,
            )
        snap.read += len(rows)
        snap.complete = len(rows) < count
        older = [self._scope.codec.entry(session, row) for row in rows]
        snap.tail = older[::-1] + snap.tail

    def _result(self, plan: ViewPlan, snap: Snapshot, budget: Budget) -> RequestView:
        stats = ViewStats(
            budget=budget.tokens,
            budget_cl100k=budget.cl100k,
            tokens=plan.tokens,
            history_messages=snap.count,
            history_tokens=snap.tokens,
            messages=len(plan.messages),
            dropped=snap.count - len(plan.kept_ids),
            protected_tokens=plan.protected_tokens,
            summary_used=plan.summary_used,
            summary_covers=plan.summary_covers,
            offloaded=plan.offloaded,
            repairs=plan.repairs,
            over_budget=plan.over_budget,
            epoch=snap.epoch,
            entries_read=snap.read,
        )
        stats.compacted = bool(stats.dropped or stats.offloaded or stats.summary_used)
        return RequestView(plan.messages, stats)


def _raw_cost(snap: Snapshot, size: int, shape: Shape) -> int:
    protected = {e.entry_id for e in snap.protected}
    return sum(form_cost(e, size, shape) for e in snap.tail if e.entry_id not in protected)


def _reached(snap: Snapshot, start: tuple[int, int] | None, size: int, shape: Shape) -> bool:
    """True when the tail reaches back to the anchor's start (no anchor: a budget's worth)."""
    if not snap.tail:
        return False
    if start is not None:
        return entry_order(snap.tail[0].entry_id) <= start
    return _raw_cost(snap, size, shape) >= size

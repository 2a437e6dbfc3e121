"""The request view over its anchor: read, plan, and move the anchor when the view is full.

A view's start (the summary it sends, where its raw part begins) is a
per-session, per-budget *anchor* kept in Redis, so every pod serving a
session sends the same bytes and the provider's prompt cache holds: appends
only extend the view, and when it would overflow the anchor moves once, to
the low-water mark, with the newest summary swapped in then
(:func:`ctxstore._plan.anchored.plan_anchored`). Moving it is a compare-and-set
(``anchor.lua``): of pods that find a view full at once, one moves it and the
others send what it chose.

A view plans on one snapshot of the session (:mod:`ctxstore._parts.snapshot`:
one round trip, cold or warm); a step reads the summary's levels and sets
the anchor, two more round trips, once per step. A warm pod's view grows its
last plan when it can (:func:`ctxstore._plan.growth.grow`), and keeps what
it read and planned for the next one (:class:`WarmViews`).

A caller's budget is in its model's tokens: :meth:`Viewer.request` resolves
it with the tenant's learned ratio, and asks for a summary after the view
when its pressure calls for one.

A message sent as stored costs the tokens counted at append; one sent in
another form (a preview, a message a repair stripped) is counted as sent,
once per process: the counts are kept by the message's digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from typing import TYPE_CHECKING, Any

from ctxstore._layout.codec import SUMMARY_FIELDS, Anchor, Meta, Reply, SummaryLevel, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.keys import SessionKeys
from ctxstore._layout.memo import Memo
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.scope import Scope
from ctxstore._parts.snapshot import Relayout, Snapshot, Snapshots, entries_short
from ctxstore._plan.anchored import brings_summary, plan_anchored
from ctxstore._plan.growth import grow
from ctxstore._plan.view import Shape, ViewPlan, caller_copy, nested_positions
from ctxstore._plan.warm import WarmViews, _Warm, ahead_size, held_size
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.budget import Budget, resolve_budget
from ctxstore.errors import EpochChangedError, StoreFullError
from ctxstore.models import RequestView, ViewStats
from ctxstore.tokens import count_message

if TYPE_CHECKING:
    from ctxstore._parts.summary import Summaries
    from ctxstore._tenant.ratios import Ratios

__all__ = ["Viewer"]

_ATTEMPTS = 4


class Viewer:
    """One tenant's request views.

    Args:
        scope: The tenant's scope.
        warm: The process's kept views (shared by its tenants).
        lineage: The tenant's frozen segments (a fork's history starts in them).
        ratios: The tenant's learned token ratios (a caller's budget is in its model's tokens).
        summaries: Asked for a summary when a view's pressure calls for one.
    """

    def __init__(
        self,
        scope: Scope,
        warm: WarmViews,
        lineage: Lineage,
        ratios: Ratios,
        summaries: Summaries,
    ) -> None:
        self._scope = scope
        self.warm = warm
        self._ratios = ratios
        self._summaries = summaries
        self._sizes: Memo[bytes, int] = Memo()  # a message's digest -> its tokens as sent
        s = scope.settings  # frozen: the shape is the same for every view
        self.shape = Shape(
            s.view_low_water,
            s.view_summary_share,
            s.view_full_share,
            s.view_step_calls,
            min(s.view_low_water_floor, s.view_low_water),
        )
        """The view's shape, from the settings."""
        self._snapshots = Snapshots(scope, warm, lineage, self.shape)

    async def request(
        self, session: str, token_budget: int | None, provider: Any | None, model: str | None
    ) -> RequestView:
        """The view a caller asks for (``ContextStore.view``), and a summary if it calls for one.

        The budget is resolved in the model's tokens, with the tenant's learned
        ratio for ``model`` (:class:`~ctxstore._tenant.ratios.Ratios`), else the
        configured guess; after the view, a summary is asked for when its
        pressure calls for one (:meth:`~ctxstore._parts.summary.Summaries.ask_if_needed`).
        """
        self._scope.keys(session)  # a bad id is refused before anything else
        learned = await self._ratios.factors()
        budget = resolve_budget(
            token_budget, provider, model=model, settings=self._scope.settings, learned=learned
        )
        view, snap = await self.view(session, budget)
        await self._summaries.ask_if_needed(session, snap, budget.cl100k)
        return view

    async def view(self, session: str, budget: Budget) -> tuple[RequestView, Snapshot]:
        """The request view for ``budget``, and the snapshot it was planned from.

        Raises:
            EpochChangedError: Replaces kept coming between the reads.
        """
        keys = self._scope.keys(session)
        size = budget.cl100k
        shape = self.shape
        for _ in range(_ATTEMPTS):
            try:
                snap = await self._snapshots.read(session, keys, size)
                plan = self._grow(snap, size, shape)
                if plan is None:
                    plan, _ = self._plan(snap, size, shape, levels=None)
                if plan is None:
                    plan = await self._step(session, keys, snap, size, shape)
            except (Relayout, EpochChangedError):
                continue  # a fork froze the log, or a rewrite came between the reads
            if plan is None:
                continue  # the history changed under the step: read again
            kept = False
            if not snap.unanchored:
                if not snap.warm:  # a warm pod's next view reads only what is new
                    self._guess_next_read(session, size, snap, plan)
                self._snapshots.started(session, size, snap.anchor.start if snap.anchor else "")
                kept = self._keep_warm(session, size, snap, plan)
            result = self._result(plan, snap, budget)
            if kept and plan.growth is not None:  # the next view may grow it: copy it meanwhile
                asyncio.get_running_loop().call_soon(_make_ready, plan)
            return result, snap
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
        self._snapshots.expect(session, size, needed + max(8, needed // 4))

    def _grow(self, snap: Snapshot, size: int, shape: Shape) -> ViewPlan | None:
        """A warm view's plan grown from its last one (:func:`grow`), or ``None``: plan it."""
        if snap.held is None or snap.read + snap.own != len(snap.new):
            return None  # no plan on this anchor, or the read reached back further
        if brings_summary(snap.anchor, snap.watermark):
            return None  # a step brings the new summary in
        return grow(
            snap.held,
            snap.tail,
            snap.new,
            size,
            anchor=snap.anchor,
            complete=snap.complete,
            shape=shape,
        )

    def _keep_warm(self, session: str, size: int, snap: Snapshot, plan: ViewPlan) -> bool:
        """Keep what this view read, from its anchor's start on, and its plan, for the next view.

        Returns:
            True if kept.
        """
        if not self.warm.limit or not snap.tail:
            return False
        tail = snap.tail
        complete = snap.complete
        cut = 0
        if snap.anchor is not None and snap.anchor.start and tail[0].entry_id != snap.anchor.start:
            start = entry_order(snap.anchor.start)
            cut = next(
                (i for i, e in enumerate(tail) if entry_order(e.entry_id) >= start), len(tail)
            )
            if cut:
                tail, complete = tail[cut:], False
        if snap.held_size is not None and not cut and snap.read + snap.own == len(snap.new):
            held = snap.held_size + held_size(snap.new)  # the copy it read, and what was new
        else:
            held = held_size(snap.protected) + held_size(tail)
        warm = _Warm(
            epoch=snap.epoch,
            life=snap.life,
            keep_version=snap.keep_version,
            count=snap.count,
            protected=tuple(snap.protected),
            anchor_raw=snap.anchor_raw,
            anchor=snap.anchor,
            tail=tuple(tail),
            complete=complete,
            size=held + ahead_size(plan),  # and the caller's copy made ahead (_make_ready)
            plan=plan,
        )
        return self.warm.put(self._scope.tenant, session, size, warm)

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
            watermark=snap.watermark,
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
        while not snap.complete and (want := entries_short(snap, size, shape)):
            await self._snapshots.read_back(session, keys, snap, want)
        plan, new = self._plan(snap, size, shape, levels)
        if plan is None or new is None:
            return plan
        value, body = codec.anchor_value(session, new, self._scope.wall_ms())
        try:
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
        except StoreFullError:
            # A full Redis keeps no new anchor: the view is sent as planned, kept by no
            # pod, and the next one plans again (the same, while nothing is appended).
            snap.unanchored = True
            return plan
        status = text(reply[0])
        if status == Reply.OK:
            snap.anchor, snap.anchor_raw = new, value.encode()
            return plan
        if status == Reply.STALE:
            return None
        # Another pod moved it first: send what it chose (or move it again, if full already).
        snap.anchor = codec.anchor(session, reply[1] or None, reply[2] or None, role)
        snap.anchor_raw = reply[1] or None
        plan, _ = self._plan(snap, size, shape, levels=None)  # its anchor, or none
        if plan is None:
            return await self._step(session, keys, snap, size, shape)
        return plan

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
            offloaded=list(plan.offloaded),
            repairs=list(plan.repairs),
            over_budget=plan.over_budget,
            epoch=snap.epoch,
            entries_read=snap.read,
        )
        stats.compacted = bool(stats.dropped or stats.offloaded or stats.summary_used)
        # Messages of the caller's own: the plan and its entries are kept for the next view
        # (:meth:`_grow`), and callers mark up what they send (cache_control on the last block).
        # The copy made ahead while the pod waited (:func:`_make_ready`), if there is one.
        nested = plan.nested
        if nested is None:
            nested = plan.nested = nested_positions(plan.messages)
        messages, plan.ready = plan.ready, None
        if messages is None:
            messages = caller_copy(plan.messages, nested)
        return RequestView(messages, stats)


def _make_ready(plan: ViewPlan) -> None:
    """Make the caller's copy of a kept plan ahead, for the next view that grows it.

    Run by the event loop once the view has returned, while the pod waits
    (for the model, or for Redis): copying a view's messages is a tenth of a
    warm view's time, and the next view then copies only what is new. A
    copy is handed out once (:func:`~ctxstore._plan.growth.grow` takes it).
    """
    if plan.ready is None and plan.nested is not None:
        plan.ready = caller_copy(plan.messages, plan.nested)

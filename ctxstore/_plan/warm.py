"""A pod's copies of the views it served last, in a byte budget (:class:`WarmViews`).

A pod keeps, per session and budget, what its last view read (the counters
that validate it, the protected entries, the anchor, the entries from the
anchor's start on) and the plan it sent, so that its next view reads only
what is new (:mod:`ctxstore._parts.snapshot`). Every use is validated against Redis
in the same round trip that reads what is new.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ctxstore._layout.codec import Anchor, Entry
from ctxstore._layout.formats import entry_order
from ctxstore._plan.view import ViewPlan

__all__ = ["OWN_MOST", "READY_OVERHEAD", "WarmViews", "ahead_size", "held_size"]

_ENTRY_OVERHEAD = 160 + 300
"""Bytes a cached entry costs beside its data, for the byte budget: the object and its id
(some 160), and the message decoded from it (its dict and strings, some 300 beside the text,
counted again: the entries kept are those the view sent, which it decoded)."""

OWN_MOST = 256
"""The most entries a pod notes of its own appends to a session between two of its views."""

READY_OVERHEAD = 400
"""Bytes charged per message of a kept plan for the caller's copy made ahead: its dicts
and lists (the strings are shared); a message of content blocks costs more, plain text less."""


@dataclass(frozen=True, slots=True)
class _Warm:
    """What a pod keeps of its last view of a session, for one budget."""

    epoch: int
    life: bytes | None
    keep_version: bytes | None
    count: int
    protected: tuple[Entry, ...]
    anchor_raw: bytes | None
    anchor: Anchor | None
    tail: tuple[Entry, ...]
    complete: bool
    size: int
    plan: ViewPlan | None = None


class WarmViews:
    """The sessions a process viewed last, in a byte budget: the least recently used go first.

    Shared by every tenant's store on one connection (``for_tenant``); keyed by
    tenant, session and budget. Only ever a shortcut: every use is validated
    against Redis in the same round trip that reads what is new.

    Args:
        limit: The most bytes of message data kept (``0``: nothing is kept).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._items: OrderedDict[tuple[str, str, int], _Warm] = OrderedDict()
        self._sizes: dict[tuple[str, str], set[int]] = {}
        self._own: dict[tuple[str, str], _Own] = {}  # for sessions with copies only

    def __len__(self) -> int:
        return len(self._items)

    def get(self, tenant: str, session: str, size: int) -> _Warm | None:
        """The copy kept for this view, marked as just used, or ``None``."""
        key = (tenant, session, size)
        warm = self._items.get(key)
        if warm is not None:
            self._items.move_to_end(key)
        return warm

    def put(self, tenant: str, session: str, size: int, warm: _Warm) -> bool:
        """Keep ``warm``; the least recently used go until the rest fits. True if kept.

        A copy over a quarter of the budget is not kept.
        """
        self._drop(tenant, session, size, own=False)  # what it appended meanwhile stays noted
        if warm.size > self.limit // 4:
            if (tenant, session) not in self._sizes:
                self._forget_own(tenant, session)
            return False
        key = (tenant, session, size)
        self._items[key] = warm
        self._sizes.setdefault((tenant, session), set()).add(size)
        self.bytes += warm.size
        self._prune_own(tenant, session, size)
        self._evict()
        return key in self._items

    def holds(self, tenant: str, session: str) -> bool:
        """True if a copy of ``session`` is kept (for any budget)."""
        return (tenant, session) in self._sizes

    def add_own(self, tenant: str, session: str, epoch: int, entries: Sequence[Entry]) -> None:
        """Note entries this pod appended to ``session``: its next view need not read them.

        Only for a session it keeps a copy of in the same ``epoch``, and up to
        :data:`OWN_MOST` entries and a quarter of the byte budget (as a copy)
        between two views: past that, the next view reads them all from Redis.
        """
        key = (tenant, session)
        copy = next((w for w in self._copies(key) if w.epoch == epoch), None)
        if copy is None or not entries:
            return
        own = self._own.get(key)
        if own is None or own.life != (epoch, copy.life):
            self._forget_own(tenant, session)  # none, or noted in another life
            own = self._own[key] = _Own((epoch, copy.life))
        if own.entries is None:
            return
        size = own.size + held_size(entries)
        if len(own.entries) + len(entries) > OWN_MOST or size > self.limit // 4:
            self.bytes -= own.size
            own.entries, own.size = None, 0
            return
        ordered = not own.entries or entry_order(own.entries[-1].entry_id) < entry_order(
            entries[0].entry_id
        )
        own.entries.extend(entries)
        if not ordered:  # two tasks appended at once
            own.entries.sort(key=lambda e: entry_order(e.entry_id))
        self.bytes += size - own.size
        own.size = size
        self._evict()

    def own_after(self, tenant: str, session: str, last: str | None) -> list[Entry] | None:
        """What this pod appended to ``session`` after entry ``last`` (None: any), oldest first.

        ``None`` when it no longer follows them (see :meth:`add_own`); a copy of the list,
        as appends go on meanwhile.
        """
        own = self._own.get((tenant, session))
        if own is None or own.entries is None:
            return None if own else []
        after = entry_order(last) if last is not None else (-1, -1)
        return [e for e in own.entries if entry_order(e.entry_id) > after]

    def _copies(self, key: tuple[str, str]) -> list[_Warm]:
        return [self._items[(*key, size)] for size in self._sizes.get(key, ())]

    def _prune_own(self, tenant: str, session: str, size: int) -> None:
        """Drop what every copy of ``session`` holds already; follow it again if it was not."""
        own = self._own.get((tenant, session))
        if own is None:
            return
        warm = self._items[(tenant, session, size)]
        if own.life != (warm.epoch, warm.life):
            self._forget_own(tenant, session)  # noted in another life of the session
        elif own.entries is None:
            own.entries = []
        elif own.entries:
            copies = self._copies((tenant, session))
            held = min(entry_order(w.tail[-1].entry_id) if w.tail else (0, 0) for w in copies)
            kept = [e for e in own.entries if entry_order(e.entry_id) > held]
            if len(kept) < len(own.entries):
                size = held_size(kept)
                self.bytes -= own.size - size
                own.entries, own.size = kept, size

    def _evict(self) -> None:
        """Forget the least recently used copies until what is kept fits the budget."""
        while self.bytes > self.limit and self._items:
            old_tenant, old_session, old_size = next(iter(self._items))
            self.discard(old_tenant, old_session, old_size)

    def any(self, tenant: str, session: str) -> _Warm | None:
        """One of the copies kept of this session, whatever its budget, or ``None``."""
        sizes = self._sizes.get((tenant, session))
        return self._items.get((tenant, session, next(iter(sizes)))) if sizes else None

    def discard(self, tenant: str, session: str, size: int | None = None) -> None:
        """Forget one view of a session, or (``size`` None) every view of it."""
        self._drop(tenant, session, size)

    def _drop(self, tenant: str, session: str, size: int | None, *, own: bool = True) -> None:
        """:meth:`discard`; ``own``: with the last copy, what the pod appended goes too."""
        sizes = self._sizes.get((tenant, session))
        if not sizes:
            return
        for each in [size] if size is not None else list(sizes):
            warm = self._items.pop((tenant, session, each), None)
            if warm is not None:
                self.bytes -= warm.size
                sizes.discard(each)
        if not sizes:
            del self._sizes[(tenant, session)]
            if own:
                self._forget_own(tenant, session)

    def _forget_own(self, tenant: str, session: str) -> None:
        own = self._own.pop((tenant, session), None)
        if own is not None:
            self.bytes -= own.size

    def discard_tenant(self, tenant: str) -> None:
        """Forget every view of a tenant's sessions."""
        for owner, session in [k for k in self._sizes if k[0] == tenant]:
            self.discard(owner, session)


@dataclass(slots=True)
class _Own:
    """What a pod appended to a session it keeps copies of, since (some of) them were read."""

    life: tuple[int, bytes | None]
    """The epoch and life they were appended in: a copy of another drops them (a session
    deleted and written again within a millisecond may give its ids again)."""
    entries: list[Entry] | None = field(default_factory=list)
    """Oldest first; ``None``: past the caps, not followed until the session's next view."""
    size: int = 0
    """What they are charged in the byte budget."""


def held_size(entries: Sequence[Entry]) -> int:
    """What keeping ``entries`` costs a pod's byte budget (:class:`WarmViews`)."""
    return sum(2 * len(e.data) + len(e.preview_data or b"") + _ENTRY_OVERHEAD for e in entries)


def ahead_size(plan: ViewPlan | None) -> int:
    """What the caller's copy of ``plan`` made ahead costs a pod's byte budget.

    Made only for a plan the next view may grow (``plan.growth``).
    """
    if plan is None or plan.growth is None:
        return 0
    return len(plan.messages) * READY_OVERHEAD

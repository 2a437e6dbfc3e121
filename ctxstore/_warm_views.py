"""A pod's copies of the views it served last, in a byte budget (:class:`WarmViews`).

A pod keeps, per session and budget, what its last view read (the counters
that validate it, the protected entries, the anchor, the entries from the
anchor's start on) and the plan it sent, so that its next view reads only
what is new (:mod:`ctxstore.anchor`). Every use is validated against Redis
in the same round trip that reads what is new.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ctxstore._codec import Anchor, Entry
from ctxstore.view import ViewPlan

__all__ = ["READY_OVERHEAD", "WarmViews", "ahead_size", "held_size"]

_ENTRY_OVERHEAD = 160 + 300
"""Bytes a cached entry costs beside its data, for the byte budget: the object and its id
(some 160), and the message decoded from it (its dict and strings, some 300 beside the text,
counted again: the entries kept are those the view sent, which it decoded)."""

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
        self.discard(tenant, session, size)
        if warm.size > self.limit // 4:
            return False
        key = (tenant, session, size)
        self._items[key] = warm
        self._sizes.setdefault((tenant, session), set()).add(size)
        self.bytes += warm.size
        while self.bytes > self.limit:
            old_tenant, old_session, old_size = next(iter(self._items))
            self.discard(old_tenant, old_session, old_size)
        return key in self._items

    def any(self, tenant: str, session: str) -> _Warm | None:
        """One of the copies kept of this session, whatever its budget, or ``None``."""
        sizes = self._sizes.get((tenant, session))
        return self._items.get((tenant, session, next(iter(sizes)))) if sizes else None

    def discard(self, tenant: str, session: str, size: int | None = None) -> None:
        """Forget one view of a session, or (``size`` None) every view of it."""
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

    def discard_tenant(self, tenant: str) -> None:
        """Forget every view of a tenant's sessions."""
        for owner, session in [k for k in self._sizes if k[0] == tenant]:
            self.discard(owner, session)


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

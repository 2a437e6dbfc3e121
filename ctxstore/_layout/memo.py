"""A per-process memo with a bound on its size, least recently used out first.

The parts of a tenant's store (and its tenant index) remember a little per
session in the process (what its last view read, when its index entry was
last touched, how long its appends may take the lean form): each in a
:class:`Memo`, so that a process serving many sessions stays bounded.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["Memo"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_ABSENT = object()


class Memo(Generic[K, V]):
    """A per-process memo with a bound on its size: the least recently used entry goes first.

    A read or a write marks an entry as used (a dict keeps its keys in the order they
    went in, so an entry used is taken out and put back at the end).

    Args:
        limit: The most entries kept.
    """

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._items: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        """The value kept for ``key``, or ``None``."""
        items = self._items
        if key not in items:
            return None
        value = items[key] = items.pop(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` for ``key``, forgetting the least recently used entry when full."""
        items = self._items
        if items.pop(key, _ABSENT) is _ABSENT and len(items) >= self._limit:
            del items[next(iter(items))]
        items[key] = value

    def discard(self, key: K) -> None:
        """Forget ``key``."""
        self._items.pop(key, None)

    def clear(self) -> None:
        """Forget everything."""
        self._items.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

"""Deterministic test doubles, for ctxstore's tests and for yours.

- :class:`ManualClock`: the time leases use, moved by hand, so a test can
  expire a lease without sleeping.
- :class:`WordCounter`: a token counter that counts words; fast, predictable.
"""

from __future__ import annotations

__all__ = ["ManualClock", "WordCounter"]


class ManualClock:
    """A clock that moves only when told to.

    Args:
        start_ms: The time it starts at, in milliseconds since the epoch.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        """The current (manual) time in milliseconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self._now += int(seconds * 1000)


class WordCounter:
    """Counts whitespace-separated words as tokens."""

    def count(self, text: str) -> int:
        """The number of words in ``text``."""
        return len(text.split())

"""Deterministic test doubles and checks, for ctxstore's tests and for yours.

- :class:`ManualClock`: the time leases use, moved by hand, so a test can
  expire a lease without sleeping.
- :class:`WordCounter`: a token counter that counts words; fast, predictable.
- :class:`FakeSummarizer`: a deterministic summarizer that records its
  calls, and can be made to wait (for a test to act mid-job) or to fail.
- :func:`audit`: checks a session's history against what its writers were
  told (nothing lost, nothing doubled, each writer's order kept).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxstore.policies import entry_order

if TYPE_CHECKING:
    from ctxstore.models import WriteResult
    from ctxstore.store import ContextStore

__all__ = ["Ack", "Audit", "FakeSummarizer", "ManualClock", "WordCounter", "audit"]


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


class FakeSummarizer:
    """A summarizer for tests: deterministic output, recorded calls, scripted trouble.

    Its summary lists, for every message it saw, the role and the first
    words, after the previous summary's lines: a test can check exactly
    which messages a summary covers.

    Args:
        fail: Errors to raise, one per call, before it starts succeeding
            (e.g. ``[SummarizerUnavailableError("429")]``).
        gate: If given, each call waits for this event (a test acts mid-job).
        name: The model name it reports.

    Attributes:
        calls: ``(previous, messages)`` of every call, in order.
        started: Set when a call begins (before it waits on ``gate``).
    """

    def __init__(
        self,
        *,
        fail: Iterable[BaseException] = (),
        gate: asyncio.Event | None = None,
        name: str = "fake",
    ) -> None:
        self.name = name
        self.calls: list[tuple[str | None, list[dict[str, Any]]]] = []
        self.started = asyncio.Event()
        self._fail = list(fail)
        self._gate = gate

    async def summarize(
        self, previous: str | None, messages: Sequence[dict[str, Any]], *, max_tokens: int
    ) -> str:
        """Return a line per message after the previous summary's lines."""
        self.calls.append((previous, list(messages)))
        self.started.set()
        if self._gate is not None:
            await self._gate.wait()
        if self._fail:
            raise self._fail.pop(0)
        lines = [previous] if previous else []
        for message in messages:
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            lines.append(f"{message.get('role')}: {' '.join(str(text).split()[:6])}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Ack:
    """An append the store acknowledged, as a writer recorded it.

    Attributes:
        writer: Who appended it.
        index: Its position in that writer's own sequence.
        entry_id: The entry id the store answered.
        epoch: The epoch the store answered.
    """

    writer: Hashable
    index: int
    entry_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Audit:
    """What :func:`audit` found; all zero when the session is sound.

    Attributes:
        lost: Acknowledged appends neither in the history nor superseded by a rewrite.
        duplicated: Messages stored more than once.
        out_of_order: Consecutive appends of one writer stored in the other order.
        checked: Acknowledged appends checked.
    """

    lost: int
    duplicated: int
    out_of_order: int
    checked: int


async def audit(
    store: ContextStore,
    session: str,
    acks: Iterable[Ack],
    rewrites: Iterable[WriteResult] = (),
    key_of: Callable[[dict[str, Any]], tuple[Hashable, int] | None] = lambda m: None,
) -> Audit:
    """Check a session's history against what writers were told.

    An append acknowledged in the current epoch must be in the history, once,
    under the entry id it was given; one acknowledged in an earlier epoch
    must be counted in the ``superseded`` of the rewrite that ended that
    epoch (so: every message that epoch's rewrite wrote, plus every append
    acknowledged in it). Each writer's appends must be stored in its order.

    Args:
        store: The store.
        session: The session.
        acks: Every acknowledged append.
        rewrites: Every replace and clear of the session, in any order.
        key_of: ``(writer, index)`` of a stored message, or ``None`` for
            messages no writer appended (a rewrite's).
    """
    acks = list(acks)
    stored = [s async for s in store.iter_history(session)]
    epoch = (await store.info(session)).epoch
    seen: dict[tuple[Hashable, int], list[str]] = {}
    for message in stored:
        key = key_of(message.message)
        if key is not None:
            seen.setdefault(key, []).append(message.entry_id)
    duplicated = sum(len(ids) - 1 for ids in seen.values())
    lost = sum(
        1
        for a in acks
        if a.epoch == epoch and seen.get((a.writer, a.index), [None])[0] != a.entry_id
    )
    written = {0: 0} | {r.epoch: r.count for r in rewrites}
    superseded = {r.epoch: r.superseded for r in rewrites}
    per_epoch = Counter(a.epoch for a in acks)
    for old in range(epoch):
        expected = written.get(old, 0) + per_epoch[old]
        lost += max(0, expected - superseded.get(old + 1, expected))
    out_of_order = 0
    by_writer: dict[tuple[Hashable, int], list[Ack]] = {}
    for a in acks:
        by_writer.setdefault((a.writer, a.epoch), []).append(a)
    for mine in by_writer.values():
        mine.sort(key=lambda a: a.index)
        out_of_order += sum(
            1
            for x, y in itertools.pairwise(mine)
            if entry_order(x.entry_id) >= entry_order(y.entry_id)
        )
    return Audit(lost, duplicated, out_of_order, len(acks))

"""Call deadlines: every call in flight bounded by ``operation_timeout``, under one timer.

A call to Redis may hang (a dead node, a partition): each one is cancelled at
its deadline, and sees :class:`TimeoutError` as under ``asyncio.timeout``,
which the retry policy treats as transient. One timer serves every call of a
client, instead of one armed and cancelled per call.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

__all__ = ["Deadlines"]


class Deadlines:
    """The deadline of each call in flight, kept by one timer instead of one per call.

    ``asyncio.timeout`` arms a timer and cancels it on every call: 4-5 us, a
    tenth of a warm view's Python. Every call of a connection has the same
    deadline (``operation_timeout``), so the calls in flight expire in the
    order they started: one timer, set for the oldest, cancels the task of
    each call past its deadline and is set again for the next. A call sees
    what ``asyncio.timeout`` gives: :class:`TimeoutError` when only its
    deadline cancelled it, the cancellation when its task was also cancelled
    from outside. Shared by every tenant's connection on one event loop (each loop has
    its own: :mod:`ctxstore._redis.loops`).
    """

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._calls: dict[int, tuple[asyncio.Task[Any], float]] = {}
        self._expired: set[int] = set()
        self._tokens = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> tuple[int, asyncio.Task[Any]]:
        """Start the deadline of a call of the current task: its token, and the task."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a Redis call must run in a task")
        token = next(self._tokens)
        when = loop.time() + self._seconds
        self._calls[token] = (task, when)
        if self._timer is None:
            self._timer = loop.call_at(when, self._expire, loop)
        return token, task

    def stop(self, token: int) -> bool:
        """End a call's deadline (once, or again: a no-op); True if it had expired."""
        self._calls.pop(token, None)
        if token in self._expired:
            self._expired.discard(token)
            return True
        return False

    def close(self) -> None:
        """Stop the timer (the calls still in flight keep no deadline)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        calls = self._calls
        while calls:
            token = next(iter(calls))  # the oldest: the first to expire
            task, when = calls[token]
            if when > now:
                self._timer = loop.call_at(when, self._expire, loop)
                return
            del calls[token]
            self._expired.add(token)
            task.cancel()

"""Concurrent calls to one Redis node, sent together: one write, one connection.

A pod serving many agents has many calls in flight at once. Sent each on a
connection of its own, each costs the Redis server a wake-up, a read and a write
of its own: on this project's machine 50 appends sent together cost Redis some
43 us more each that way than in one pipeline, more than the append itself (see
the README's "Many calls at once"). redis-py has no automatic pipelining, so a
pod does it here, as StackExchange.Redis and ioredis's ``enableAutoPipelining``
do for their users.

A call that finds no other call in flight to its node goes at once, as before:
a lone call waits for nothing. One that finds another in flight joins the batch
that node is gathering; the batch is sent at the event loop's next turn (after
every call already made ready to run has joined it), on one connection, and
each call takes its own replies from the batch's. The batch's calls run in
Redis one after another, each whole (a script, a MULTI/EXEC): batching changes
the round trips, not what any call does.

What a batch does not change for its calls:

- **Errors are each call's own.** An error reply belongs to the command that
  got it. A connection lost mid-batch fails every call of the batch with it,
  and each retries as a lone call would (appends keep their idempotency keys).
- **Deadlines and cancellation are each call's own.** A call cancelled, or past
  its deadline, stops waiting; the batch is still read to its end, so the
  connection stays clean for the next batch. Once no call waits on it, the
  batch is dropped and its connection closed, as a lone call's is.
- **No call blocks another.** A call that holds its connection (``WAIT`` for
  replicas) goes alone; a batch holds at most ``coalesce_calls`` calls, and the
  next calls start another.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

from redis import exceptions as rex

__all__ = ["Coalescer"]

Command = tuple[Any, ...]
Send = Callable[[str, list[Command]], Awaitable[list[Any]]]

_ALONE = frozenset({b"WAIT", "WAIT", b"WAITAOF", "WAITAOF"})
"""Commands that hold their connection until something else happens: sent alone."""


class _Batch:
    """The calls gathered for one node: each one's commands and the future of its replies."""

    __slots__ = ("calls", "key", "task")

    def __init__(self, key: str) -> None:
        self.key = key  # the first call's key: which node, in a cluster
        self.calls: list[tuple[list[Command], asyncio.Future[list[Any]]]] = []
        self.task: asyncio.Task[None] | None = None

    def waited(self) -> bool:
        """Some call still waits on the batch's replies."""
        return any(not future.done() for _, future in self.calls)


class Coalescer:
    """Sends concurrent calls to one node as one batch (see the module's docstring).

    Shared by every tenant's connection on one client (the same connections).

    Args:
        most: The most calls in one batch; 0 sends every call alone.
    """

    def __init__(self, most: int) -> None:
        self._most = most
        self._in_flight: dict[str, int] = {}  # per node: lone calls and batches on the wire
        self._gathering: dict[str, _Batch] = {}  # per node: the batch not sent yet
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def send(
        self, node: str | None, key: str, commands: list[Command], lone: Send
    ) -> list[Any]:
        """``commands``' replies, sent by ``lone`` alone or in a batch with others to ``node``.

        ``node`` names the node that owns ``key`` (``None``: unknown, sent alone);
        ``lone(key, commands)`` sends commands on one connection and reads every reply
        (an error reply as its exception object), closing the connection on any failure.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (asyncio.run again): the old one is done
            self._in_flight.clear()
            self._gathering.clear()
            self._tasks.clear()
            self._loop = loop
        if node is None or self._most <= 0 or not self._in_flight.get(node) or _holds(commands):
            self._in_flight[node or ""] = self._in_flight.get(node or "", 0) + 1
            try:
                return await lone(key, commands)
            finally:
                self._landed(node or "")
        batch = self._gathering.get(node)
        if batch is None or len(batch.calls) >= self._most:
            batch = _Batch(key)
            self._gathering[node] = batch
            loop.call_soon(self._start, node, batch, lone)
        future: asyncio.Future[list[Any]] = loop.create_future()
        batch.calls.append((commands, future))
        try:
            return await future
        except asyncio.CancelledError:
            if batch.task is not None and not batch.waited():
                batch.task.cancel()  # nobody reads its replies: its connection is closed
            raise

    def _start(self, node: str, batch: _Batch, lone: Send) -> None:
        """Send the batch gathered for ``node`` (the event loop's next turn)."""
        if self._gathering.get(node) is batch:
            del self._gathering[node]
        if not batch.waited():
            return
        task = asyncio.get_running_loop().create_task(self._flush(node, batch, lone))
        batch.task = task
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, node: str, batch: _Batch, lone: Send) -> None:
        """Send every call of ``batch`` in one write, and hand each its replies."""
        calls = [(commands, future) for commands, future in batch.calls if not future.done()]
        flat = [command for commands, _ in calls for command in commands]
        self._in_flight[node] = self._in_flight.get(node, 0) + 1
        try:
            replies = await lone(batch.key, flat)
        except asyncio.CancelledError:
            _fail(calls, rex.ConnectionError("the batch was cancelled before its replies came"))
            raise
        except BaseException as exc:  # noqa: BLE001 - each call is given it, to retry or raise
            _fail(calls, exc)
            return
        finally:
            self._landed(node)
        start = 0
        for commands, future in calls:
            end = start + len(commands)
            if not future.done():
                future.set_result(replies[start:end])
            start = end

    def _landed(self, node: str) -> None:
        """A lone call or a batch to ``node`` is off the wire."""
        left = self._in_flight.get(node, 0) - 1
        if left > 0:
            self._in_flight[node] = left
        else:
            self._in_flight.pop(node, None)

    async def aclose(self) -> None:
        """Cancel the batches in flight (their calls fail, as on a closed connection)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _holds(commands: list[Command]) -> bool:
    """Some command holds its connection after its reply is due (sent alone)."""
    return any(command[0] in _ALONE for command in commands)


def _fail(calls: list[tuple[list[Command], asyncio.Future[list[Any]]]], exc: BaseException) -> None:
    """Fail each call still waiting with its own copy of ``exc`` (each raises and chains it)."""
    for _, future in calls:
        if not future.done():
            try:
                own = copy.copy(exc)
            except Exception:  # noqa: BLE001 - an error that cannot be copied is shared
                own = exc
            future.set_exception(own)

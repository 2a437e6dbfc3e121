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
Commands = list[Command] | Callable[[], list[Command]]
Send = Callable[[str, Commands], Awaitable[list[Any]]]
"""How a node's commands are sent: ``send(key, commands)`` sends them on one connection of
``key``'s node and reads every reply (an error reply as its exception object), closing the
connection on any failure. ``commands`` may be a function, called once the connection is
in hand (a batch's calls cancelled while it waited for one are not sent); ``[]`` sends
nothing."""

_ALONE = frozenset({b"WAIT", "WAIT", b"WAITAOF", "WAITAOF"})
"""Commands that hold their connection until something else happens: sent alone."""

_Call = tuple[str, list[Command], "asyncio.Future[list[Any]]"]


class _Batch:
    """The calls gathered for one node: each one's key, commands and future of its replies."""

    __slots__ = ("calls", "key", "task")

    def __init__(self, key: str) -> None:
        self.key = key  # the first call's key: which node, in a cluster
        self.calls: list[_Call] = []
        self.task: asyncio.Task[None] | None = None

    def waiting(self) -> list[_Call]:
        """The calls that still wait on the batch's replies."""
        return [call for call in self.calls if not call[2].done()]

    def fail(self, exc: BaseException) -> None:
        """Fail each call still waiting with its own copy of ``exc`` (each raises and chains it)."""
        for _, _, future in self.waiting():
            try:
                own = copy.copy(exc)
            except Exception:  # noqa: BLE001 - an error that cannot be copied is shared
                own = exc
            future.set_exception(own)


class Coalescer:
    """Sends concurrent calls to one node as one batch (see the module's docstring).

    Shared by every tenant's connection on one event loop (the same connections); each
    loop has its own (:mod:`ctxstore._redis.loops`).

    Args:
        most: The most calls in one batch; 0 sends every call alone.
    """

    def __init__(self, most: int) -> None:
        self._most = most
        self._in_flight: dict[str, int] = {}  # per node: lone calls and batches on the wire
        self._gathering: dict[str, _Batch] = {}  # per node: the batch not sent yet
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(
        self, node: str | None, key: str, commands: list[Command], lone: Send
    ) -> list[Any]:
        """``commands``' replies, sent by ``lone`` alone or in a batch with others to ``node``.

        ``node`` names the node that owns ``key`` (``None``: unknown, sent alone).
        """
        loop = asyncio.get_running_loop()
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
        batch.calls.append((key, commands, future))
        try:
            return await future
        except asyncio.CancelledError:
            if batch.task is not None and not batch.waiting():
                batch.task.cancel()  # nobody reads its replies: its connection is closed
            raise

    def _start(self, node: str, batch: _Batch, lone: Send) -> None:
        """Send the batch gathered for ``node`` (the event loop's next turn)."""
        if self._gathering.get(node) is batch:
            del self._gathering[node]
        if not batch.waiting():
            return
        task = asyncio.get_running_loop().create_task(self._flush(node, batch, lone))
        batch.task = task
        self._tasks.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)
        # However the task ends (cancelled before its first step too), no call waits on.
        task.add_done_callback(
            lambda _: batch.fail(rex.ConnectionError("the batch ended before its replies came"))
        )

    async def _flush(self, node: str, batch: _Batch, lone: Send) -> None:
        """Send the calls of ``batch`` still waiting in one write, and hand each its replies."""
        sent: list[_Call] = []

        def commands() -> list[Command]:  # once the connection is in hand
            sent[:] = batch.waiting()
            return [command for _, call_commands, _ in sent for command in call_commands]

        self._in_flight[node] = self._in_flight.get(node, 0) + 1
        try:
            replies = await lone(batch.key, commands)
        except (rex.RedisError, OSError) as exc:
            batch.fail(exc)  # a connection lost or refused: each call retries on its own
            return
        except Exception:  # noqa: BLE001 - not the server's answer: each call goes alone
            await self._alone(batch, lone)
            return
        finally:
            self._landed(node)
        start = 0
        for _, call_commands, future in sent:
            end = start + len(call_commands)
            if not future.done():
                future.set_result(replies[start:end])
            start = end

    async def _alone(self, batch: _Batch, lone: Send) -> None:
        """Send each call of ``batch`` still waiting alone, as if it had found none in flight.

        For a batch that failed before it was sent, with no word from the server (a
        command that cannot be packed): each call fails, or not, as it would have
        alone, not every call for one command (once sent, a failure is a lost
        connection's: see ``Connection._send``).
        """

        async def one(key: str, commands: list[Command], future: asyncio.Future[list[Any]]) -> None:
            try:
                replies = await lone(key, commands)
            except Exception as exc:  # noqa: BLE001 - the call's own error, raised by the call
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(replies)

        await asyncio.gather(*(one(*call) for call in batch.waiting()))

    def _landed(self, node: str) -> None:
        """A lone call or a batch to ``node`` is off the wire."""
        left = self._in_flight.get(node, 0) - 1
        if left > 0:
            self._in_flight[node] = left
        else:
            self._in_flight.pop(node, None)

    async def aclose(self) -> None:
        """End every batch: those gathering and those in flight fail their calls.

        As on a closed connection: each call's error is a connection error.
        """
        closed = rex.ConnectionError("the store was closed before the call's replies came")
        for batch in self._gathering.values():
            batch.fail(closed)
        self._gathering.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()  # its done callback fails its calls, started or not
        await asyncio.gather(*tasks, return_exceptions=True)


def _holds(commands: list[Command]) -> bool:
    """Some command holds its connection after its reply is due (sent alone)."""
    return any(command[0] in _ALONE for command in commands)

"""Each event loop's own side of a store's Redis client: its client, deadlines and batches.

What a redis-py asyncio client holds belongs to the event loop it was first used
on: its sockets (asyncio streams), its pool's Condition and Lock. So do the store's
own call deadlines (a timer), the batches in flight (futures) and the retries'
waits. A store is called from whatever loop its caller runs: an application's,
``Runner.run_sync``'s in a thread while the application's loop lives, one
``asyncio.run`` per request, several threads' loops at once. So each event loop
that calls gets a :class:`Local` of its own, made at its first call (no I/O): a
client like the store's first one, and the state beside it. :class:`Loops` keeps
them, one per loop, for every tenant's connection of a client; nothing of one loop
is ever used from another.

- A loop that has closed leaves its sockets open: the next loop that makes its
  Local closes them (its own loop no longer can), and forgets it.
- ``aclose`` closes every loop's: its own at once; one running in another thread,
  on that loop (waited for up to ``operation_timeout``); one ended, or idle, here.
- A client a caller built that cannot be copied (a cluster or Sentinel client of
  their own) serves one loop at a time: the next loop takes it over once the last
  one has ended, and a call from a second loop while the first lives is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from redis.asyncio import RedisCluster

from ctxstore._redis.client import copier
from ctxstore._redis.coalescer import Coalescer
from ctxstore._redis.deadlines import Deadlines
from ctxstore._redis.pool import Pool, connections_of, drop_stale
from ctxstore.errors import ConfigurationError
from ctxstore.settings import Settings

__all__ = ["Local", "Loops", "wake"]

log = logging.getLogger("ctxstore")


def wake(waiting: asyncio.Future[None]) -> None:
    """End a wait (a call's retry backoff), once."""
    if not waiting.done():
        waiting.set_result(None)


class Local:
    """What one event loop's calls use: its client, and the state that lives on its loop.

    Attributes:
        loop: The event loop.
        client: Its redis-py client (standalone or cluster).
        pool: The client's pool when it is the store's own (:class:`Pool`), else None.
        deadlines: Its calls' deadlines, under one timer of this loop.
        coalescer: Its calls in flight together, batched per node.
        topology: One cluster topology read at a time (redis-py's is not safe to run
            concurrently), and when the last one ended (``read_at``, this loop's time).
        backing_off: Its calls waiting to retry, woken at the close.
    """

    __slots__ = (
        "backing_off",
        "client",
        "coalescer",
        "deadlines",
        "loop",
        "pool",
        "read_at",
        "topology",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, client: Any, settings: Settings) -> None:
        self.loop = loop
        self.client = client
        cluster = isinstance(client, RedisCluster)
        pool = None if cluster else getattr(client, "connection_pool", None)
        self.pool: Pool | None = pool if isinstance(pool, Pool) else None
        self.deadlines = Deadlines(settings.operation_timeout)
        self.coalescer = Coalescer(settings.coalesce_calls)
        self.topology = asyncio.Lock()
        self.read_at = float("-inf")
        self.backing_off: set[asyncio.Future[None]] = set()

    async def aclose(self) -> None:
        """Close it, on its own loop: its waits end, its batches fail, its sockets close."""
        for woken in list(self.backing_off):
            wake(woken)
        self.deadlines.close()
        await self.coalescer.aclose()
        for connection in connections_of(self.client):  # a taken-over client's, of a loop ended
            drop_stale(connection)
        await self.client.aclose()

    def drop(self) -> None:
        """Close the sockets its loop left, from anywhere: that loop has ended, or is idle.

        The client may serve another loop after (its connections connect anew).
        """
        for connection in connections_of(self.client):
            drop_stale(connection, idle=True)
        if isinstance(self.client, RedisCluster):
            # What its aclose would mark, past closing what it held: nothing is left open (it
            # warns when collected otherwise), and it reads the topology anew if used again.
            self.client._initialize = True


class Loops:
    """The :class:`Local` of each event loop that calls, for every tenant's connection of a client.

    Args:
        client: The first client: the first loop's.
        settings: Deadlines and batch sizes.
        copy: Makes another client like ``client`` for another loop; by default a copy
            of its pool (:func:`ctxstore._redis.client.copier`), where it can be made.
    """

    def __init__(
        self, client: Any, settings: Settings, copy: Callable[[], Any] | None = None
    ) -> None:
        self.first = client
        self._settings = settings
        self._copy = copy if copy is not None else copier(client)
        self._locals: dict[asyncio.AbstractEventLoop, Local] = {}
        self._last: Local | None = None  # the last one asked for: most calls' loop
        self._mutex = threading.Lock()  # loops of several threads start at once
        self._first_used = False

    def here(self) -> Local:
        """The running loop's :class:`Local`, made at its first call.

        Raises:
            RuntimeError: No event loop runs in this thread.
            ConfigurationError: The client cannot be copied, and another loop that
                lives uses it.
        """
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last.loop is loop:
            return last
        local = self._locals.get(loop)
        if local is None:
            local = self._start(loop)
        self._last = local
        return local

    def client(self) -> Any:
        """The running loop's client; outside a loop, the first client."""
        try:
            return self.here().client
        except RuntimeError:
            return self.first

    def _start(self, loop: asyncio.AbstractEventLoop) -> Local:
        """Make ``loop``'s Local; forget those of loops that have ended, closing their sockets."""
        with self._mutex:
            local = self._locals.get(loop)
            if local is not None:
                return local
            for ended in [known for known in self._locals.values() if known.loop.is_closed()]:
                del self._locals[ended.loop]
                ended.drop()
            used = {id(known.client) for known in self._locals.values()}
            if id(self.first) not in used and (self._copy is None or not self._first_used):
                client = self.first  # the first loop's, or one it ended left for the next
            elif self._copy is not None:
                client = self._copy()
            else:
                raise ConfigurationError(
                    "this store's Redis client was built by the caller and serves one event "
                    "loop at a time, and another loop that lives uses it: build the store with "
                    "ContextStore.from_url or from_settings to call it from several loops"
                )
            self._first_used = True
            local = self._locals[loop] = Local(loop, client, self._settings)
            return local

    async def aclose(self) -> None:
        """Close every loop's Local (see the module's docstring).

        They are kept, closed: the client a loop used is still the one it is given.
        """
        here = asyncio.get_running_loop()
        with self._mutex:
            known = list(self._locals.values())
        for local in known:  # a call of any loop that waits for a connection opens none
            if local.pool is not None:
                local.pool.closed = True
        elsewhere: list[concurrent.futures.Future[None]] = []
        own = None
        for local in known:
            if local.loop is here:
                own = local
            elif local.loop.is_running():
                elsewhere.append(_close_on_its_loop(local))
            else:
                local.drop()  # ended, or idle: nothing reads its sockets now
        if own is not None:
            await own.aclose()
        if elsewhere:
            waiting = [asyncio.wrap_future(done) for done in elsewhere]
            _, late = await asyncio.wait(waiting, timeout=self._settings.operation_timeout)
            for left in late:
                left.cancel()
            if late:
                log.warning("%d event loops did not close their connections in time", len(late))


def _close_on_its_loop(local: Local) -> concurrent.futures.Future[None]:
    """Close ``local`` on its own loop, running in another thread; done when it has."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def closed(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("an event loop's connections did not close: %r", task.exception())
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # it stopped waiting
            done.set_result(None)

    def start() -> None:
        local.loop.create_task(local.aclose()).add_done_callback(closed)

    try:
        local.loop.call_soon_threadsafe(start)
    except RuntimeError:  # it closed meanwhile
        local.drop()
        done.set_result(None)
    return done

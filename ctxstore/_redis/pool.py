"""The store's connection pool, and connections that pack commands with hiredis.

redis-py's bounded pool checks every connection it hands out, and takes its
condition lock to hand one out or take one back: :class:`Pool` skips both for
a connection known to be clean while nobody waits, which is most calls of a
warm store. A pool serves one event loop: each loop that calls a store gets a
pool of its own (:mod:`ctxstore._redis.loops`), and :func:`drop_stale` closes
the sockets a loop that has ended left. :data:`FAST` maps redis-py's
connection classes to ones that pack commands with hiredis, when it is
installed.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import weakref
from typing import Any, cast

from redis import exceptions as rex
from redis.asyncio import connection as rconn

hiredis: Any
try:
    import hiredis
except ImportError:  # redis-py runs without it, and so does ctxstore (packing is slower)
    hiredis = None

__all__ = ["FAST", "POOL_WANTS_A_NAME", "Pool", "connections_of", "drop_stale"]


class _HiredisPacking:
    """Packs commands with hiredis (C) instead of redis-py's pure-Python packer.

    A script call with a dozen arguments packs in ~1.4 us instead of ~10 us.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str) and " " in args[0]:
            # "CLIENT SETINFO"-style names: redis-py splits them; let it.
            return cast(list[bytes], super().pack_command(*args))  # type: ignore[misc]
        return [hiredis.pack_command(args)]


class _TcpConnection(_HiredisPacking, rconn.Connection):
    pass


class _SslConnection(_HiredisPacking, rconn.SSLConnection):
    pass


class _UnixConnection(_HiredisPacking, rconn.UnixDomainSocketConnection):
    pass


FAST: dict[type[Any], type[Any]] = (
    {
        rconn.Connection: _TcpConnection,
        rconn.SSLConnection: _SslConnection,
        rconn.UnixDomainSocketConnection: _UnixConnection,
    }
    if hiredis is not None
    else {}
)
"""redis-py's connection classes, each with its own that packs by hiredis (none without it)."""


class Pool(rconn.BlockingConnectionPool):
    """redis-py's bounded pool, minus the readiness check for connections known to be clean.

    Before it hands out a connection, redis-py tries a non-blocking read on it,
    in case a caller gave it back with a reply unread: 19 us a call with
    redis-py 5 (a timeout and the error it raises), a tenth of a warm view.
    :meth:`Connection.node_call` reads every reply it asks for and
    disconnects a connection on any error or cancellation, so one it gives
    back is clean: it is marked, and skips that check once, if nothing arrived
    on it since. A server that closed it while it sat idle (a restart, CLIENT
    KILL, its idle timeout, a proxy's reset) left an end of stream the event
    loop has already seen: that connection is checked, and reconnected, as
    before, instead of failing its next call. Whatever any other user of the
    pool (redis-py's own commands) gives back is checked.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closed = False  # its store was closed (Connection.aclose): nothing is connected
        self._clean: weakref.WeakSet[Any] = weakref.WeakSet()
        self._wakers: set[asyncio.Task[None]] = set()
        # take_idle works on redis-py's (and asyncio's) internals: without them, it never does.
        self._internals = (
            isinstance(getattr(self, "_available_connections", None), list)
            and isinstance(getattr(self, "_in_use_connections", None), set)
            and isinstance(getattr(self._condition, "_waiters", None), collections.deque)
        )

    def mark_clean(self, connection: Any) -> None:
        """``connection`` was given back with every reply read."""
        self._clean.add(connection)

    def take_idle(self) -> Any | None:
        """An idle connection given back clean and quiet since, at once; else ``None``.

        redis-py's hand-out takes the pool's condition lock, arms a timeout,
        and checks the connection: 15-20 us, a tenth of a warm view. None of it
        is needed to take a connection that is there, when nobody waits for
        one (a waiter goes first: this path is taken only while none waits).
        Whatever this declines goes the usual way.
        """
        if not self._internals or not self._available_connections or self._condition.locked():
            return None
        if self._condition._waiters:
            return None
        connection = self._available_connections[-1]  # the one redis-py would hand out
        if not self._still_clean(connection):
            return None
        self._available_connections.pop()
        self._in_use_connections.add(connection)
        self._clean.discard(connection)
        return connection

    def wake_next(self) -> None:
        """Pass a wake-up on to the next waiter: one waiting for a connection was cancelled.

        asyncio.Condition (Python 3.11) drops a notification whose waiter is
        cancelled before it runs: the connection given back for it would sit
        idle while the next waiter waits out its deadline. A spare wake-up
        costs a waiter one look at the pool (redis-py waits on a predicate).
        """
        if not self._internals or not self._condition._waiters:
            return
        task = asyncio.get_running_loop().create_task(self._notify())
        self._wakers.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._wakers.discard)

    async def _notify(self) -> None:
        async with self._condition:
            self._condition.notify()

    async def give_back(self, connection: Any) -> None:
        """Give a connection back, at once when it is clean and nobody waits for one.

        redis-py's return takes the pool's condition and lock, and dispatches
        an event (whose one listener re-authenticates a connection holding a
        new token from a streaming credential provider) and its own metrics:
        5 us with redis-py 8. None of it is needed to put back a connection
        given back clean, with no token pending, when nobody waits: a waiter
        must be woken, so then (and for any other connection) it goes
        redis-py's way.
        """
        if (
            self._internals
            and connection in self._clean
            and not self._condition.locked()
            and not self._condition._waiters
            and connection in self._in_use_connections
            and getattr(connection, "_re_auth_token", None) is None
            and not getattr(connection, "_should_reconnect", False)
        ):
            self._in_use_connections.remove(connection)
            self._available_connections.append(connection)
            return
        await self.release(connection)

    async def ensure_connection(self, connection: Any) -> None:
        if self.closed:  # a call that waited for this connection: it is not opened again
            raise rex.ConnectionError("not sent")
        clean = self._still_clean(connection)
        self._clean.discard(connection)  # a mark is good for one hand-out
        if not clean:
            await super().ensure_connection(connection)

    def _still_clean(self, connection: Any) -> bool:
        """Given back clean, still connected, and nothing arrived since.

        On this event loop: a pool serves one (:mod:`ctxstore._redis.loops`).
        """
        return connection in self._clean and connection.is_connected and _quiet(connection)


def _loop_of(connection: Any) -> asyncio.AbstractEventLoop | None:
    """The event loop ``connection``'s socket was opened on (None: not connected, or unknown)."""
    return getattr(getattr(connection, "_reader", None), "_loop", None)


def drop_stale(connection: Any, *, idle: bool = False) -> None:
    """Forget ``connection``'s socket if its event loop has ended; it connects anew when next used.

    An ``asyncio.run`` that ends leaves the pool's idle connections open on a closed
    loop: redis-py's ``disconnect`` raises ``RuntimeError`` on them, and so would any
    call. Their sockets are closed here, as that loop cannot (CPython's transport's
    ``_sock``; without it, the socket is left to the garbage collector).

    With ``idle``, also a socket whose loop lives but is not running (a store closed
    from another loop): it is taken off that loop's selector first, so that the loop,
    if it runs again, does not watch a closed descriptor (whose number a new socket of
    its may take).
    """
    loop = _loop_of(connection)
    if loop is None or loop.is_running() or not (idle or loop.is_closed()):
        return
    transport: Any = getattr(connection._writer, "transport", None)
    sock = getattr(transport, "_sock", None)
    if sock is not None:
        if not loop.is_closed():  # idle: its selector still watches the socket
            for name in ("_remove_reader", "_remove_writer"):
                unwatch = getattr(loop, name, None)
                if unwatch is not None:
                    unwatch(sock.fileno())
        # What the transport's close would do, but on a loop that runs (its finalizer,
        # and the stream writer's, then have nothing left to warn of).
        sock.close()
        transport._sock, transport._closing = None, True
    connection._parser.on_disconnect()
    connection._reader = connection._writer = None


def connections_of(client: Any) -> list[Any]:
    """Every connection ``client`` holds: its pool's, or each node's of a cluster."""
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
        return [conn for node in nodes for conn in getattr(node, "_connections", ())]
    pool = getattr(client, "connection_pool", None)
    return [
        *getattr(pool, "_available_connections", ()),
        *getattr(pool, "_in_use_connections", ()),
    ]


def _quiet(connection: Any) -> bool:
    """Nothing arrived on an idle connection: no bytes, no end of stream, no error.

    Reads the asyncio stream redis-py keeps (``_reader``), which the event loop
    feeds whether or not anyone awaits it: no system call, nothing raised.
    """
    reader = getattr(connection, "_reader", None)
    if not isinstance(reader, asyncio.StreamReader):
        return False
    buffered = getattr(reader, "_buffer", None)  # CPython's; without it, check as before
    return buffered is not None and not buffered and not reader.at_eof() and not reader.exception()


_NAMED = inspect.signature(rconn.ConnectionPool.get_connection).parameters.get("command_name")
POOL_WANTS_A_NAME = _NAMED is not None and _NAMED.default is inspect.Parameter.empty
"""redis-py 5.0-5.2 require a command name to hand out a connection; 5.3+ deprecate it."""

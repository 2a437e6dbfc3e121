"""The store's edge: one Redis client, retries, and error translation.

Every call to Redis goes through :class:`Connection`, which retries transient
connection errors (bounded, exponential backoff with full jitter), follows a
cluster's topology when a slot moved (a failover, a reshard), and turns
every redis-py error into a :mod:`ctxstore.errors` error chained with
``from`` (:mod:`ctxstore._redis.errors`). Calls are retried with the same
arguments, so an append keeps its idempotency key across retries.

Session keys share one hash tag, so all of a session's commands go to one
node: :meth:`Connection.node_call` sends a list of commands on one connection
of that node (standalone, or the cluster node that owns the slot), packed
with hiredis, and reads the raw replies (:mod:`ctxstore._redis.wire`). Scripts
(:mod:`ctxstore._redis.dispatch`), MULTI/EXEC snapshots and WAIT (which must
follow its write on the same connection) all go through it, so the same code
runs on one Redis and on Redis Cluster.

A connection serves every event loop and thread: each loop that calls uses a
client, deadlines and batches of its own (:mod:`ctxstore._redis.loops`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from redis import exceptions as rex
from redis.asyncio import RedisCluster

from ctxstore._layout.codec import text
from ctxstore._redis.coalescer import Coalescer
from ctxstore._redis.coalescer import Commands as CoalescedCommands
from ctxstore._redis.deadlines import Deadlines
from ctxstore._redis.dispatch import run_script
from ctxstore._redis.errors import TOPOLOGY, TRANSIENT, scrub, translate
from ctxstore._redis.loops import Local, Loops, wake
from ctxstore._redis.pool import POOL_WANTS_A_NAME, Pool, drop_stale
from ctxstore._redis.scripts import SCRIPTS, Script
from ctxstore._redis.wire import pack, read_replies
from ctxstore.errors import InvalidInputError, StoreClosedError
from ctxstore.settings import Settings

__all__ = ["Commands", "Connection"]

log = logging.getLogger("ctxstore")

T = TypeVar("T")

Commands = Sequence[tuple[Any, ...]]
"""Redis commands, each as its arguments."""

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


_ANSWERED = (rex.RedisError, OSError)
"""What a call sent may fail with and still be told apart: the server's error, a lost
connection (every other error once it is sent is reported as a lost connection)."""

_FREES = frozenset({"DEL", "UNLINK", "HDEL", "ZREM", "SREM", "XDEL", "ZREMRANGEBYSCORE"})
"""Commands that free memory and add none: on a full Redis, a transaction of these (and of
reads) goes outside MULTI, where it refuses every command queued."""


class _Shared:
    """A client's state shared by every tenant's connection, on every event loop.

    Each loop's client and state (:class:`~ctxstore._redis.loops.Loops`), when this
    version's Functions library was last found missing, and whether the client was
    closed: a store closed for good, so that no call in flight then, or made later,
    opens a connection again, which nothing would close.
    """

    def __init__(self, loops: Loops) -> None:
        self.closed = False
        self.loops = loops
        # script_mode=auto: scripts go by FCALL from this time on (monotonic seconds), by
        # EVALSHA before it; a missing library puts it FUNCTIONS_RECHECK_S ahead.
        self.fcall_from = float("-inf")
        self.functions_loading = False  # an embedded Redis is being given the library

    def fcall_due(self) -> bool:
        """``script_mode=auto``: whether the next script goes by FCALL."""
        return time.monotonic() >= self.fcall_from


class Connection:
    """A Redis client with ctxstore's retry and error policy.

    One per process and Redis: :meth:`for_tenant` gives each tenant's store
    the same clients and state, with the tenant named in its errors. Any
    event loop of any thread may call it: each loop gets a client of its own,
    like ``client`` (:mod:`ctxstore._redis.loops`).

    Args:
        client: The redis-py client (standalone or cluster): the first loop's.
        settings: Retry counts and delays.
        tenant: The tenant this connection works for, for error messages.
        embedded: The client is on the embedded Redis this SDK started (no URL), which
            ``script_mode=auto`` gives the Functions library itself.
        copy: Makes another client like ``client``, for another event loop; by default
            a copy of its pool, where one can be made.
    """

    def __init__(
        self,
        client: Any,
        settings: Settings,
        tenant: str | None = None,
        *,
        shared: _Shared | None = None,
        label: str = "Redis",
        embedded: bool = False,
        copy: Callable[[], Any] | None = None,
    ) -> None:
        self.cluster = isinstance(client, RedisCluster)
        self._settings = settings
        self._tenant = tenant
        self._shared = shared or _Shared(Loops(client, settings, copy))
        self._label = label
        self._embedded = embedded

    @property
    def settings(self) -> Settings:
        """The settings it was made with."""
        return self._settings

    @property
    def client(self) -> Any:
        """The running event loop's redis-py client (outside one: the first loop's)."""
        return self._shared.loops.client()

    @property
    def _pool(self) -> Pool | None:
        """The running loop's pool when it is the store's own (clean connections skip checks)."""
        return self._shared.loops.here().pool

    @property
    def _deadlines(self) -> Deadlines:
        """The running loop's call deadlines."""
        return self._shared.loops.here().deadlines

    @property
    def _coalescer(self) -> Coalescer:
        """The running loop's batches."""
        return self._shared.loops.here().coalescer

    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (on this or any tenant's connection of its client)."""
        return self._shared.closed

    def for_tenant(self, tenant: str) -> Connection:
        """The same client and topology state, naming ``tenant`` in errors."""
        return Connection(
            self._shared.loops.first,
            self._settings,
            tenant,
            shared=self._shared,
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
        if self.closed():
            raise StoreClosedError(
                "the store is closed", tenant=self._tenant, session=session, key=key
            )
        deadlines = self._shared.loops.here().deadlines
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
                            f"the store was closed during the call ({scrub(str(exc))})",
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
        local = self._shared.loops.here()
        woken: asyncio.Future[None] = local.loop.create_future()  # at the delay, or the close
        timer = local.loop.call_later(delay, wake, woken)
        local.backing_off.add(woken)
        try:
            await woken
        finally:
            timer.cancel()
            local.backing_off.discard(woken)
        if self.closed():  # while it waited
            return False
        if self.cluster and isinstance(exc, TOPOLOGY):
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
        (:mod:`ctxstore._redis.coalescer`).

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
        local = self._shared.loops.here()
        replies = await local.coalescer.send(
            self._node_of(key, local.client), key, sent, self._send
        )
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

    def _node_of(self, key: str, client: Any = None) -> str | None:
        """The name of the node that owns ``key`` ("" on one Redis); None if not known yet.

        ``client``: the running loop's, by default.
        """
        if not self.cluster:
            return ""
        if client is None:
            client = self.client
        if cast(RedisCluster, client)._initialize:
            return None
        node = client.get_node_from_key(key)
        return None if node is None else str(node.name)

    async def _send(self, key: str, commands: CoalescedCommands) -> list[Any]:
        """``commands`` on one connection of ``key``'s node, every reply read; raw replies.

        ``commands`` may be a function, called once the connection is in hand (a
        batch's calls cancelled while it waited are left out); ``[]`` sends nothing.
        """
        local = self._shared.loops.here()
        conn, release = await self._acquire(local, key)
        sending = False
        try:
            if self.closed():  # while it waited for the connection
                raise rex.ConnectionError("not sent")
            if callable(commands):
                commands = commands()
            if not commands:
                return []
            packed = pack(conn, commands)
            sending = True
            await conn.send_packed_command(packed, check_health=False)
            replies = await read_replies(conn, len(commands))
        except BaseException as exc:
            # A half-read reply must never reach the next user of this connection.
            await conn.disconnect()
            if sending and isinstance(exc, Exception) and not isinstance(exc, _ANSWERED):
                # Neither the server's answer nor a lost connection, yet the commands may
                # have run: reported as a lost connection, whose retry tells what they did
                # (an append's keeps its idempotency keys), never as a failed write.
                raise rex.ConnectionError(f"the call failed once sent ({exc!r})") from exc
            raise
        else:
            if self.closed():
                # While this call was on it: the close may have come before the
                # connection was made, so nothing else would close it.
                await conn.disconnect()
            elif local.pool is not None:
                local.pool.mark_clean(conn)
        finally:
            await release(conn)
        return replies

    async def _acquire(
        self, local: Local, key: str
    ) -> tuple[Any, Callable[[Any], Awaitable[None]]]:
        """A connection of ``local``'s client to ``key``'s node, and how to give it back."""
        if self.closed():  # nothing is opened again (a cluster client would read its slots)
            raise rex.ConnectionError("not sent")
        if not self.cluster:
            pool = local.client.connection_pool
            ours = local.pool  # None: a caller's own client, whose pool is redis-py's
            try:
                conn = ours.take_idle() if ours is not None else None
                if conn is None:
                    conn = await (
                        pool.get_connection("_") if POOL_WANTS_A_NAME else pool.get_connection()
                    )
            except asyncio.CancelledError:
                if ours is not None:
                    ours.wake_next()
                raise
            return conn, ours.give_back if ours is not None else pool.release
        client = cast(RedisCluster, local.client)
        if client._initialize:
            await client.initialize()
        node = client.get_node_from_key(key)
        if node is None:
            raise rex.ConnectionError(f"no node serves the slot of {key}")
        conn = node.acquire_connection()
        drop_stale(conn)  # opened under an event loop that has ended: connect anew

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
        local = self._shared.loops.here()
        started = local.loop.time()
        async with local.topology:
            if local.read_at >= started:
                return  # another task read it while this one waited
            await self._read_topology(local.client)
            local.read_at = local.loop.time()

    async def _read_topology(self, client: Any) -> None:
        manager = cast(RedisCluster, client).nodes_manager
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

        :func:`ctxstore._redis.dispatch.run_script` runs it, and says what each argument does.

        Raises:
            ReplicationError: Fewer replicas than asked acknowledged the write
                in time (the write is on the primary: retrying is safe).
        """
        return await run_script(
            self,
            script,
            keys,
            args,
            session=session,
            replicas=replicas,
            refused=refused,
            after=after,
            read_only=read_only,
        )

    async def pipeline(
        self, queue: Callable[[Any], None], *, session: str | None = None, key: str | None = None
    ) -> list[Any]:
        """Run the commands ``queue`` adds to a non-transactional pipeline (any slots)."""

        async def op() -> list[Any]:
            client = self._shared.loops.here().client
            pipe = client.pipeline(transaction=False)
            queue(pipe)
            try:
                return cast(list[Any], await pipe.execute())
            finally:
                if self.closed():  # redis-py's pipeline may have connected after the close
                    await client.aclose()

        return await self.call(op, session=session, key=key)

    async def aclose(self) -> None:
        """Close the clients' connections, every event loop's.

        For good: a call in flight then, or made later, fails with
        :class:`StoreClosedError` (a call in flight is not retried), and leaves no
        connection open.
        """
        self._shared.closed = True
        await self._shared.loops.aclose()

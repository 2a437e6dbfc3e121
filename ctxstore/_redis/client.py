"""The redis-py client a store talks through, made the same whatever redis-py's defaults.

One client per event loop and Redis, standalone or cluster (a client's sockets
are its loop's: :mod:`ctxstore._redis.loops`): RESP2, no socket timeouts and no
retries of redis-py's own (:class:`ctxstore._redis.connection.Connection`
bounds, retries and translates every call), and on one Redis the store's
bounded :class:`ctxstore._redis.pool.Pool`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio import connection as rconn

from ctxstore._redis.pool import FAST, Pool
from ctxstore.settings import Settings

__all__ = ["copier", "make_client"]


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
    pool = Pool.from_url(
        url,
        max_connections=settings.max_connections,
        timeout=settings.operation_timeout,
        retry_on_timeout=False,
        health_check_interval=30,
        **common,
    )
    pool.connection_class = FAST.get(pool.connection_class, pool.connection_class)
    return Redis.from_pool(pool)


_COPYABLE = (Pool, rconn.BlockingConnectionPool, rconn.ConnectionPool)
"""Pools a client can be copied by (their class, connection class, bound and options)."""


def copier(client: Any) -> Callable[[], Any] | None:
    """What makes another client like ``client`` (for another event loop); None if unknown.

    A standalone client on redis-py's pools, or the store's own, is copied from its
    pool: the same connection class, options and bound, and no connection yet. A
    cluster or Sentinel client built by the caller is not: what built it is not kept.
    """
    pool: Any = getattr(client, "connection_pool", None)
    if type(client) is not Redis or type(pool) not in _COPYABLE:
        return None
    options: dict[str, Any] = dict(pool.connection_kwargs)
    if isinstance(pool, rconn.BlockingConnectionPool):
        options["timeout"] = pool.timeout
    pool_class: Any = type(pool)

    def copy() -> Any:
        return Redis.from_pool(
            pool_class(
                connection_class=pool.connection_class,
                max_connections=pool.max_connections,
                **options,
            )
        )

    return copy

"""Which redis-py errors are transient, and the ctxstore error each one becomes.

:data:`TRANSIENT` errors are retried (:meth:`ctxstore._redis.connection.Connection.call`);
what a call still raises is translated by :func:`translate`, the one map from
redis-py's errors to :mod:`ctxstore.errors`, with the command redis-py quotes
scrubbed from the message (its arguments hold the tenant's data).
"""

from __future__ import annotations

import re

from redis import exceptions as rex

from ctxstore.errors import (
    CtxstoreError,
    PermissionDeniedError,
    StoreError,
    StoreFullError,
    StoreUnavailableError,
)

__all__ = ["TOPOLOGY", "TRANSIENT", "scrub", "translate"]


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
"""The errors a call is retried after: the connection, or the cluster, may be back."""

TOPOLOGY = (rex.MovedError, rex.AskError, rex.ReadOnlyError, rex.ConnectionError, OSError)
"""Transient errors after which a cluster's topology is read again before the retry."""

_QUOTED_COMMAND = re.compile(r"Command # (\d+) \(.*\) of pipeline caused error: ", re.DOTALL)


def scrub(message: str) -> str:
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
    exc_text = scrub(str(exc))
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

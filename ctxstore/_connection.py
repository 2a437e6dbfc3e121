"""The store's edge: one Redis client, retries, and error translation.

Every call to Redis goes through :class:`Connection`, which retries transient
connection errors (bounded, exponential backoff with full jitter) and turns
every redis-py error into a :mod:`ctxstore.errors` error chained with
``from``. Calls are retried with the same arguments, so an append keeps its
idempotency key across retries.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from redis import exceptions as rex
from redis.asyncio import Redis

from ctxstore._scripts import Script
from ctxstore.errors import StoreError, StoreUnavailableError
from ctxstore.settings import Settings

__all__ = ["Connection", "make_client"]

log = logging.getLogger("ctxstore")

T = TypeVar("T")

TRANSIENT: tuple[type[BaseException], ...] = (
    rex.ConnectionError,  # includes BusyLoadingError (a restarted server loading its AOF)
    rex.TimeoutError,
    rex.TryAgainError,
    rex.ClusterDownError,
    rex.MasterDownError,
    rex.ReadOnlyError,  # a primary demoted by a failover, until we reconnect
    OSError,
)


def make_client(url: str, settings: Settings) -> Redis:
    """A redis-py asyncio client for ``url``, with ctxstore's timeouts.

    redis-py's own retries are off: :class:`Connection` retries, so that it
    can bound the total time and translate the final error.
    """
    client: Redis = Redis.from_url(
        url,
        socket_connect_timeout=settings.connect_timeout,
        socket_timeout=settings.operation_timeout,
        retry_on_timeout=False,
        health_check_interval=30,
    )
    return client


class Connection:
    """A Redis client with ctxstore's retry and error policy.

    Args:
        client: The redis-py client (standalone or cluster).
        settings: Retry counts and delays.
        tenant: The tenant this connection works for, for error messages.
    """

    def __init__(self, client: Any, settings: Settings, tenant: str) -> None:
        self.client = client
        self._settings = settings
        self._tenant = tenant

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
            StoreError: Redis answered with an error.
        """
        attempt = 0
        while True:
            try:
                return await op()
            except TRANSIENT as exc:
                attempt += 1
                if attempt > self._settings.retry_attempts:
                    raise StoreUnavailableError(
                        f"Redis unavailable after {attempt} attempts: {exc}",
                        tenant=self._tenant,
                        session=session,
                        key=key,
                    ) from exc
                delay = random.uniform(
                    0,
                    min(
                        self._settings.retry_max_delay,
                        self._settings.retry_base_delay * 2 ** (attempt - 1),
                    ),
                )
                log.debug("retrying after %r (attempt %d, %.3fs)", exc, attempt, delay)
                await asyncio.sleep(delay)
            except rex.RedisError as exc:
                raise StoreError(
                    f"Redis refused the call: {exc}", tenant=self._tenant, session=session, key=key
                ) from exc

    async def script(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        session: str | None = None,
    ) -> Any:
        """Run a Lua script (by SHA, falling back to EVAL) with retries."""

        async def op() -> Any:
            try:
                return await self.client.evalsha(script.sha, len(keys), *keys, *args)
            except rex.NoScriptError:
                return await self.client.eval(script.source, len(keys), *keys, *args)

        return await self.call(op, session=session, key=keys[0] if keys else None)

    async def script_and(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        also: Callable[[Any], None],
        *,
        session: str | None = None,
    ) -> Any:
        """Run a script and, in the same round trip, the commands ``also`` queues.

        ``also`` receives a non-transactional pipeline; it is for the tenant's
        index, which lives in another slot than the session's keys.
        """

        async def op() -> Any:
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            also(pipe)
            results = await pipe.execute(raise_on_error=False)
            first = results[0]
            if isinstance(first, rex.NoScriptError):
                first = await self.client.eval(script.source, len(keys), *keys, *args)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, rex.NoScriptError):
                    raise result
            return first

        return await self.call(op, session=session, key=keys[0] if keys else None)

    async def aclose(self) -> None:
        """Close the client's connections."""
        await cast(Any, self.client).aclose()

"""A loopback TCP proxy that cuts connections between a request and its reply.

That is the one failure an idempotency key exists for: Redis applied the
write, the client never heard back, and retries. The proxy forwards a
request, then (with the given probability) reads the server's reply, throws
it away and closes both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

from ctxstore import Settings


class DroppingProxy:
    """Forward TCP to ``target``; drop a share of replies by closing the connection.

    Args:
        target: The server's connection kwargs, as redis-py parses a URL
            (``host`` and ``port``, or ``path`` for a unix socket).
        drop_rate: The probability that a request's reply is dropped.
        seed: Seeds the random choice, for repeatable runs.
    """

    def __init__(self, target: dict[str, Any], drop_rate: float, seed: int = 0) -> None:
        self._target = target
        self._rate = drop_rate
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.dropped = 0
        self.port = 0

    async def start(self) -> int:
        """Listen on a free loopback port and return it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if "path" in self._target:
                upstream_r, upstream_w = await asyncio.open_unix_connection(self._target["path"])
            else:
                upstream_r, upstream_w = await asyncio.open_connection(
                    self._target.get("host", "127.0.0.1"), self._target.get("port", 6379)
                )
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        armed = asyncio.Event()

        async def requests() -> None:
            while request := await client_r.read(65536):
                upstream_w.write(request)
                await upstream_w.drain()
                if self._random.random() < self._rate:
                    armed.set()

        async def replies() -> None:
            while reply := await upstream_r.read(65536):
                if armed.is_set():
                    # The server has executed the request (its reply came back): lose it.
                    self.dropped += 1
                    return
                client_w.write(reply)
                await client_w.drain()

        pumps = [asyncio.ensure_future(requests()), asyncio.ensure_future(replies())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, OSError):
            pass
        finally:
            for pump in pumps:
                pump.cancel()
            for pump in pumps:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await pump
            for writer in (client_w, upstream_w):
                writer.close()
            self._tasks.discard(task)


@contextlib.asynccontextmanager
async def dropping(
    settings: Settings, redis_url: str, *, drop_rate: float, seed: int, **retries: Any
) -> AsyncIterator[tuple[Settings, DroppingProxy]]:
    """``settings`` pointed at a :class:`DroppingProxy` in front of ``redis_url``.

    ``retries``: settings of the SDK's retries (``retry_attempts``...). The proxy
    stops on exit.
    """
    client = Redis.from_url(redis_url)
    kwargs = client.connection_pool.connection_kwargs
    await client.aclose()
    proxy = DroppingProxy(kwargs, drop_rate=drop_rate, seed=seed)
    port = await proxy.start()
    url = f"redis://127.0.0.1:{port}/{kwargs.get('db', 0)}"
    try:
        yield settings.model_copy(update={"redis_url": url, **retries}), proxy
    finally:
        await proxy.stop()

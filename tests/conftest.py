"""Shared fixtures: a real Redis, and a key prefix of this run's own.

The Redis is ``CTXSTORE_REDIS_URL`` when set, else the one on 127.0.0.1:6379
when it answers, else an embedded one started for the run. Every key this
run writes starts with its own prefix, and only those keys are removed at
the end: the server is shared with other runs.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis, RedisCluster
from servers import ServerPool, redis7_binary

from ctxstore import ContextStore, EmbeddedRedis, Settings
from ctxstore.testing import LocalCluster as Cluster

RUN_PREFIX = f"ctxtest-{uuid.uuid4().hex[:10]}"


def _local_redis_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the Redis the tests run against."""
    url = os.environ.get("CTXSTORE_REDIS_URL") or (
        "redis://127.0.0.1:6379/0" if _local_redis_answers() else None
    )
    if url is None:
        with EmbeddedRedis() as server:  # its keys go with it
            yield server.url
        return
    yield url
    asyncio.run(_remove_keys(url, RUN_PREFIX))


async def _remove_keys(url: str, prefix: str) -> None:
    """Delete this run's keys: its own, and arq's for this run's job ids."""
    client = Redis.from_url(url)
    try:
        for pattern in (f"{prefix}*", f"arq:*{prefix}*"):
            batch = []
            async for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) == 500:
                    await client.delete(*batch)
                    batch.clear()
            if batch:
                await client.delete(*batch)
    finally:
        await client.aclose()


@pytest.fixture
def tenant() -> str:
    """A tenant id of this test's own."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A Redis Cluster of this run's own (3 primaries, 3 replicas), started once."""
    try:
        running = Cluster.start()
    except RuntimeError as exc:
        pytest.skip(f"no Redis Cluster here: {exc}")
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> str:
    """Where the store runs: ``single`` (one Redis) or ``cluster``.

    Contract test modules run every test on both, with
    ``pytestmark = pytest.mark.parametrize("backend", BACKENDS, indirect=True)``.
    """
    return str(getattr(request, "param", "single"))


BACKENDS = ["single", "cluster"]


@pytest.fixture
def settings(backend: str, redis_url: str, request: pytest.FixtureRequest) -> Settings:
    """Settings on the test Redis (or cluster), with this run's key prefix.

    On a cluster, the summary queue stays on the single Redis: arq cannot run
    on a cluster.
    """
    common = {
        "key_prefix": RUN_PREFIX,
        "queue_name": f"{RUN_PREFIX}:summaries",
        "retry_attempts": 2,
    }
    if backend == "cluster":
        running: Cluster = request.getfixturevalue("cluster")
        return Settings(redis_url=running.url, redis_cluster=True, queue_url=redis_url, **common)
    return Settings(redis_url=redis_url, **common)


SUMMARY_TRIGGER = 400
"""Tokens past the watermark that make a summary due, in ``summary_settings``."""
SUMMARY_KEEP = 150
"""Tokens a summary leaves raw, in ``summary_settings``."""


@pytest.fixture
def summary_settings(settings: Settings, tenant: str) -> Settings:
    """A small summary window, on a key prefix and arq queue of this test's own.

    Both are under the run's prefix, so their keys are removed with the run's:
    the sweep walks every tenant under a prefix, and a burst worker runs
    whatever its queue holds.
    """
    prefix = f"{RUN_PREFIX}-{tenant}"
    return settings.model_copy(
        update={
            "key_prefix": prefix,
            "queue_name": f"{prefix}:summaries",
            "summary_trigger_tokens": SUMMARY_TRIGGER,
            "summary_keep_tokens": SUMMARY_KEEP,
        }
    )


@pytest.fixture
def servers() -> Iterator[ServerPool]:
    """Private redis-servers (7 or later) of this test's own, stopped at its end."""
    binary = redis7_binary()
    if binary is None:
        pytest.skip("needs redis-server 7 or later on PATH")
    pool = ServerPool(binary)
    yield pool
    pool.stop_all()


@pytest.fixture
async def store(settings: Settings, tenant: str) -> AsyncIterator[ContextStore]:
    """A store bound to this test's tenant."""
    async with ContextStore.from_settings(settings, tenant=tenant) as store:
        yield store


@pytest.fixture
async def raw_redis(settings: Settings) -> AsyncIterator[Redis]:
    """A plain redis-py client on the store's Redis (or cluster), for inspecting keys."""
    assert settings.redis_url is not None
    client: Redis = (
        RedisCluster.from_url(settings.redis_url)  # type: ignore[assignment]
        if settings.redis_cluster
        else Redis.from_url(settings.redis_url)
    )
    yield client
    await client.aclose()

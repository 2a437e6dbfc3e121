"""Summary jobs: queued on arq when an append (or a view) finds a summary due.

One job per due *generation*: the append script raises the session's
summary flag and hands out a new generation only when the flag is down, and
the flag stays up until the job ends. So a session has at most one job
queued, job ids are never reused (arq refuses an id that is queued, running
or kept), and a job that finds more due when it commits hands out the next
generation itself. The sweep (:func:`sweep`, run by the worker's cron)
queues again the sessions whose job was lost (a pod died between its append
and its enqueue) or failed long enough ago.

The queue lives on ``Settings.queue_url`` (the store's Redis by default):
arq cannot run on Redis Cluster, so a cluster store keeps its queue on a
standalone Redis, or on one that Redis Sentinel watches
(``redis+sentinel://`` URLs). Jobs are serialized as JSON, not pickle.

A queue that cannot be reached costs an append one bounded attempt: the
queue fails fast, with :class:`~ctxstore.errors.StoreUnavailableError`, and
never waits longer than ``connect_timeout`` plus ``operation_timeout``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.jobs import Job, JobStatus
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ctxstore.errors import StoreUnavailableError
from ctxstore.settings import Settings, sentinel_address
from ctxstore.store import ContextStore

__all__ = [
    "JOB_FUNCTION",
    "SummaryQueue",
    "SweepReport",
    "close_sentinels",
    "deserialize",
    "job_id",
    "queue_redis_settings",
    "serialize",
    "sweep",
]

log = logging.getLogger(__name__)

JOB_FUNCTION = "summarize_session"
"""The arq function name of the summary job."""

_LIVE = {JobStatus.queued, JobStatus.deferred, JobStatus.in_progress}


def serialize(value: Any) -> bytes:
    """Arq's job serializer: JSON (jobs carry ids and numbers only)."""
    return json.dumps(value, separators=(",", ":")).encode()


def deserialize(data: bytes) -> Any:
    """Arq's job deserializer: JSON."""
    return json.loads(data)


def job_id(settings: Settings, tenant: str, session: str, generation: int) -> str:
    """The job id of one summary generation of one session."""
    return f"{settings.key_prefix}:sum:{tenant}:{session}:{generation}"


def queue_redis_settings(settings: Settings, *, conn_retries: int = 0) -> RedisSettings:
    """Arq's connection settings for the queue's Redis.

    Args:
        settings: ``queue_url`` (else ``redis_url``, else the embedded Redis).
        conn_retries: How many more times arq tries to connect, a second
            apart: none for a client on a request path (the sweep makes up
            for a lost enqueue); a worker may wait for its Redis to come up.
    """
    url = settings.queue_url or settings.redis_url
    if url is None:
        from ctxstore.embedded import shared_embedded_url

        url = shared_embedded_url()
    sentinel = sentinel_address(url)
    if sentinel is None:
        redis_settings = RedisSettings.from_dsn(url)
    else:
        redis_settings = RedisSettings(
            host=list(sentinel.sentinels),
            sentinel=True,
            sentinel_master=sentinel.master,
            database=sentinel.db,
            username=sentinel.username,
            password=sentinel.password,
        )
    redis_settings.conn_timeout = max(1, int(settings.connect_timeout))
    redis_settings.conn_retries = conn_retries
    return redis_settings


@asynccontextmanager
async def _bounded(seconds: float, doing: str) -> AsyncIterator[None]:
    """Turn a queue that does not answer within ``seconds`` into StoreUnavailableError."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except (TimeoutError, OSError, RedisConnectionError, RedisTimeoutError) as exc:
        raise StoreUnavailableError(
            f"the summary queue's Redis failed to {doing}: {exc!r}"
        ) from exc


class SummaryQueue:
    """Puts summary jobs on the arq queue. Pass it as a store's ``on_summary_due``.

    Args:
        pool: An arq pool on the queue's Redis.
        settings: The queue name and key prefix.
    """

    def __init__(self, pool: ArqRedis, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    @classmethod
    async def connect(cls, settings: Settings) -> SummaryQueue:
        """Open a pool on the queue's Redis (``queue_url``, else the store's).

        Raises:
            StoreUnavailableError: No answer within ``connect_timeout`` plus
                ``operation_timeout`` (one attempt: no retries).
        """
        async with _bounded(settings.connect_timeout + settings.operation_timeout, "connect"):
            pool = await create_pool(
                queue_redis_settings(settings),
                job_serializer=serialize,
                job_deserializer=deserialize,
                default_queue_name=settings.queue_name,
            )
        return cls(pool, settings)

    async def __call__(self, tenant: str, session: str, generation: int) -> None:
        """Queue the job for this generation (the store's ``on_summary_due``)."""
        await self.enqueue(tenant, session, generation)

    async def enqueue(self, tenant: str, session: str, generation: int) -> bool:
        """Queue one job; False if arq already has that job id.

        Raises:
            StoreUnavailableError: The queue did not answer within ``operation_timeout``.
        """
        async with _bounded(self.settings.operation_timeout, "queue a job"):
            job = await self.pool.enqueue_job(
                JOB_FUNCTION,
                tenant,
                session,
                generation,
                _job_id=job_id(self.settings, tenant, session, generation),
                _queue_name=self.settings.queue_name,
            )
        return job is not None

    async def status(self, tenant: str, session: str, generation: int) -> JobStatus:
        """Arq's view of one generation's job."""
        job = Job(
            job_id(self.settings, tenant, session, generation),
            self.pool,
            _queue_name=self.settings.queue_name,
            _deserializer=deserialize,
        )
        async with _bounded(self.settings.operation_timeout, "read a job's status"):
            return await job.status()

    async def depth(self) -> int:
        """Jobs waiting in the queue (for autoscaling)."""
        async with _bounded(self.settings.operation_timeout, "read the queue's depth"):
            return int(await self.pool.zcard(self.settings.queue_name))

    async def aclose(self) -> None:
        """Close the pool (and, through Sentinel, the sentinels' connections)."""
        await self.pool.aclose()
        await close_sentinels(self.pool)


async def close_sentinels(pool: ArqRedis) -> None:
    """Close the connections a Sentinel-found pool keeps to the sentinels.

    Closing the pool closes its connections to the primary only.
    """
    manager = getattr(pool.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one sweep did.

    Attributes:
        sessions: Sessions looked at.
        queued: Sessions queued again (their job was lost, or failed long ago).
        waiting: Sessions whose job is queued or running.
    """

    sessions: int
    queued: int
    waiting: int


async def sweep(
    base: ContextStore,
    queue: SummaryQueue,
    *,
    lookback_seconds: float = 86_400,
    grace_seconds: float = 30,
    limit: int = 1_000,
) -> SweepReport:
    """Queue summaries that are due but have no live job.

    Looks at every tenant's sessions active in the last ``lookback_seconds``.
    A session whose flag is up but whose job is neither queued nor running
    (lost, or given up by arq) is queued again, unless its flag went up less
    than ``grace_seconds`` ago (its enqueue may be in flight) or its last job
    failed less than ``summary_retry_seconds`` ago. A session past the
    trigger with its flag down (the threshold was lowered) is queued too.

    Args:
        base: A store on the store's Redis (any tenant); the sweep works
            through ``base.for_tenant`` on its connections.
        queue: The queue.
        lookback_seconds: How far back activity counts.
        grace_seconds: How long a raised flag may wait for its enqueue.
        limit: The most sessions per tenant per sweep.
    """
    settings = queue.settings
    # The tenants set is on the store's Redis, which may not be the queue's.
    tenants = await base.list_tenants()
    now_ms = int(time.time() * 1000)
    looked = queued = waiting = 0
    for tenant in tenants:
        store = base if tenant == base.tenant else base.for_tenant(tenant)
        rows = await store.list_sessions(limit=limit)
        for row in rows:
            if row.last_active_ms < now_ms - lookback_seconds * 1000:
                break
            looked += 1
            info = await store.info(row.session, pins=False)
            if not info.exists:
                continue
            if not info.summary_due:
                if 0 < settings.summary_trigger_tokens <= info.tokens_unsummarized:
                    generation = await store.request_summary(row.session)
                    if generation and await queue.enqueue(tenant, row.session, generation):
                        queued += 1
                continue
            status = await queue.status(tenant, row.session, info.summary_generation)
            if status in _LIVE:
                waiting += 1
                continue
            failed_at = info.summary_failed_at_ms
            if failed_at and now_ms - failed_at < settings.summary_retry_seconds * 1000:
                continue
            if (info.summary_due_since_ms or 0) > now_ms - grace_seconds * 1000:
                continue
            generation = await store.request_summary(row.session, force=True)
            if generation and await queue.enqueue(tenant, row.session, generation):
                log.info("queued %s/%s again (generation %d)", tenant, row.session, generation)
                queued += 1
    return SweepReport(looked, queued, waiting)

"""The summary queue: jobs handed to arq when an append (or a view) finds a summary due.

One job per due *generation*: the append script raises the session's
summary flag and hands out a new generation only when the flag is down, and
the flag stays up until the job ends. So a session has at most one job
queued, job ids are never reused (arq refuses an id that is queued, running
or kept), and a job that finds more due when it commits hands out the next
generation itself. The workers' sweep (``workers.sweep``) queues again the
sessions whose job was lost (a pod died between its append and its enqueue)
or failed long enough ago.

- :class:`SummaryQueue`: the queue itself (enqueue, status, depth).
- :class:`Handoff`: a store's side of it: one bounded attempt per due
  summary, then a pause during which the sweep makes up for it.

(Named ``summary_queue``, not ``queue``: a module named ``queue`` in the package
directory shadows the standard library's for tools that import a file of the
package by path, as ``amplifier-core validate`` does.)

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
import weakref
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from enum import StrEnum
from typing import Any

from ctxstore._layout.codec import text
from ctxstore._redis.client import make_client
from ctxstore._redis.connection import Connection
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.errors import CtxstoreError, PermissionDeniedError, StoreClosedError
from ctxstore.settings import Settings, sentinel_address
from ctxstore.tracing import enqueue_span

__all__ = [
    "JOB_FUNCTION",
    "LIVE",
    "QUEUE_BACKOFF_MS",
    "TRACE_FIELD",
    "Handoff",
    "JobState",
    "SummaryDue",
    "SummaryQueue",
    "deserialize",
    "job_id",
    "job_trace_context",
    "serialize",
]

log = logging.getLogger(__name__)

JOB_FUNCTION = "summarize_session"
"""The arq function name of the summary job."""

JOB_EXPIRES_MS = 86_400_000
"""How long a queued job's key lasts (arq's default: a day)."""

TRACE_FIELD = "tc"
"""The job's field holding the enqueue's W3C trace context (``traceparent``...), when traced.

Beside arq's own fields, not in its arguments: arq reads only ``f a k t
et``, so a worker of an earlier version runs the job as before (an unknown
keyword argument would fail it), and arq's log lines and results show the
job's arguments only. :func:`deserialize` hands it to the job through
:func:`job_trace_context`.
"""

_JOB_TRACE: ContextVar[dict[str, str] | None] = ContextVar("ctxstore_job_trace", default=None)


class JobState(StrEnum):
    """A summary job's state, as arq's ``JobStatus`` spells it (and compares equal to it)."""

    DEFERRED = "deferred"
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETE = "complete"
    NOT_FOUND = "not_found"


LIVE = frozenset({JobState.QUEUED, JobState.DEFERRED, JobState.IN_PROGRESS})
"""Job states in which a job will still run."""

QUEUE_BACKOFF_MS = 10_000
"""After a failed enqueue, appends leave summaries to the sweep for this long."""

SummaryDue = Callable[[str, str, int], Awaitable[None]]
"""Called as ``(tenant, session, generation)`` when an append makes a summary due."""


def serialize(value: Any) -> bytes:
    """Arq's job serializer: JSON (jobs carry ids and numbers only)."""
    return json.dumps(value, separators=(",", ":")).encode()


def deserialize(data: bytes) -> Any:
    """Arq's job deserializer: JSON; a job's trace context is kept for :func:`job_trace_context`."""
    value = json.loads(data)
    if isinstance(value, dict) and "f" in value:
        carried = value.pop(TRACE_FIELD, None)
        _JOB_TRACE.set(carried if isinstance(carried, dict) else None)
    return value


def job_trace_context() -> dict[str, str] | None:
    """The trace context of the job this task deserialized last (``None``: not traced).

    arq deserializes a job in the task that then starts the job's own task,
    which inherits that task's context variables: the job reads its own.
    """
    return _JOB_TRACE.get()


def job_id(settings: Settings, tenant: str, session: str, generation: int) -> str:
    """The job id of one summary generation of one session."""
    return f"{settings.key_prefix}:sum:{tenant}:{session}:{generation}"


def queue_connection(settings: Settings) -> Connection:
    """A connection to the queue's Redis (``queue_url``, else the store's); no I/O yet.

    One attempt per call, bounded by ``connect_timeout`` and
    ``operation_timeout``: the queue is never worth holding a write up for
    (the sweep makes up for a lost enqueue). A ``redis+sentinel://`` URL
    finds the primary through Sentinel.
    """
    single = settings.model_copy(update={"redis_cluster": False, "retry_attempts": 0})
    url = settings.queue_url or settings.store_url()
    sentinel = sentinel_address(url)
    label = "the summary queue's Redis"
    if sentinel is None:
        return Connection(make_client(url, single), single, label=label)
    from redis.asyncio.sentinel import Sentinel

    found: Any = Sentinel(  # type: ignore[no-untyped-call]
        list(sentinel.sentinels),
        socket_connect_timeout=settings.connect_timeout,
        socket_timeout=settings.operation_timeout,
    )
    client = found.master_for(
        sentinel.master,
        db=sentinel.db,
        username=sentinel.username,
        password=sentinel.password,
        socket_connect_timeout=settings.connect_timeout,
    )
    return Connection(client, single, label=label)


class SummaryQueue:
    """Puts summary jobs on the arq queue, in arq's format, without arq.

    Pods need neither arq nor its version of redis-py: a job is written as
    arq 0.26+ writes it (``enqueue.lua``), with the JSON serializer the
    workers are built with, and an arq worker runs it. Pass one as a store's
    ``on_summary_due``, or let the store open its own.

    Args:
        connection: A connection to the queue's Redis (:func:`queue_connection`).
        settings: The queue name and key prefix.
    """

    def __init__(self, connection: Connection, settings: Settings) -> None:
        self.connection = connection
        self.settings = settings

    @classmethod
    async def connect(cls, settings: Settings) -> SummaryQueue:
        """A queue on the settings' queue Redis (answers PING within the timeouts).

        Raises:
            StoreUnavailableError: No answer in time.
            PermissionDeniedError: The credentials were refused.
        """
        queue = cls(queue_connection(settings), settings)
        try:
            await queue.connection.call(lambda: queue.connection.client.ping(), key="summary queue")
        except CtxstoreError:
            await queue.aclose()
            raise
        return queue

    async def __call__(self, tenant: str, session: str, generation: int) -> None:
        """Queue the job for this generation (the store's ``on_summary_due``)."""
        await self.enqueue(tenant, session, generation)

    def _keys(self, job: str) -> tuple[str, str, str]:
        return f"arq:job:{job}", f"arq:result:{job}", self.settings.queue_name

    async def enqueue(self, tenant: str, session: str, generation: int) -> bool:
        """Queue one job; False if arq already has that job id.

        Raises:
            StoreUnavailableError: The queue did not answer in time.
        """
        job = job_id(self.settings, tenant, session, generation)
        with enqueue_span(tenant, session, generation) as trace_context:
            now = int(time.time() * 1000)  # arq's own clock: the enqueuer's
            fields: dict[str, Any] = {
                "t": None,
                "f": JOB_FUNCTION,
                "a": [tenant, session, generation],
                "k": {},
                "et": now,
            }
            if trace_context:
                fields[TRACE_FIELD] = trace_context
            queued = await self.connection.script(
                SCRIPTS.enqueue,
                self._keys(job),
                (job, serialize(fields), JOB_EXPIRES_MS, now),
                session=session,
            )
        return int(queued) == 1

    async def status(self, tenant: str, session: str, generation: int) -> JobState:
        """One generation's job, as arq's ``Job.status()`` reads it."""
        job = job_id(self.settings, tenant, session, generation)
        keys = self._keys(job)
        done, running, score = await self.connection.transaction(
            [
                ("EXISTS", keys[1]),
                ("EXISTS", f"arq:in-progress:{job}"),
                ("ZSCORE", keys[2], job),
            ],
            session=session,
            key=keys[2],
        )
        if int(done):
            return JobState.COMPLETE
        if int(running):
            return JobState.IN_PROGRESS
        if score is None:
            return JobState.NOT_FOUND
        return JobState.DEFERRED if float(score) > time.time() * 1000 else JobState.QUEUED

    async def forget(self, tenant: str, session: str, generation: int) -> None:
        """Delete every key arq keeps of one generation's job (they name the session)."""
        job = job_id(self.settings, tenant, session, generation)
        keys = [f"arq:{kind}:{job}" for kind in ("job", "result", "retry", "in-progress")]
        await self.connection.transaction(
            [("DEL", *keys), ("ZREM", self.settings.queue_name, job)],
            session=session,
            key=self.settings.queue_name,
        )

    async def depth(self) -> int:
        """Jobs waiting in the queue, deferred or running (for autoscaling)."""
        queue = self.settings.queue_name
        (count,) = await self.connection.transaction([("ZCARD", queue)], key=queue)
        return int(count)

    async def oldest(self, limit: int) -> list[tuple[str, str, int]]:
        """``(tenant, session, generation)`` of up to ``limit`` jobs, first to run first.

        For the workers' lag sample; jobs whose key is gone (just ended) or
        not a summary job are left out.
        """
        queue = self.settings.queue_name
        (ids,) = await self.connection.transaction([("ZRANGE", queue, 0, limit - 1)], key=queue)
        if not ids:
            return []
        jobs = await self.connection.transaction(
            [("GET", f"arq:job:{text(job)}") for job in ids], key=queue
        )
        found = []
        for raw in jobs:
            if raw is None:
                continue
            try:
                tenant, session, generation = deserialize(raw)["a"]
                found.append((str(tenant), str(session), int(generation)))
            except (ValueError, TypeError, KeyError):
                continue  # not one of ours: nothing to sample
        return found

    async def read(self, key: str) -> str | None:
        """A string key of the queue's Redis (a worker's health check)."""
        (value,) = await self.connection.transaction([("GET", key)], key=key)
        return text(value) if value is not None else None

    async def aclose(self) -> None:
        """Close the connection (and, through Sentinel, the sentinels' connections)."""
        client: Any = self.connection.client
        await self.connection.aclose()
        manager = getattr(client.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


class Handoff:
    """A process's side of the queue: hands due summaries to it, never holding a write up.

    Shared by every tenant's store of a process (``ContextStore.for_tenant``).
    Without an ``on_summary_due``, the settings' queue is opened on first
    use. A user that may not touch the queue (a tenant's own ACL user)
    leaves due summaries to the workers' sweep: the session's flag is up,
    and the sweep queues it. So does a failed enqueue: for
    ``QUEUE_BACKOFF_MS`` after one, appends do not try the queue at all, so
    an unreachable queue costs one bounded attempt, not one per session.

    Args:
        settings: The queue's URL and name.
        on_summary_due: Called instead of the queue, when given.
        now_ms: The clock the backoff is measured with.
    """

    def __init__(
        self,
        settings: Settings,
        on_summary_due: SummaryDue | None,
        now_ms: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.on_summary_due = on_summary_due
        self._now_ms = now_ms
        self._queue: SummaryQueue | None = None
        # One per event loop (an asyncio.Lock is its loop's): a loop's calls at once open one.
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._denied = False
        self._retry_at_ms = 0
        self._closed = False  # closed with its store: the queue is not opened again

    def closed(self) -> bool:
        """Whether it was closed (with its store)."""
        return self._closed

    async def queue(self) -> SummaryQueue:
        """The settings' queue, opened on first use.

        Raises:
            StoreUnavailableError: It cannot be reached in time.
            StoreClosedError: The store was closed.
        """
        if self._queue is None:
            opening = self._opening.setdefault(asyncio.get_running_loop(), asyncio.Lock())
            async with opening:  # calls at once open one queue, not one each
                if self._queue is None and not self._closed:
                    queue = await SummaryQueue.connect(self.settings)
                    if self.closed() or self._queue is not None:  # meanwhile (another loop)
                        await queue.aclose()
                    else:
                        self._queue = queue
        if self._queue is None:
            raise StoreClosedError("the store is closed")
        return self._queue

    async def due(self, tenant: str, session: str, generation: int) -> None:
        """Hand one due summary over; a failure here never fails the write that made it due."""
        if self.on_summary_due is not None:
            try:
                await self.on_summary_due(tenant, session, generation)
            except Exception:
                log.exception(
                    "on_summary_due(%s, %s, %d) raised; the sweep will queue it",
                    tenant,
                    session,
                    generation,
                )
            return
        if self._denied or self._closed or self._now_ms() < self._retry_at_ms:
            return  # the sweep will queue it
        try:
            queue = await self.queue()
            if not await queue.enqueue(tenant, session, generation):
                log.warning("arq already had the summary job %s/%s:%d", tenant, session, generation)
        except PermissionDeniedError:
            self._denied = True
            log.info("this Redis user may not queue summaries; the workers' sweep will")
        except CtxstoreError:
            self._retry_at_ms = self._now_ms() + QUEUE_BACKOFF_MS
            log.warning(
                "could not queue the summary of %s/%s; no enqueue for %d s (the sweep will)",
                tenant,
                session,
                QUEUE_BACKOFF_MS // 1000,
                exc_info=True,
            )

    async def forget_job(self, tenant: str, session: str, generation: int) -> None:
        """Delete arq's keys of a session's summary job (they name the session).

        Raises:
            CtxstoreError: The queue could not be reached, or refused.
        """
        await (await self.queue()).forget(tenant, session, generation)

    async def aclose(self) -> None:
        """Close the queue's pool, if one was opened; it is not opened again."""
        self._closed = True
        if self._queue is not None:
            queue, self._queue = self._queue, None
            await queue.aclose()

"""The summary worker: arq tasks, and the options the worker is built with.

Start one with ``ctxstore worker`` (it reads ``CTXSTORE_*`` settings when it
starts). Each worker serves every tenant: it keeps one store per tenant on
shared connections. Its health check is its own key,
``<queue>:health-check:<worker name>``, refreshed every 10 seconds, which
``ctxstore worker --check`` (and a Kubernetes probe) reads.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict
from typing import Any

import arq.worker
from arq import Retry, Worker, cron, func
from arq.connections import log_redis_info as arq_log_redis_info
from redis.exceptions import ResponseError

from ctxstore import (
    ContextStore,
    LeaseHeldError,
    Settings,
    SummarizerError,
    SummarizerUnavailableError,
)
from ctxstore.jobs import (
    JOB_FUNCTION,
    SummaryQueue,
    close_sentinels,
    deserialize,
    queue_redis_settings,
    serialize,
    sweep,
)
from ctxstore.summarizers import Summarizer, summarizer_from_settings

__all__ = [
    "HEALTH_CHECK_INTERVAL",
    "MAX_TRIES",
    "build_worker",
    "health_check_key",
    "retry_delay",
    "summarize_session",
    "sweep_sessions",
    "worker_options",
]

log = logging.getLogger("ctxstore.worker")

MAX_TRIES = 8
"""Tries of one summary job before arq gives it up (the sweep queues it again later)."""
HEALTH_CHECK_INTERVAL = 10
"""Seconds between two refreshes of the worker's health-check key."""
STARTUP_CONN_RETRIES = 5
"""A starting worker tries its queue's Redis this many more times, a second apart."""


def health_check_key(settings: Settings) -> str:
    """This worker's own health-check key."""
    return f"{settings.queue_name}:health-check:{settings.worker_name}"


def retry_delay(job_try: int, retry_after: float | None = None) -> float:
    """Seconds before the next try: exponential from 2 s, capped at 5 min, jittered."""
    delay = min(300.0, 2.0 * 2 ** (job_try - 1)) * random.uniform(0.5, 1.5)
    return float(max(delay, retry_after or 0.0))


async def startup(ctx: dict[str, Any]) -> None:
    """Open the store connections, the queue, and the summarizer."""
    settings: Settings = ctx["settings"]
    ctx["base"] = ContextStore.from_settings(settings)
    ctx["stores"] = {}
    ctx["queue"] = await SummaryQueue.connect(settings)
    if ctx.get("summarizer") is None:
        ctx["summarizer"] = summarizer_from_settings(settings)
    log.info("worker %s up, summarizer %s", settings.worker_name, ctx["summarizer"].name)


async def shutdown(ctx: dict[str, Any]) -> None:
    """Close what startup opened, and the sentinel connections of arq's own pool.

    arq closes its pool after this, but not the connections a Sentinel-found
    pool keeps to the sentinels.
    """
    await ctx["queue"].aclose()
    await ctx["base"].aclose()
    await close_sentinels(ctx["redis"])


def store_for(ctx: dict[str, Any], tenant: str) -> ContextStore:
    """The store of ``tenant``, on the worker's shared connections."""
    stores: dict[str, ContextStore] = ctx["stores"]
    if tenant not in stores:
        if len(stores) > 10_000:
            stores.clear()
        stores[tenant] = ctx["base"].for_tenant(tenant)
    return stores[tenant]


async def summarize_session(
    ctx: dict[str, Any], tenant: str, session: str, generation: int
) -> dict[str, Any]:
    """The job: bring one session's summary up to date.

    Retried through arq (with jittered backoff) while the summarizer is rate
    limited, overloaded or down, or while another worker or a writer holds
    the session's lease; a summarizer error that a retry cannot fix fails
    the job (and is recorded on the session, whose views keep truncating).
    """
    store = store_for(ctx, tenant)
    job_try = int(ctx.get("job_try", 1))
    try:
        outcome = await store.summarize(session, ctx["summarizer"])
    except LeaseHeldError as exc:
        raise Retry(defer=retry_delay(job_try)) from exc
    except SummarizerUnavailableError as exc:
        if job_try >= MAX_TRIES:
            raise
        log.warning("summary of %s/%s: %s; retrying", tenant, session, exc)
        raise Retry(defer=retry_delay(job_try, exc.retry_after)) from exc
    except SummarizerError:
        log.exception("summary of %s/%s failed", tenant, session)
        raise
    if outcome.next_generation:
        await ctx["queue"].enqueue(tenant, session, outcome.next_generation)
    log.info(
        "summary of %s/%s (generation %d): %s, %d entries in %.2fs",
        tenant,
        session,
        generation,
        outcome.status,
        outcome.entries,
        outcome.seconds,
    )
    return {"tenant": tenant, "session": session, "generation": generation, **asdict(outcome)}


async def sweep_sessions(ctx: dict[str, Any]) -> dict[str, int]:
    """The cron job: queue again the summaries whose job was lost or failed long ago."""
    report = await sweep(ctx["base"], ctx["queue"])
    return asdict(report)


def worker_options(
    settings: Settings,
    *,
    summarizer: Summarizer | None = None,
    burst: bool = False,
    job_timeout: float | None = None,
    keep_result: float = 0,
) -> dict[str, Any]:
    """The keyword arguments of the arq ``Worker`` for these settings.

    Args:
        settings: The settings (queue, Redis, summarizer).
        summarizer: The summarizer; from the settings by default.
        burst: Stop once the queue is empty.
        job_timeout: Seconds a job may run (a job whose worker died is run
            again this long plus 10 s later); from the summarizer timeout by
            default.
        keep_result: Seconds arq keeps a job's result. None by default: the
            outcome is on the session (``ctxstore status``), and a kept result
            names its tenant and session after ``forget_tenant``.
    """
    timeout = job_timeout if job_timeout is not None else settings.summary_timeout * 4 + 30
    return {
        "functions": [
            func(
                summarize_session,
                name=JOB_FUNCTION,
                timeout=timeout,
                keep_result=keep_result,
                max_tries=MAX_TRIES,
            )
        ],
        "cron_jobs": [
            cron(
                sweep_sessions,
                name=f"{settings.key_prefix}:sweep",
                second=0,
                run_at_startup=not burst,
                unique=True,
                # arq keeps one in-progress TTL for all functions (the longest
                # timeout + 10 s): a longer sweep timeout would delay the re-run
                # of a job whose worker died.
                timeout=timeout,
            )
        ],
        "redis_settings": queue_redis_settings(settings, conn_retries=STARTUP_CONN_RETRIES),
        "queue_name": settings.queue_name,
        "on_startup": startup,
        "on_shutdown": shutdown,
        "ctx": {"settings": settings, "summarizer": summarizer},
        "burst": burst,
        "handle_signals": not burst,
        "poll_delay": 0.1 if burst else 0.5,
        "max_jobs": 16,
        "job_serializer": serialize,
        "job_deserializer": deserialize,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
        "health_check_key": health_check_key(settings),
        # A job left running by a worker that was stopped is finished, not cut.
        "job_completion_wait": int(timeout),
    }


def build_worker(settings: Settings, **options: Any) -> Worker:
    """An arq worker for summary jobs; ``options`` as :func:`worker_options` takes them."""
    # arq logs INFO and DBSIZE at start and fails if they are denied; the
    # worker's ACL user (`ctxstore acl`) may run neither.
    setattr(arq.worker, "log_redis_info", _log_redis_info)  # noqa: B010 - a library global, patched on purpose
    return Worker(**worker_options(settings, **options))


async def _log_redis_info(redis: Any, log_func: Any) -> None:
    try:
        await arq_log_redis_info(redis, log_func)
    except ResponseError as exc:
        log.info("not logging the queue's Redis info: %s", exc)

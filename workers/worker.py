"""The summary worker: built, started, sampled and stopped around its jobs.

Start one with ``ctxstore worker`` (it reads ``CTXSTORE_*`` settings when it
starts). Each worker serves every tenant: it keeps one store per tenant on
shared connections. Its health check is its own key,
``<queue>:health-check:<worker name>``, refreshed every 10 seconds, which
``ctxstore worker --check`` (and a Kubernetes probe) reads.

It logs (:mod:`workers.logs`, at ``log_level``, as ``log_format``) its start,
one line per job try (tenant, session, generation, outcome, entries covered,
tokens in and out, duration: :mod:`workers.jobs`), each sweep, and its stop
(signal, jobs done); never a message, a summary, a key or a password.

Its Prometheus metrics (:mod:`ctxstore.metrics`) count each job try by
outcome, with its duration, entries and summarizer tokens; every
``SAMPLE_SECONDS`` it samples the queue's depth and the summary lag of the
sessions whose jobs are next in line. ``ctxstore worker --metrics-port N``
serves them at ``/metrics``. Each job try is a span (:mod:`ctxstore.tracing`)
linked to the enqueue that queued it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import arq.worker
from arq import Worker, cron, func
from arq.connections import ArqRedis, RedisSettings
from arq.connections import log_redis_info as arq_log_redis_info
from redis.exceptions import ResponseError

from ctxstore import (
    AnthropicSummarizer,
    ContextStore,
    CtxstoreError,
    LocalSummarizer,
    OpenAISummarizer,
    Settings,
    SummaryStatus,
)
from ctxstore.metrics import Metrics, MetricsServer, metrics_from_settings, serve
from ctxstore.settings import sentinel_address
from ctxstore.summarizers import Summarizer, summarizer_from_settings
from ctxstore.summary_queue import JOB_FUNCTION, SummaryQueue, deserialize, serialize
from workers.jobs import MAX_TRIES, RETRIED, store_for, summarize_session, sweep_sessions
from workers.logs import configure, error_text, redacted

__all__ = [
    "HEALTH_CHECK_INTERVAL",
    "MAX_JOBS",
    "SAMPLED_JOBS",
    "SAMPLE_SECONDS",
    "SummaryWorker",
    "build_worker",
    "close_sentinels",
    "health_check_key",
    "queue_redis_settings",
    "sample",
    "worker_options",
]

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("ctxstore.worker")

HEALTH_CHECK_INTERVAL = 10
"""Seconds between two refreshes of the worker's health-check key."""
STARTUP_CONN_RETRIES = 5
"""A starting worker tries its queue's Redis this many more times, a second apart."""
MAX_JOBS = 16
"""Jobs one worker runs at once."""
SAMPLE_SECONDS = 15.0
"""Seconds between two samples of the queue's depth and the summary lag."""
SAMPLED_JOBS = 10
"""The lag sample: the sessions of this many jobs, the next to run."""


def queue_redis_settings(settings: Settings, *, conn_retries: int = 0) -> RedisSettings:
    """Arq's connection settings for the queue's Redis.

    Args:
        settings: ``queue_url`` (else ``redis_url``, else the embedded Redis).
        conn_retries: How many more times arq tries to connect, a second
            apart: a starting worker may wait for its Redis to come up.
    """
    url = settings.queue_url or settings.store_url()
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


async def close_sentinels(pool: ArqRedis) -> None:
    """Close the connections a Sentinel-found arq pool keeps to the sentinels.

    Closing the pool closes its connections to the primary only.
    """
    manager = getattr(pool.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()


def health_check_key(settings: Settings) -> str:
    """This worker's own health-check key."""
    return f"{settings.queue_name}:health-check:{settings.worker_name}"


async def startup(ctx: dict[str, Any]) -> None:
    """Open the store connections, the queue, the summarizer, and the metrics' server."""
    settings: Settings = ctx["settings"]
    ctx["metrics"] = metrics_from_settings(settings, ctx.get("registry"))
    ctx["base"] = ContextStore.from_settings(settings, registry=ctx.get("registry"))
    ctx["queue"] = await SummaryQueue.connect(settings)
    port = ctx.get("metrics_port")
    if port is not None:
        ctx["metrics_server"] = serve(port, registry=ctx.get("registry"))
    if ctx["metrics"] is not None:
        await sample(ctx)
        ctx["sampler"] = asyncio.create_task(_sample_every(ctx, ctx["sample_seconds"]))
    if ctx.get("summarizer") is None:
        ctx["summarizer"] = summarizer_from_settings(settings)
    summarizer = ctx["summarizer"]
    kind = _summarizer_kind(summarizer)
    queue_redis = redacted(settings.queue_url or settings.store_url())
    log.info(
        "worker %s up: queue %s on %s, summarizer %s (%s)",
        settings.worker_name,
        settings.queue_name,
        queue_redis,
        kind,
        summarizer.name,
        extra={
            "event": "start",
            "worker": settings.worker_name,
            "queue": settings.queue_name,
            "queue_redis": queue_redis,
            "store_redis": redacted(settings.store_url()),
            "summarizer": kind,
            "model": summarizer.name,
            "max_jobs": MAX_JOBS,
            "burst": ctx.get("burst", False),
            "metrics_port": _served_port(ctx),
        },
    )


def _served_port(ctx: dict[str, Any]) -> int | None:
    server: MetricsServer | None = ctx.get("metrics_server")
    return server.port if server is not None else None


async def sample(ctx: dict[str, Any]) -> None:
    """Sample the queue's depth and the lag of the sessions next in line, into the metrics.

    The lag is a session's tokens past its summary, read for the sessions of
    the ``SAMPLED_JOBS`` jobs that run next: the metrics never carry a
    session id (the gauge of the largest carries a tenant only when
    ``metrics_tenant_labels`` is on). A sample that fails is logged and
    skipped: the worker's jobs matter more than its numbers.
    """
    metrics: Metrics | None = ctx.get("metrics")
    if metrics is None:
        return
    queue: SummaryQueue = ctx["queue"]
    try:
        depth = await queue.depth()
        lags = []
        for tenant, session, _ in await queue.oldest(SAMPLED_JOBS):
            info = await store_for(ctx, tenant).info(session, pins=False)
            if info.exists:
                lags.append((tenant, info.tokens_unsummarized))
    except CtxstoreError as exc:
        log.warning(
            "metrics sample skipped: %s",
            type(exc).__name__,
            extra={"event": "sample_skip", "error": type(exc).__name__, "detail": error_text(exc)},
        )
        return
    metrics.record_sample(depth, lags)


async def _sample_every(ctx: dict[str, Any], seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        try:
            await sample(ctx)
        except Exception:  # a bug here must not end the sampling (nor the worker)
            log.exception("metrics sample failed", extra={"event": "sample_skip"})


def _summarizer_kind(summarizer: Summarizer) -> str:
    """``anthropic``, ``openai``, ``local``, or the class of another summarizer."""
    if isinstance(summarizer, AnthropicSummarizer):
        return "anthropic"
    if isinstance(summarizer, OpenAISummarizer):
        return "openai"
    if isinstance(summarizer, LocalSummarizer):
        return "local"
    return type(summarizer).__name__


async def shutdown(ctx: dict[str, Any]) -> None:
    """Close what startup opened, and the sentinel connections of arq's own pool.

    arq closes its pool after this, but not the connections a Sentinel-found
    pool keeps to the sentinels.
    """
    sampler: asyncio.Task[None] | None = ctx.pop("sampler", None)
    if sampler is not None:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await sample(ctx)  # the depth as the worker leaves it (a burst's: 0)
    await ctx["queue"].aclose()
    await ctx["base"].aclose()
    await close_sentinels(ctx["redis"])
    server: MetricsServer | None = ctx.pop("metrics_server", None)
    if server is not None:
        server.close()
    settings: Settings = ctx["settings"]
    tally: Counter[str] = ctx["tally"]
    why = ctx.get("stop_signal") or ("queue empty (burst)" if ctx.get("burst") else "closed")
    counts = {status.value: tally[status.value] for status in SummaryStatus}
    log.info(
        "worker %s stopped (%s): %d jobs done, %d retried",
        settings.worker_name,
        why,
        sum(counts.values()),
        tally[RETRIED],
        extra={
            "event": "stop",
            "worker": settings.worker_name,
            "reason": why,
            "jobs": sum(counts.values()),
            **counts,
            "retried": tally[RETRIED],
        },
    )


def worker_options(
    settings: Settings,
    *,
    summarizer: Summarizer | None = None,
    burst: bool = False,
    job_timeout: float | None = None,
    keep_result: float = 0,
    metrics_port: int | None = None,
    registry: CollectorRegistry | None = None,
    sample_seconds: float = SAMPLE_SECONDS,
) -> dict[str, Any]:
    """The keyword arguments of the arq ``Worker`` for these settings.

    Args:
        settings: The settings (queue, Redis, summarizer).
        summarizer: The summarizer; from the settings by default.
        burst: Stop once the queue is empty; no sweep runs.
        job_timeout: Seconds a job may run (a job whose worker died is run
            again this long plus 10 s later); from the summarizer timeout by
            default.
        keep_result: Seconds arq keeps a job's result. None by default: the
            outcome is on the session (``ctxstore status``), and a kept result
            names its tenant and session after ``forget_tenant``.
        metrics_port: Serve ``/metrics`` on this port (0: a free one) while
            the worker runs; ``None``: not served.
        registry: Where the metrics go (``prometheus_client.REGISTRY`` by
            default: with the process's own).
        sample_seconds: Seconds between two samples of the queue's depth
            and lag (one at start and one at stop, too).
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
        # A burst worker drains the queue and stops: its sweep would run only
        # when the burst spans a minute's start, so it runs none (`ctxstore
        # sweep` is the sweep on demand).
        "cron_jobs": []
        if burst
        else [
            cron(
                sweep_sessions,
                name=f"{settings.key_prefix}:sweep",
                second=0,
                run_at_startup=True,
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
        "ctx": {
            "settings": settings,
            "summarizer": summarizer,
            "burst": burst,
            "tally": Counter(),
            "metrics_port": metrics_port,
            "registry": registry,
            "sample_seconds": sample_seconds,
        },
        "burst": burst,
        "handle_signals": not burst,
        "poll_delay": 0.1 if burst else 0.5,
        "max_jobs": MAX_JOBS,
        "job_serializer": serialize,
        "job_deserializer": deserialize,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
        "health_check_key": health_check_key(settings),
        # A job left running by a worker that was stopped is finished, not cut.
        "job_completion_wait": int(timeout),
    }


def build_worker(settings: Settings, **options: Any) -> SummaryWorker:
    """An arq worker for summary jobs; ``options`` as :func:`worker_options` takes them.

    Sets the process's log up first (:func:`workers.logs.configure`, from
    ``settings.log_level`` and ``settings.log_format``).

    Raises:
        ConfigurationError: The log level or format is unknown.
    """
    configure(settings.log_level, settings.log_format)
    # arq logs INFO and DBSIZE at start and fails if they are denied; the
    # worker's ACL user (`ctxstore acl`) may run neither.
    setattr(arq.worker, "log_redis_info", _log_redis_info)  # noqa: B010 - a library global, patched on purpose
    return SummaryWorker(**worker_options(settings, **options))


class SummaryWorker(Worker):
    """arq's worker, which also logs the signal it stops on, as it arrives.

    (arq calls these on SIGINT and SIGTERM; it may then wait for running jobs
    for up to their timeout before the worker's stop line.)
    """

    def handle_sig(self, signum: signal.Signals) -> None:
        """Stop now: cancel running jobs (arq runs them again later)."""
        self._stopping(signum)
        super().handle_sig(signum)

    def handle_sig_wait_for_completion(self, signum: signal.Signals) -> None:
        """Stop taking jobs, let the running ones finish, then stop."""
        self._stopping(signum)
        super().handle_sig_wait_for_completion(signum)

    def _stopping(self, signum: signal.Signals) -> None:
        if self.burst or "stop_signal" in self.ctx:
            return  # a burst worker's close is no signal; a second signal changes nothing
        name = signal.Signals(signum).name
        self.ctx["stop_signal"] = name
        running = sum(not task.done() for task in self.tasks.values())
        settings: Settings = self.ctx["settings"]
        log.info(
            "worker %s stopping on %s: %d jobs running",
            settings.worker_name,
            name,
            running,
            extra={
                "event": "stopping",
                "worker": settings.worker_name,
                "signal": name,
                "running": running,
            },
        )


async def _log_redis_info(redis: Any, log_func: Any) -> None:
    try:
        await arq_log_redis_info(redis, log_func)
    except ResponseError as exc:
        log.info("not logging the queue's Redis info: %s", exc)

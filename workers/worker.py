"""The summary worker: arq tasks, and the options the worker is built with.

Start one with ``ctxstore worker`` (it reads ``CTXSTORE_*`` settings when it
starts). Each worker serves every tenant: it keeps one store per tenant on
shared connections. Its health check is its own key,
``<queue>:health-check:<worker name>``, refreshed every 10 seconds, which
``ctxstore worker --check`` (and a Kubernetes probe) reads.

It logs (:mod:`workers.logs`, at ``log_level``, as ``log_format``) its start,
one line per job try (tenant, session, generation, outcome, entries covered,
tokens in and out, duration), each sweep, and its stop (signal, jobs done);
never a message, a summary, a key or a password.

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
import random
import signal
import time
from collections import Counter
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import arq.worker
from arq import Retry, Worker, cron, func
from arq.connections import ArqRedis, RedisSettings
from arq.connections import log_redis_info as arq_log_redis_info
from redis.exceptions import ResponseError

from ctxstore import (
    AnthropicSummarizer,
    ContextStore,
    CtxstoreError,
    LeaseHeldError,
    LocalSummarizer,
    Settings,
    SummarizerUnavailableError,
    SummaryOutcome,
    SummaryStatus,
)
from ctxstore.metrics import Metrics, MetricsServer, metrics_from_settings, serve
from ctxstore.settings import sentinel_address
from ctxstore.summarizers import Summarizer, summarizer_from_settings
from ctxstore.summary_queue import (
    JOB_FUNCTION,
    SummaryQueue,
    deserialize,
    job_trace_context,
    serialize,
)
from ctxstore.tracing import job_span
from workers.logs import configure, error_text, mark_logged, redacted
from workers.sweep import sweep

__all__ = [
    "HEALTH_CHECK_INTERVAL",
    "MAX_JOBS",
    "MAX_TRIES",
    "SAMPLED_JOBS",
    "SAMPLE_SECONDS",
    "SummaryWorker",
    "build_worker",
    "close_sentinels",
    "health_check_key",
    "queue_redis_settings",
    "retry_delay",
    "sample",
    "summarize_session",
    "sweep_sessions",
    "worker_options",
]

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger("ctxstore.worker")

MAX_TRIES = 8
"""Tries of one summary job before arq gives it up (the sweep queues it again later)."""
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

_RETRY = "retried"
"""The tally's count of tries that ended in a retry (next to the SummaryStatus counts)."""


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


def retry_delay(job_try: int, retry_after: float | None = None) -> float:
    """Seconds before the next try: exponential from 2 s, capped at 5 min, jittered."""
    delay = min(300.0, 2.0 * 2 ** (job_try - 1)) * random.uniform(0.5, 1.5)
    return float(max(delay, retry_after or 0.0))


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
    """``anthropic``, ``local``, or the class of another summarizer."""
    if isinstance(summarizer, AnthropicSummarizer):
        return "anthropic"
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
        tally[_RETRY],
        extra={
            "event": "stop",
            "worker": settings.worker_name,
            "reason": why,
            "jobs": sum(counts.values()),
            **counts,
            "retried": tally[_RETRY],
        },
    )


def store_for(ctx: dict[str, Any], tenant: str) -> ContextStore:
    """The store of ``tenant``, on the worker's one shared connection."""
    base: ContextStore = ctx["base"]
    return base if tenant == base.tenant else base.for_tenant(tenant)


async def summarize_session(
    ctx: dict[str, Any], tenant: str, session: str, generation: int
) -> dict[str, Any]:
    """The job: bring one session's summary up to date.

    Retried through arq (with jittered backoff) while the summarizer is rate
    limited, overloaded or down, or while another worker or a writer holds
    the session's lease; a summarizer error that a retry cannot fix fails
    the job (and is recorded on the session, whose views keep truncating).
    Each try logs one line: its outcome, or its error and what happens next;
    and is one span, linked to the enqueue's span whose context the job
    carries (``ctxstore.summary_queue.job_trace_context``).
    """
    trace = job_trace_context()
    with job_span(tenant, session, generation, trace, int(ctx.get("job_try", 1))):
        return await _summarize(ctx, tenant, session, generation)


async def _summarize(
    ctx: dict[str, Any], tenant: str, session: str, generation: int
) -> dict[str, Any]:
    store = store_for(ctx, tenant)
    job = _JobLog(ctx, tenant, session, generation)
    log.debug("job started", extra=job.fields("started"))
    try:
        outcome = await store.summarize(session, ctx["summarizer"])
    except LeaseHeldError as exc:
        delay = retry_delay(job.job_try)
        job.retrying(exc, delay, logging.INFO)
        raise Retry(defer=delay) from exc
    except SummarizerUnavailableError as exc:
        if job.job_try >= MAX_TRIES:
            job.failed(exc)
            raise
        delay = retry_delay(job.job_try, exc.retry_after)
        job.retrying(exc, delay, logging.WARNING)
        raise Retry(defer=delay) from exc
    except Exception as exc:
        job.failed(exc)
        raise
    job.done(outcome)
    if outcome.next_generation:
        await _queue_next(ctx, tenant, session, outcome.next_generation, job)
    if store.settings.search_index:
        await _index(store, session, job)
    return {"tenant": tenant, "session": session, "generation": generation, **asdict(outcome)}


async def _queue_next(
    ctx: dict[str, Any], tenant: str, session: str, generation: int, job: _JobLog
) -> None:
    """Queue the job the commit handed out; a failure is logged, never the committed job's.

    The session's flag stays up with that generation, so the sweep queues it
    once its grace is over: a queue that did not answer costs a delay, not a
    summary, and never turns a committed job into a failed one.
    """
    try:
        await ctx["queue"].enqueue(tenant, session, generation)
    except CtxstoreError as exc:
        fields = {**job.fields("done"), "event": "enqueue", "next_generation": generation}
        log.warning("next summary job not queued (the sweep will): %s", exc, extra=fields)


async def _index(store: ContextStore, session: str, job: _JobLog) -> None:
    """Bring the session's search index up to date; a failure is logged, never the job's.

    A search indexes what is new itself, so an index left behind costs the
    next search time, never a result.
    """
    try:
        added = await store.index(session)
    except CtxstoreError as exc:
        fields = {**job.fields("failed"), "event": "index"}
        log.warning("search index not updated: %s", exc, extra=fields)
        return
    log.debug(
        "search index updated: %d entries", added, extra={**job.fields("done"), "event": "index"}
    )


class _JobLog:
    """The log lines of one try of one job, and the worker's tally of outcomes."""

    def __init__(self, ctx: dict[str, Any], tenant: str, session: str, generation: int) -> None:
        self.tally: Counter[str] = ctx["tally"]
        self.metrics: Metrics | None = ctx.get("metrics")
        self.model: str = getattr(ctx.get("summarizer"), "name", "")
        self.tenant = tenant
        self.session = session
        self.generation = generation
        self.job_try = int(ctx.get("job_try", 1))
        self.started = time.monotonic()

    def fields(self, outcome: str, **more: Any) -> dict[str, Any]:
        """The fields of this try's line."""
        return {
            "event": "job",
            "tenant": self.tenant,
            "session": self.session,
            "generation": self.generation,
            "try": self.job_try,
            "outcome": outcome,
            **more,
        }

    def done(self, outcome: SummaryOutcome) -> None:
        """The job ended: committed, idle, stale or lease_lost."""
        self.tally[outcome.status.value] += 1
        if self.metrics is not None:
            self.metrics.record_job(
                self.tenant, outcome.status.value, outcome.seconds, outcome, self.model
            )
        log.info(
            "job %s: %s/%s, %d entries",
            outcome.status.value,
            self.tenant,
            self.session,
            outcome.entries,
            extra=self.fields(
                outcome.status.value,
                entries=outcome.entries,
                tokens_in=outcome.input_tokens,
                tokens_out=outcome.summary_tokens,
                chunks=outcome.chunks,
                duration_ms=round(outcome.seconds * 1000),
                covers=outcome.covers_upto,
                next_generation=outcome.next_generation,
            ),
        )

    def retrying(self, exc: CtxstoreError, delay: float, level: int) -> None:
        """This try failed; arq runs the job again in ``delay`` seconds."""
        self.tally[_RETRY] += 1
        self._record(_RETRY)
        log.log(
            level,
            "job retry: %s/%s, %s; retrying in %.1f s (try %d of %d)",
            self.tenant,
            self.session,
            type(exc).__name__,
            delay,
            self.job_try + 1,
            MAX_TRIES,
            extra=self._failure("retry", exc, retry=True, retry_in_s=round(delay, 3)),
        )

    def failed(self, exc: Exception) -> None:
        """The job failed for good (arq does not run it again; the sweep may, later).

        A ctxstore error is logged without its traceback: its type, its
        cause's type and its text say what failed (a traceback would end in
        the raw text of the Redis error, which may quote a command's
        arguments). Anything else is a bug, and keeps its traceback.
        """
        self.tally[SummaryStatus.FAILED.value] += 1
        self._record(SummaryStatus.FAILED.value)
        bug = not isinstance(exc, CtxstoreError)
        log.error(
            "job failed: %s/%s, %s; not retried",
            self.tenant,
            self.session,
            type(exc).__name__,
            exc_info=exc if bug else None,
            extra=self._failure("failed", exc, retry=False),
        )
        mark_logged(exc)

    def _record(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.record_job(self.tenant, outcome, time.monotonic() - self.started)

    def _failure(self, outcome: str, exc: Exception, **more: Any) -> dict[str, Any]:
        # Nothing was covered; what was sent before the failure is not known here.
        return self.fields(
            outcome,
            entries=0,
            tokens_in=None,
            tokens_out=0,
            duration_ms=round((time.monotonic() - self.started) * 1000),
            error=type(exc).__name__,
            cause=type(exc.__cause__).__name__ if exc.__cause__ is not None else None,
            detail=error_text(exc),
            **more,
        )


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

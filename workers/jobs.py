"""The worker's jobs: bring one session's summary up to date, and the sweep's cron.

:func:`summarize_session` is the arq task a summary job runs: one try calls
the store's summarize with the worker's summarizer and retries through arq
(:func:`retry_delay`: jittered backoff, up to :data:`MAX_TRIES`) while the
summarizer is unavailable or the session's lease is held. Each try logs one
line (tenant, session, generation, outcome, entries covered, tokens in and
out, duration), counts in the worker's tally and its metrics, and is one span
linked to the enqueue that queued it. A committed job that hands out the
next generation queues it; with a search index, it brings the index up to
date. :func:`sweep_sessions` is the cron job that queues again what was lost.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from arq import Retry

from ctxstore import (
    ContextStore,
    CtxstoreError,
    LeaseHeldError,
    SummarizerUnavailableError,
    SummaryOutcome,
    SummaryStatus,
)
from ctxstore.metrics import Metrics
from ctxstore.summary_queue import job_trace_context
from ctxstore.tracing import job_span
from workers.logs import error_text, mark_logged
from workers.sweep import sweep

__all__ = [
    "MAX_TRIES",
    "RETRIED",
    "retry_delay",
    "store_for",
    "summarize_session",
    "sweep_sessions",
]

log = logging.getLogger("ctxstore.worker")

MAX_TRIES = 8
"""Tries of one summary job before arq gives it up (the sweep queues it again later)."""
RETRIED = "retried"
"""The tally's count of tries that ended in a retry (next to the SummaryStatus counts)."""


def retry_delay(job_try: int, retry_after: float | None = None) -> float:
    """Seconds before the next try: exponential from 2 s, capped at 5 min, jittered."""
    delay = min(300.0, 2.0 * 2 ** (job_try - 1)) * random.uniform(0.5, 1.5)
    return float(max(delay, retry_after or 0.0))


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
        self.tally[RETRIED] += 1
        self._record(RETRIED)
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

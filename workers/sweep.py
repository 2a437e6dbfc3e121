"""The sweep: queue again the summaries whose job was lost or failed long ago.

A pod that dies between its append and its enqueue leaves a session whose
summary flag is up with no job; arq gives a job up after its tries. The
worker's cron runs :func:`sweep` every minute to put those back on the queue.

Each sweep logs one line (tenants walked, sessions looked at, queued again,
waiting, skipped) and a warning for each tenant or session it had to skip.
Tenant and session ids read from Redis are untrusted: they are logged as
fields (escaped by :mod:`workers.logs`), never trusted to be well formed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ctxstore import ContextStore, CtxstoreError
from ctxstore.summary_queue import LIVE, SummaryQueue
from workers.logs import error_text

__all__ = ["SweepReport", "sweep"]

log = logging.getLogger("ctxstore.worker")


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
    # The tenants set is on the store's Redis, which may not be the queue's. Every
    # value read there is untrusted (a tenant's own user may write its index and add
    # to the tenants set): a bad one is skipped and logged, never stops the others.
    started = time.monotonic()
    tenants = await base.list_tenants()
    now_ms = int(time.time() * 1000)
    totals = [0, 0, 0, 0]  # looked at, queued, waiting, skipped
    for tenant in tenants:
        try:
            store = base if tenant == base.tenant else base.for_tenant(tenant)
            done = await _sweep_tenant(store, queue, now_ms, lookback_seconds, grace_seconds, limit)
        except CtxstoreError as exc:
            _skipped(exc, tenant)
            totals[3] += 1
            continue
        totals = [a + b for a, b in zip(totals, done, strict=True)]
    looked, queued, waiting, skipped = totals
    log.info(
        "sweep: %d tenants, %d sessions looked at, %d queued again, %d waiting, %d skipped",
        len(tenants),
        looked,
        queued,
        waiting,
        skipped,
        extra={
            "event": "sweep",
            "tenants": len(tenants),
            "sessions": looked,
            "queued": queued,
            "waiting": waiting,
            "skipped": skipped,
            "duration_ms": round((time.monotonic() - started) * 1000),
        },
    )
    return SweepReport(looked, queued, waiting)


def _skipped(exc: CtxstoreError, tenant: str, session: str | None = None) -> None:
    """Log a tenant or session the sweep could not look at, and why (ids quoted: untrusted)."""
    what = f"tenant {tenant!r}" if session is None else f"session {session!r} of tenant {tenant!r}"
    detail = error_text(exc)
    log.warning(
        "sweep: skipped %s (%s: %s)",
        what,
        type(exc).__name__,
        detail,
        extra={
            "event": "sweep_skip",
            "tenant": tenant,
            "session": session,
            "error": type(exc).__name__,
            "detail": detail,
        },
    )


async def _sweep_tenant(
    store: ContextStore,
    queue: SummaryQueue,
    now_ms: int,
    lookback_seconds: float,
    grace_seconds: float,
    limit: int,
) -> tuple[int, int, int, int]:
    """Sweep one tenant; (looked at, queued, waiting, skipped)."""
    settings = queue.settings
    tenant = store.tenant
    looked = queued = waiting = skipped = 0
    for row in await store.list_sessions(limit=limit):
        if row.last_active_ms < now_ms - lookback_seconds * 1000:
            continue  # not break: a score written by hand may put an old row first
        looked += 1
        try:
            info = await store.info(row.session, pins=False)
        except CtxstoreError as exc:
            _skipped(exc, tenant, row.session)
            skipped += 1
            continue
        if not info.exists:
            continue
        if not info.summary_due:
            if 0 < settings.summary_trigger_tokens <= info.tokens_unsummarized:
                generation = await store.request_summary(row.session)
                if generation and await queue.enqueue(tenant, row.session, generation):
                    queued += 1
            continue
        status = await queue.status(tenant, row.session, info.summary_generation)
        if status in LIVE:
            waiting += 1
            continue
        failed_at = info.summary_failed_at_ms
        if failed_at and now_ms - failed_at < settings.summary_retry_seconds * 1000:
            continue
        if (info.summary_due_since_ms or 0) > now_ms - grace_seconds * 1000:
            continue
        generation = await store.request_summary(row.session, force=True)
        if generation and await queue.enqueue(tenant, row.session, generation):
            log.info(
                "sweep: queued %s/%s again (generation %d)",
                tenant,
                row.session,
                generation,
                extra={
                    "event": "sweep_queued",
                    "tenant": tenant,
                    "session": row.session,
                    "generation": generation,
                },
            )
            queued += 1
    return looked, queued, waiting, skipped

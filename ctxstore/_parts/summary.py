"""Summaries: the worker's job, the request for one, and where a summary may cut.

The job (:meth:`Summaries.run`) takes the session's ``summary`` lease, reads
the watermark W and epoch E, covers the entries after W up to a cut that
leaves ``summary_keep_tokens`` raw and never splits a tool exchange, asks the
summarizer (in chunks of ``summary_chunk_tokens``, each folded into the
running summary), and commits only if the lease, the epoch and W are
unchanged (``summary_commit.lua``). The raw stream is never rewritten.

:func:`summary_cut` and :func:`summary_chunks` are pure.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxstore._layout.codec import Entry, Meta, Reply, current_covers, summary_message, text
from ctxstore._layout.formats import earliest_callers
from ctxstore._parts.scope import Scope
from ctxstore._plan.pairs import bind_ties
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.errors import StoreFullError, SummarizerError
from ctxstore.lease import Lease, clock_arg, take_lease
from ctxstore.models import Summary, SummaryOutcome, SummaryStatus
from ctxstore.tokens import count_message

if TYPE_CHECKING:
    from ctxstore._layout.keys import SessionKeys
    from ctxstore._parts.reads import Reader
    from ctxstore._parts.snapshot import Snapshot
    from ctxstore.settings import Settings
    from ctxstore.summarizers import Summarizer
    from ctxstore.summary_queue import Handoff

__all__ = ["Summaries", "keep_tokens", "summary_chunks", "summary_cut"]


class Summaries:
    """One tenant's summaries: run the job, ask for one.

    Args:
        scope: The tenant's scope.
        reader: Reads the entries a job covers.
        handoff: Where a summary a view asks for goes.
    """

    def __init__(self, scope: Scope, reader: Reader, handoff: Handoff) -> None:
        self._scope = scope
        self._reader = reader
        self._handoff = handoff

    async def run(self, session: str, summarizer: Summarizer) -> SummaryOutcome:
        """Bring the session's cached summary up to date (see ``ContextStore.summarize``)."""
        keys = self._scope.keys(session)
        started = time.monotonic()
        lease = await take_lease(self._scope, session, kind="summary", wait_s=0)
        try:
            async with lease.kept_alive():
                return await self._run(session, keys, summarizer, lease, started)
        finally:
            await lease.release()

    async def _run(
        self,
        session: str,
        keys: SessionKeys,
        summarizer: Summarizer,
        lease: Lease,
        started: float,
    ) -> SummaryOutcome:
        settings = self._scope.settings
        codec = self._scope.codec
        meta, view_raw, protected, anchored = await self._scope.connection.transaction(
            [
                ("HMGET", keys.meta, Meta.EPOCH, Meta.WATERMARK, Meta.WATERMARK_TOKENS, Meta.LIFE),
                ("HMGET", keys.view, "l1", "l2", "state", "covers", "epoch"),
                ("HKEYS", keys.keep),
                ("HKEYS", keys.anchor),  # the budgets the session is viewed with
            ],
            session=session,
            key=keys.meta,
        )
        job = _Job(
            session,
            keys,
            text(meta[0] or b"0"),
            text(meta[3] or b""),
            text(meta[1] or b""),
            lease,
            started,
        )
        current = current_covers(view_raw[3], view_raw[4], meta[0] or b"0", meta[1])
        previous = codec.previous(session, view_raw[:3]) if job.watermark and current else None
        # Without a usable summary, start over from the first message.
        after = job.watermark if previous else ""
        entries = [e async for e in self._reader.entries_after(session, keys, after)]
        keep = keep_tokens(settings, _budgets(anchored))
        cut = summary_cut(entries, keep, open_window=keep + settings.summary_trigger_tokens)
        if cut == 0:
            reply = await self._commit(job, SummaryStatus.IDLE, ())
            return job.outcome(SummaryStatus.IDLE, next_generation=_next_generation(reply))
        covered = entries[:cut]
        skip = {text(k) for k in protected}  # sent by every view anyway
        to_send = [e for e in covered if e.entry_id not in skip]
        if not to_send and previous is None:
            # All it would cover is pinned or system, and there is no summary to carry
            # forward: nothing to summarize until unprotected entries come into the cut.
            reply = await self._commit(job, SummaryStatus.IDLE, ())
            return job.outcome(SummaryStatus.IDLE, next_generation=_next_generation(reply))
        counter = self._scope.counter
        input_tokens = counter.count(previous.text) if previous is not None else 0
        chunks = summary_chunks(to_send, max(1_000, settings.summary_chunk_tokens - input_tokens))
        summary = previous
        try:
            # A tool result goes in whole, unless it would take more than a quarter of a
            # chunk: then as its preview (head and tail).
            whole = settings.summary_chunk_tokens // 4
            for chunk in chunks:
                messages = [
                    e.message if e.tokens <= whole else (e.preview or e.message) for e in chunk
                ]
                input_tokens += sum(e.tokens if e.tokens <= whole else e.cheapest for e in chunk)
                summary = await _fold(summarizer, summary, messages, settings)
        except SummarizerError as exc:
            await self._commit(job, SummaryStatus.FAILED, (" ".join(str(exc).split())[:500],))
            raise
        assert summary is not None  # a chunk was folded, or the previous summary carries on
        role = settings.summary_role
        level_1 = count_message(counter, summary_message(summary.ledger, role))
        level_2 = count_message(counter, summary_message(summary.text, role))
        wm_tokens = (int(meta[2] or 0) if previous else 0) + sum(e.tokens for e in covered)
        covers = covered[-1].entry_id
        reply = await self._commit(
            job,
            SummaryStatus.COMMITTED,
            (
                covers,
                wm_tokens,
                codec.seal(session, summary.ledger.encode()),
                level_1,
                summarizer.name,
                codec.seal(session, summary.narrative.encode()) if summary.narrative else "",
                level_2 if summary.narrative else 0,
                codec.seal(session, summary.state.encode()) if summary.state else "",
            ),
        )
        done = dict(
            entries=len(covered),
            input_tokens=input_tokens,
            summary_tokens=level_2 if summary.narrative else level_1,
            chunks=len(chunks),
        )
        status = text(reply[0])
        if status != Reply.OK:
            lost = status == Reply.LEASE_LOST
            return job.outcome(SummaryStatus.LEASE_LOST if lost else SummaryStatus.STALE, **done)
        return job.outcome(
            SummaryStatus.COMMITTED,
            covers_upto=covers,
            next_generation=_next_generation(reply),
            **done,
        )

    async def _commit(self, job: _Job, mode: SummaryStatus, extra: tuple[Any, ...]) -> Any:
        """Run summary_commit.lua for ``job`` in ``mode`` (committed, idle or failed)."""
        return await self._scope.connection.script(
            SCRIPTS.summary_commit,
            (job.keys.meta, job.keys.view, job.keys.lease),
            (
                mode.value,
                job.lease.token,
                job.lease.fence,
                job.lease.now_arg(),
                f"{job.epoch} {job.life}",
                job.watermark,
                self._scope.settings.summary_trigger_tokens,
                int((time.monotonic() - job.started) * 1000),
                *extra,
            ),
            session=job.session,
        )

    async def request(self, session: str, *, force: bool = False) -> int:
        """Flag the session for a summary; the job generation to queue (0: none)."""
        keys = self._scope.keys(session)
        generation = await self._scope.connection.script(
            SCRIPTS.summary_request,
            (keys.meta, keys.idem, keys.idem_old),
            # The call's id: a retry after a lost reply gets the generation it raised.
            (
                clock_arg(self._scope.clock),
                "1" if force else "0",
                secrets.token_urlsafe(9),
                self._scope.period_ms,
            ),
            session=session,
        )
        return int(generation)

    async def ask_if_needed(self, session: str, snap: Snapshot, budget: int) -> None:
        """After a view: queue a summary when the budget it was read with calls for one.

        Summaries follow the pressure the views see: once the history nears the
        budget (its low-water share) and a job would cover ``summary_pressure``
        of the budget (past the watermark, less the raw tail it keeps), a job is
        queued, so a summary is ready
        before the view must drop what it would cover. Not while one is due,
        nor after a job found nothing to cover (a tool exchange still open)
        until half as much again was written.
        """
        settings = self._scope.settings
        if settings.summary_trigger_tokens <= 0 or snap.summary_due:
            return
        pressure = settings.summary_pressure * budget
        if snap.summary_idle is not None and snap.tokens - snap.summary_idle < pressure / 2:
            return
        if snap.tokens < settings.view_low_water * budget:
            return
        # What a job would cover: past the watermark, less the tail it leaves raw.
        keep = keep_tokens(settings, (budget,))
        if snap.unsummarized - keep < pressure:
            return
        try:
            generation = await self.request(session)
        except StoreFullError:
            return  # a full Redis records no request: a later view asks again
        if generation:
            await self._handoff.due(self._scope.tenant, session, generation)


@dataclass(frozen=True, slots=True)
class _Job:
    """A summary job in progress: what it read, and under which lease."""

    session: str
    keys: SessionKeys
    epoch: str
    life: str
    """The session's life it read in (``Meta.LIFE``): an expiry and a new first
    write start another life at the same epoch and watermark."""
    watermark: str
    lease: Lease
    started: float

    def outcome(self, status: SummaryStatus, **fields: Any) -> SummaryOutcome:
        return SummaryOutcome(status, seconds=time.monotonic() - self.started, **fields)


async def _fold(
    summarizer: Summarizer,
    previous: Summary | None,
    messages: list[dict[str, Any]],
    settings: Settings,
) -> Summary:
    """Fold ``messages`` into ``previous`` with the summarizer: at two levels if it can.

    A summarizer with only the one-level protocol (``summarize``) gets the
    previous text and gives one level back: its text is the ledger.
    """
    levels = getattr(summarizer, "summarize_levels", None)
    if levels is not None:
        summary = await levels(
            previous,
            messages,
            max_tokens=settings.summary_max_tokens,
            ledger_tokens=settings.summary_ledger_tokens,
        )
        if isinstance(summary, Summary):
            return summary
        return Summary(summary.ledger, summary.narrative, summary.state)
    text_ = await summarizer.summarize(
        previous.text if previous is not None else None,
        messages,
        max_tokens=settings.summary_max_tokens,
    )
    return Summary(text_)


def keep_tokens(settings: Settings, budgets: Iterable[int]) -> int:
    """The newest tokens a summary leaves raw, for a session viewed with ``budgets``.

    ``summary_keep_tokens``, or less for a small budget: a view's raw part
    holds only part of its budget, and it must reach back to what the summary
    covers, or what lies between is in neither.
    """
    smallest = min(budgets, default=0)
    if smallest <= 0:
        return settings.summary_keep_tokens
    return min(settings.summary_keep_tokens, int(settings.summary_keep_share * smallest))


def _budgets(fields: Sequence[Any]) -> list[int]:
    """The budgets of a session's anchors (the anchor hash's fields that name one)."""
    return [int(f) for f in map(text, fields) if f.isdigit()]


def _next_generation(reply: Any) -> int:
    return int(reply[1]) if text(reply[0]) == Reply.OK and len(reply) > 1 else 0


def summary_cut(entries: Sequence[Entry], keep_tokens: int, open_window: int = 0) -> int:
    """How many of ``entries`` (oldest first, all after the watermark) a summary covers.

    At least ``keep_tokens`` stay raw at the end, and the cut never falls
    inside a tool exchange: a message that makes calls and every message
    answering them end up on the same side. A call not answered yet (a tool
    still running) holds the cut before it too, unless more than
    ``open_window`` tokens came after it (then it is taken as abandoned;
    views strip unanswered calls). A reasoning item and the item after it
    are an exchange (:func:`~ctxstore._plan.pairs.bind_ties`). Returns 0 when
    nothing may be covered.
    """
    entries = bind_ties(entries)
    used = 0
    cut = len(entries)
    while cut > 0 and used < keep_tokens:
        cut -= 1
        used += entries[cut].tokens
    if used < keep_tokens:
        return 0
    answered = {rid for e in entries for rid in e.results}
    after = 0
    for index in range(len(entries) - 1, -1, -1):
        if after > open_window:
            break
        if index < cut and any(cid not in answered for cid in entries[index].calls):
            cut = index  # a tool still running: its call stays raw
        after += entries[index].tokens
    earliest = earliest_callers(entries)
    while cut > 0 and earliest[cut] < cut:
        cut = earliest[cut]  # keep the whole exchange raw
    return cut


def summary_chunks(entries: Sequence[Entry], limit: int) -> list[list[Entry]]:
    """Split ``entries`` into runs of at most ``limit`` tokens, between exchanges when possible.

    A run ends where no exchange spans the boundary; an exchange larger than
    ``limit`` gets a run of its own (split only if a single message is over).
    """
    earliest = earliest_callers(entries)
    chunks: list[list[Entry]] = []
    start = 0
    while start < len(entries):
        end = start
        used = 0
        safe = start  # the last end at which no exchange is cut
        while end < len(entries) and (end == start or used + entries[end].tokens <= limit):
            used += entries[end].tokens
            end += 1
            if earliest[end] >= end:
                safe = end
        stop = safe if safe > start else end
        chunks.append(list(entries[start:stop]))
        start = stop
    return chunks

"""Forks: a new session whose history is another's up to a point, made in bounded time.

``fork(source, new, at)`` never copies a history: the new session's *chain*
(:mod:`ctxstore._parts.lineage`) names the source's frozen segments, and only what
its views read most is copied into its own live log: the newest entries up
to the fork point (the *bridge*, at most ``bridge_tokens`` and
``bridge_entries``), the protected copies and the summary in force there.
So a fork of a 10,000-message session costs what a fork of a 100-message one
costs, and its request view is one round trip on its own slot, as any view
is; a view that needs more (a budget past the bridge, no summary yet) reads
on into the segments, as ``get_messages``, ``read``, ``iter_history``,
``search`` and the summary worker do, in later round trips.

The source's live log is shared only once frozen (``freeze.lua``: renamed,
its newest part copied back), so nothing the source does later (appends,
pops, rewinds, replaces, its delete or expiry) changes what the fork reads;
a source whose part up to the fork point is small is copied instead, and
left as it was. The fork is recorded as a reader of every segment it names
before it is written, with a deadline: a release racing the fork keeps them.
The two sessions then diverge independently, in the same tenant.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxstore._layout.chain import Chain, Row, Segment, row_fields
from ctxstore._layout.codec import (
    SUMMARY_COPY,
    SUMMARY_SEALED,
    Meta,
    Reply,
    current_covers,
    raw_pairs,
    text,
)
from ctxstore._layout.formats import entry_order
from ctxstore._parts.checkpoints import Checkpoints
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.scope import Scope
from ctxstore._parts.summary import Summaries
from ctxstore._parts.writes import Writer
from ctxstore._redis.connection import Commands
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.index import RESERVATION_MS
from ctxstore._tenant.quotas import Limits, Quotas, quota_error
from ctxstore.errors import (
    EntryNotFoundError,
    EpochChangedError,
    InvalidInputError,
    SessionExistsError,
    SessionNotFoundError,
    StoreUnavailableError,
)
from ctxstore.models import Checkpoint, ForkResult
from ctxstore.summary_queue import Handoff

__all__ = ["Forks"]

_ATTEMPTS = 4
"""Forks tried when the source keeps changing between the read and the write."""
_FIRST_PAGE = 64
"""The source's newest entries a fork reads first (then more, in growing pages)."""
_RS = b"\x1e"


@dataclass(slots=True)
class _Plan:
    """What a fork writes, read from the source."""

    at: str
    chain: Chain
    rows: list[Row]
    counts: tuple[int, int]
    first_id: str
    deadline: int
    summary: dict[str, bytes] = field(default_factory=dict)
    wm_tokens: int = 0
    keep: list[tuple[str, bytes]] = field(default_factory=list)
    frozen: tuple[str, str] | None = None
    source: tuple[int, int] = (0, 0)  # the source's tokens and bytes


class Forks:
    """One tenant's forks.

    Args:
        scope: The tenant's scope.
        quotas: The tenant's limits.
        lineage: The tenant's segments.
        checkpoints: The tenant's checkpoints (a fork may start at one).
        writer: Creates the new session under the tenant's index.
        summaries: Asks for a summary of a fork that has none.
        handoff: Where that summary goes.
    """

    def __init__(
        self,
        scope: Scope,
        quotas: Quotas,
        lineage: Lineage,
        checkpoints: Checkpoints,
        writer: Writer,
        summaries: Summaries,
        handoff: Handoff,
    ) -> None:
        self._scope = scope
        self._quotas = quotas
        self._lineage = lineage
        self._checkpoints = checkpoints
        self._writer = writer
        self._summaries = summaries
        self._handoff = handoff

    async def _refuse_existing(self, target: str) -> None:
        """Refuse a fork onto a session that exists before the source is touched.

        Planning may freeze the source's log into a segment (the same history,
        elsewhere): a fork bound to be refused should not. The script checks
        again, atomically, for a session created in between.
        """
        meta = self._scope.keys(target).meta
        (exists,) = await self._scope.connection.transaction(
            [("HEXISTS", meta, Meta.SEQ)], session=target, key=meta
        )
        if exists:
            raise SessionExistsError(
                "a fork cannot write over a session that exists",
                tenant=self._scope.tenant,
                session=target,
            )

    async def fork(self, source: str, target: str, at: str | Checkpoint | None) -> ForkResult:
        """Start ``target`` from ``source``'s history up to ``at`` (see ``ContextStore.fork``)."""
        self._scope.keys(source)
        self._scope.keys(target)
        if source == target:
            raise InvalidInputError("a fork needs a session id of its own", session=source)
        point, checkpoint = "", None
        if at is not None:
            point, checkpoint = await self._checkpoints.resolve(source, at)
        limits = await self._quotas.resolved(target)
        await self._refuse_existing(target)
        call = secrets.token_urlsafe(9)  # this call's id: its retries are answered
        for _ in range(_ATTEMPTS):
            plan = await self._plan(source, target, point, checkpoint)
            if plan is None:
                continue  # the source changed under the read: read it again
            if plan.frozen is not None:
                await self._lineage.register([plan.frozen])
            held = await self._lineage.hold(
                plan.chain.segments,
                target,
                ttl_ms=limits.ttl_ms or None,
                pending_until=plan.deadline,
            )
            if not held:
                continue  # a segment went (the source was deleted): read it again
            reply = await self._create(source, target, plan, limits, call)
            status = text(reply[0])
            if status == Reply.EXPIRED:
                continue  # too slow for the segments' hold: do it again
            if status == Reply.EXISTS:
                raise SessionExistsError(
                    "a fork cannot write over a session that exists",
                    tenant=self._scope.tenant,
                    session=target,
                )
            if status == Reply.QUOTA:
                raise quota_error(
                    reply,
                    tenant=self._scope.tenant,
                    session=target,
                    key=self._scope.keys(target).meta,
                )
            if status != Reply.OK:
                raise StoreUnavailableError(
                    "the fork kept missing its index reservation; nothing was written",
                    tenant=self._scope.tenant,
                    session=target,
                )
            # It exists now: its holding of the segments needs no deadline any more.
            await self._lineage.hold(plan.chain.segments, target, ttl_ms=limits.ttl_ms or None)
            if plan.chain and not plan.summary:
                # Its views see only the copied part until a summary covers the rest.
                generation = await self._summaries.request(target)
                if generation:
                    await self._handoff.due(self._scope.tenant, target, generation)
            return ForkResult(
                session=target,
                source=source,
                at=plan.at,
                count=plan.counts[0],
                tokens=plan.counts[1],
                epoch=int(reply[1]),
                seq=int(reply[2]),
                copied=len(plan.rows),
            )
        raise EpochChangedError(-1, -1, tenant=self._scope.tenant, session=source)

    async def _plan(
        self, source: str, target: str, point: str, checkpoint: Checkpoint | None
    ) -> _Plan | None:
        """Read what the fork writes; freeze the source's log first if it must be shared.

        ``None`` when the source changed under the read.

        Raises:
            SessionNotFoundError: The source does not exist.
            EntryNotFoundError: The fork point is not in its history.
        """
        keys = self._scope.keys(source)
        settings = self._scope.settings
        cap = settings.bridge_entries
        named = checkpoint.checkpoint_id if checkpoint else None
        copies = [f"{named}:{name}" for name in SUMMARY_COPY] if named else []
        now, meta, view, keep, branched, newest, *sums = await self._scope.connection.transaction(
            [
                ("TIME",),
                (
                    *("HMGET", keys.meta, Meta.SEQ, Meta.EPOCH, Meta.LIFE, Meta.COUNT),
                    *(Meta.TOKENS, Meta.LAST_ID, Meta.FIRST_ID, Meta.CHAIN, Meta.WATERMARK),
                    Meta.WATERMARK_TOKENS,
                    Meta.BYTES,
                ),
                ("HMGET", keys.view, *SUMMARY_COPY),
                ("HGETALL", keys.keep),
                ("HVALS", keys.branches),
                ("XREVRANGE", keys.log, "+", "-", "COUNT", _FIRST_PAGE),
                *([("HMGET", keys.checkpoint_summaries, *copies)] if copies else []),
            ],
            session=source,
            key=keys.meta,
        )
        seq, epoch, life, count, tokens, last, first, raw_chain, wm, wm_tokens, held = meta
        if seq is None:
            raise SessionNotFoundError(
                "no such session", tenant=self._scope.tenant, session=source, key=keys.meta
            )
        # The end unless named: a checkpoint of an empty history names "" (so is the fork).
        at = point if point or checkpoint is not None else text(last or b"")
        chain = Chain.parse(raw_chain)
        deadline = int(now[0]) * 1000 + int(now[1]) // 1000 + RESERVATION_MS
        plan = _Plan(at, chain, [], (0, 0), text(first or b"") if at else "", deadline)
        # The source's bytes, less what its branches hold: the fork shares none of those.
        plan.source = (int(tokens or 0), int(held or 0) - _branch_bytes(branched))
        if not at:
            return plan  # an empty history
        # The summary in force, if it covers only what the fork keeps; else the checkpoint's.
        covers = current_covers(view[4], view[5], epoch or b"0", wm)
        # An empty value is copied too: a summary of messages with nothing to keep has an
        # empty ledger, and a job folding into the fork's summary reads it.
        if covers and entry_order(covers) <= entry_order(at):
            plan.summary = {n: v for n, v in zip(SUMMARY_COPY, view, strict=True) if v is not None}
            plan.wm_tokens = int(wm_tokens or 0)
        elif checkpoint is not None and checkpoint.summary_covers and sums:
            plan.summary = {
                n: v for n, v in zip(SUMMARY_COPY, sums[0], strict=True) if v is not None
            }
            plan.wm_tokens = checkpoint.covered_tokens
        at_order = entry_order(at)
        plan.keep = [(text(k), v) for k, v in raw_pairs(keep) if entry_order(text(k)) <= at_order]
        if checkpoint is not None:
            plan.counts = (checkpoint.count, checkpoint.tokens)
        if chain and at_order <= entry_order(chain.base):
            return await self._from_chain(plan, chain)
        read = await self._newest(source, list(newest), epoch)
        if read is None:
            return None  # rewritten meanwhile: read it again
        newest, exhausted = read
        ids = [text(row[0]) for row in newest]
        if at not in ids and not await self._in_log(source, at):
            raise EntryNotFoundError(
                f"entry {at} is not in the history",
                tenant=self._scope.tenant,
                session=source,
                key=keys.log,
            )
        if at in ids:
            after = newest[: ids.index(at)]
            if checkpoint is None:
                plan.counts = (
                    int(count or 0) - len(after),
                    int(tokens or 0) - sum(int(row_fields(r).get(b"t", b"0")) for r in after),
                )
            part = newest[ids.index(at) :]
            size = sum(int(row_fields(r).get(b"t", b"0")) for r in part)
            if exhausted and len(newest) <= cap and size <= settings.bridge_tokens:
                # Small enough to copy: the source stays as it is.
                plan.rows = [(source, row) for row in reversed(part)]
                return plan
        # Share it: freeze the source's log, keeping its newest part live.
        segment = secrets.token_urlsafe(9)
        seg = self._lineage.keys(source, segment)
        bound = _self_bound(newest, settings)
        limits = await self._quotas.resolved(target)
        reply = await self._scope.connection.script(
            SCRIPTS.freeze,
            (keys.log, keys.meta, seg.log, seg.info),
            (
                text(epoch or b"0"),
                text(life or b""),
                str(chain),
                bound,
                at,
                source,
                target,
                deadline,
                limits.ttl_ms,
                "",
                segment,
            ),
            session=source,
        )
        if text(reply[0]) != Reply.OK:
            return None
        plan.frozen = (source, segment)
        shared = Chain((*chain.segments, Segment(source, segment, text(reply[1]))))
        return await self._from_chain(plan, shared)

    async def _from_chain(self, plan: _Plan, chain: Chain) -> _Plan:
        """Fill in a fork whose point is in ``chain``: its bridge, its chain and counters."""
        settings = self._scope.settings
        if plan.counts == (0, 0):
            counts = await self._lineage.counts_at(chain, plan.at)
            if counts is None:
                raise EntryNotFoundError(
                    f"entry {plan.at} is not in the history", tenant=self._scope.tenant
                )
            plan.counts = counts
        plan.rows, bound = await self._lineage.bridge(
            chain, plan.at, tokens=settings.bridge_tokens, entries=settings.bridge_entries
        )
        plan.chain = chain.upto(bound) if bound else Chain()
        return plan

    async def _newest(
        self, source: str, rows: list[Any], epoch: Any
    ) -> tuple[list[Any], bool] | None:
        """The source's newest entries, read back in growing pages from ``rows``.

        Until the log's start, or past what a fork could copy
        (``bridge_entries``, ``bridge_tokens``): a long log costs a few small
        reads, not one of ``bridge_entries``. Returns the rows and whether
        they reach the log's start; ``None`` when the epoch moved between pages.
        """
        keys = self._scope.keys(source)
        settings = self._scope.settings
        asked = _FIRST_PAGE
        used = sum(int(row_fields(r).get(b"t", b"0")) for r in rows)
        while True:
            if len(rows) < asked:
                return rows, True
            if len(rows) > settings.bridge_entries or used > settings.bridge_tokens:
                return rows, False
            asked = min(len(rows) * 3, settings.bridge_entries + 1 - len(rows))
            now, more = await self._scope.connection.transaction(
                [
                    ("HGET", keys.meta, Meta.EPOCH),
                    ("XREVRANGE", keys.log, "(" + text(rows[-1][0]), "-", "COUNT", asked),
                ],
                session=source,
                key=keys.log,
            )
            if now != epoch:
                return None
            rows += more
            used += sum(int(row_fields(r).get(b"t", b"0")) for r in more)
            asked = len(rows) if len(more) == asked else len(rows) + 1

    async def _in_log(self, source: str, entry_id: str) -> bool:
        keys = self._scope.keys(source)
        (rows,) = await self._scope.connection.transaction(
            [("XRANGE", keys.log, entry_id, entry_id, "COUNT", 1)], session=source, key=keys.log
        )
        return bool(rows)

    async def _create(
        self, source: str, target: str, plan: _Plan, limits: Limits, call: str
    ) -> Any:
        """Write the new session (``fork.lua``), listed in the tenant's index first."""
        keys = self._scope.keys(target)
        reseal = self._scope.codec.reseal
        summary: list[Any] = []
        for name, value in plan.summary.items():
            if name in SUMMARY_SEALED:
                value = reseal(source, target, value)
            if name != "epoch":
                summary += [name, value]
        kept: list[Any] = []
        for entry_id, value in plan.keep:
            kind, tokens, calls, results, data = value.split(_RS, 4)
            copy = _RS.join((kind, tokens, calls, results, reseal(source, target, data)))
            kept += [entry_id, copy]
        args = (
            call,
            None,  # the reservation: filled in by each run
            None,
            plan.deadline,
            "",
            limits.ttl_arg,
            self._scope.period_ms,
            limits.session_bytes,
            limits.session_tokens,
            limits.appends_per_second,
            limits.append_burst,
            *plan.counts,
            plan.first_id,
            plan.at,
            str(plan.chain),
            plan.chain.base,
            f"{source} {plan.at}",
            text(plan.summary.get("covers", b"")),
            plan.wm_tokens,
            _shared_bytes(plan),
            len(summary) // 2,
            *summary,
            len(kept) // 2,
            *kept,
            *self._lineage.bridge_args(target, plan.rows, plan.counts),
        )

        async def run(reservation: tuple[str, int], after: Commands) -> Any:
            return await self._scope.connection.script(
                SCRIPTS.fork,
                (keys.log, keys.meta, keys.keep, keys.view, keys.gone, keys.idem, keys.idem_old),
                (args[0], *reservation, *args[3:]),
                session=target,
                replicas=self._scope.settings.replica_acks,
                refused=lambda reply: text(reply[0]) != Reply.OK,
                after=after,
            )

        return await self._writer.listed(target, limits, run)


def _branch_bytes(records: Sequence[bytes]) -> int:
    """The bytes a session's branches hold against its quota (their records', rewind.lua's)."""
    total = 0
    for raw in records:
        try:
            total += int(json.loads(raw).get("bytes", 0))
        except (ValueError, TypeError, AttributeError):
            continue  # unreadable: its bytes are charged to the fork too (a quota errs safe)
    return total


def _shared_bytes(plan: _Plan) -> int:
    """The bytes a fork holds by reference: its share of the source's, by tokens.

    Entries carry their tokens before them, not their bytes, so the part of
    the history a fork shares (up to the fork point, less the bridge it
    copies) is charged the source's bytes per token, its pinned copies set
    aside (the fork copies and charges those): exact for a fork at the end of a
    history of one kind of message, and never nothing, so forking and deleting
    the source cannot grow a history past ``session_bytes``.
    """
    tokens, held = plan.source
    held -= sum(len(copy) for _, copy in plan.keep)  # pinned copies: charged as copied
    copied = sum(int(row_fields(row).get(b"t", b"0")) for _, row in plan.rows)
    shared = max(0, plan.counts[1] - copied)
    if not tokens or not shared or held <= 0:
        return 0
    return -(-held * min(shared, tokens) // tokens)  # rounded up: a quota errs on the safe side


def _self_bound(newest: list[Any], settings: Any) -> str:
    """Where the source's new live log starts when its log is frozen for a fork.

    The newest entries within ``bridge_tokens`` and ``bridge_entries`` (at
    least the newest one) stay live: what its views read most; a view that
    needs older ones reads on into the segment.
    """
    used = 0
    for index, row in enumerate(newest):
        size = int(row_fields(row).get(b"t", b"0"))
        if index and (index >= settings.bridge_entries or used + size > settings.bridge_tokens):
            return text(row[0])
        used += size
    return text(newest[-1][0])

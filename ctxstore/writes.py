"""Writes: appends (lock-free, idempotent) and rewrites (fenced by the lease).

An append counts each message's tokens once, validates and serializes it,
and runs ``append.lua``: it drops retries whose idempotency key it has seen,
refuses a stale append-if or a write over a quota, adds the entries and
bumps the counters, all in one step; Redis orders concurrent appends.
Replace and clear run ``rewrite.lua`` under the session's lease: the epoch
is bumped and the cached summary dropped in the same step.

Every write first puts the session in the tenant's index (it lives in
another slot) and takes it out again if the write was refused and the
session does not exist.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ctxstore._codec import Kind, Meta, Reply, join_ids, text
from ctxstore._connection import Commands
from ctxstore._formats import REASONING, item_type
from ctxstore._keys import SessionKeys
from ctxstore._scope import Memo, Scope
from ctxstore._scripts import SCRIPTS
from ctxstore._validate import (
    MAX_TTL_SECONDS,
    check_entry_id,
    check_idempotency_keys,
    check_int,
    check_messages,
)
from ctxstore._warm_views import WarmViews
from ctxstore.errors import (
    ConflictError,
    CtxstoreError,
    InvalidInputError,
    InvalidMessageError,
    SessionNotFoundError,
    StoreUnavailableError,
)
from ctxstore.lease import Lease, clock_arg, fenced
from ctxstore.lineage import Chain, Lineage, row_fields
from ctxstore.lineage import held as held_segments
from ctxstore.messages import check_message
from ctxstore.models import AppendResult, StoredMessage, WriteResult
from ctxstore.offload import make_preview
from ctxstore.summary_queue import Handoff
from ctxstore.tenancy import (
    NO_RESERVATION,
    Limits,
    Quotas,
    Reservation,
    TenantIndex,
    quota_error,
)
from ctxstore.tokens import count_message

__all__ = ["Writer"]

_PROTECTED_ROLES = frozenset({"system", "developer"})

_REFUSALS = frozenset({Reply.RESERVE, Reply.CONFLICT, Reply.QUOTA, Reply.LEASE_LOST, Reply.KEYS})

ListedWrite = Callable[[tuple[str, int], Commands], Awaitable[Any]]
"""A write run by ``Writer.listed``: given a reservation (or none) and commands to send after."""


def _reasoning_glue(messages: Sequence[Any]) -> dict[tuple[str, int], tuple[str, ...]]:
    """Bind each OpenAI Responses reasoning item to the item after it in the batch.

    The API refuses a reasoning item sent without the item it led to (and
    that item without its reasoning), so the pair is stored as an exchange:
    the reasoning "calls" an id of its own that the next item "answers".
    Views and summaries then never cut between them, as between a tool call
    and its result. Returns the extra (call or result) ids by message index.
    """
    glue: dict[tuple[str, int], tuple[str, ...]] = {}
    for index in range(len(messages) - 1):
        message = messages[index]
        if isinstance(message, dict) and item_type(message) == REASONING:
            tie = f"~reasoning:{secrets.token_urlsafe(9)}"
            glue[("calls", index)] = (tie,)
            glue[("results", index + 1)] = (tie,)
    return glue


def _refused(reply: Any) -> bool:
    """True for a write script's refusal: it wrote nothing, so no replica need have it."""
    return isinstance(reply, list) and bool(reply) and text(reply[0]) in _REFUSALS


_HEAD_WORDS, _MESSAGE_WORDS = 5, 4
"""An applied append's reply: its words before the first message's, and per message."""


def _appended(reply: bytes, count: int) -> list[Any]:
    """The list an append's ``ok`` reply of ``count`` messages stands for.

    The script answers ``ok`` in one string (see append.lua's Returns): Redis
    spent some 8,600 instructions sending a table of ten, and the string saves
    an append some 7,000 (4.5%) with its join. Its words are: ``ok``, the due
    generation, created (0/1), the TTL and the ms the keys have left (empty
    for none), then per message its entry id, seq, epoch and duplicate (0/1),
    and last the chain, which holds spaces. The list is as the script's
    table was: ``ok``, due, created, chain, TTL, ms left (``b""`` for none),
    then four per message. (A refusal is still a table, and not passed here.)
    """
    words = reply.split(b" ", _HEAD_WORDS + _MESSAGE_WORDS * count)
    ok, due, created, ttl, left = words[:_HEAD_WORDS]
    out: list[Any] = [
        ok,
        int(due),
        int(created),
        words[-1],
        int(float(ttl)) if ttl else b"",  # as stored: set_ttl's, or the default sent
        int(left) if left else b"",
    ]
    for i in range(_HEAD_WORDS, _HEAD_WORDS + _MESSAGE_WORDS * count, _MESSAGE_WORDS):
        out += [words[i], int(words[i + 1]), int(words[i + 2]), int(words[i + 3])]
    return out


RESERVE_ATTEMPTS = 3
"""Reservations a write that creates its session takes before it gives up."""


class Writer:
    """One tenant's writes.

    Args:
        scope: The tenant's scope.
        quotas: The tenant's limits.
        index: The tenant's index of sessions.
        handoff: Where a due summary goes.
        lineage: The tenant's frozen segments.
        warm: The views this process keeps: told what it appends to them.
    """

    def __init__(
        self,
        scope: Scope,
        quotas: Quotas,
        index: TenantIndex,
        handoff: Handoff,
        lineage: Lineage,
        warm: WarmViews,
    ) -> None:
        self._scope = scope
        self._warm = warm
        self._quotas = quotas
        self._index = index
        self._handoff = handoff
        self._lineage = lineage
        # Idempotency keys made here: a random per-writer prefix and a counter
        # (unique without a syscall per append, unlike a fresh random token).
        self._key_prefix = secrets.token_urlsafe(6) + "."
        self._key_counter = itertools.count()
        # Sessions with a TTL: until when (monotonic) their keys' expiry need not move, as
        # the last append's reply told. Past it the full form goes at once: the lean one
        # would be refused (a session written less often than its expiry's slack).
        self._lean_until: Memo[str, float] = Memo()

    async def append(
        self,
        session: str,
        messages: Sequence[dict[str, Any]],
        *,
        idempotency_keys: Sequence[str] | None,
        expected_seq: int | None,
        pinned: bool,
    ) -> list[AppendResult]:
        """Append messages, all or none (see ``ContextStore.append_many``)."""
        keys = self._scope.keys(session)
        check_messages(messages, session)
        if not messages:
            return []
        idem = (
            [f"{self._key_prefix}{next(self._key_counter):x}" for _ in messages]
            if idempotency_keys is None
            else check_idempotency_keys(idempotency_keys, len(messages), session)
        )
        check_int(expected_seq, "expected_seq", low=0, optional=True, session=session)
        limits = await self._quotas.resolved(session)
        settings = self._scope.settings
        limited = (
            limits.ttl_arg,
            limits.session_bytes,
            limits.session_tokens,
            limits.appends_per_second,
            limits.append_burst,
        )
        entries = self._entries(session, messages, limits, pinned=pinned)
        # The script's bare form (see append.lua) when no message has a kind, ids or a
        # preview: its three arguments each, without the five empty ones.
        bare = not any(
            kind or calls or results or preview
            for _, _, kind, calls, results, preview, _ in entries
        )
        args: list[Any] = []
        for entry, key in zip(entries, idem, strict=True):
            data, tokens, *rest = entry
            args.extend((data, tokens, key) if bare else (data, tokens, key, *rest))
        now = clock_arg(self._scope.clock)
        # The script's lean form (see append.lua) when nothing known asks for the full one:
        # no injected clock, and no system or pinned message. It carries the default TTL
        # and the quotas when any is in force, and is refused when the session's expiry
        # is due to move (then every key's moves).
        lean = now == "" and all(entry[2] == "" for entry in entries)
        lean_form = limited if limits.bound_writes else ()
        lean_keys = (keys.log, keys.meta, keys.idem, keys.idem_old)
        full_keys = (
            *lean_keys,
            keys.keep,
            keys.gone,
            keys.view,
            keys.anchor,
            keys.index,
            keys.checkpoints,
            keys.checkpoint_summaries,
            keys.branches,
        )
        connection = self._scope.connection

        # Keys this writer made for this call were never recorded before its first attempt:
        # that attempt alone skips looking them up (a negative count: see append.lua). Every
        # later one (a retry, the full form after the lean one, a run under a reservation)
        # looks them up, since an attempt whose reply was lost may have written.
        attempts = 0
        count = len(entries)  # as serialized: the caller may change its list meanwhile

        async def send(declared: tuple[str, ...], form: tuple[Any, ...], after: Commands) -> Any:
            def argv() -> tuple[Any, ...]:
                nonlocal attempts
                attempts += 1
                made = attempts == 1 and idempotency_keys is None
                # At least 1 ms: its sign tells the script whether the limits follow.
                period = max(1, int(settings.idempotency_seconds * 1000))
                return (
                    "" if expected_seq is None else expected_seq,
                    settings.idempotency_window,
                    settings.summary_trigger_tokens,
                    -count if made else count,
                    # Negative: a lean form followed by the limits (see append.lua).
                    -period if form and len(declared) == len(lean_keys) else period,
                    *form,
                    *args,
                )

            reply = await connection.script(
                SCRIPTS.append,
                declared,
                argv,
                session=session,
                replicas=settings.replica_acks,
                refused=_refused,
                after=after,
            )
            return _appended(reply, count) if isinstance(reply, bytes) else reply

        until = self._lean_until.get(session)
        lean = lean and (until is None or time.monotonic() < until)

        async def run(reservation: tuple[str, int], after: Commands) -> Any:
            if lean and reservation == NO_RESERVATION:
                reply = await send(lean_keys, lean_form, after)
                if text(reply[0]) != Reply.KEYS:
                    return reply
                after = ()  # sent with the lean form already
            return await send(full_keys, (*limited, *reservation, now), after)

        reply = await self.listed(session, limits, run)
        if text(reply[0]) != Reply.OK:
            raise self._refusal(reply, expected_seq, session, keys.meta)
        due = int(reply[1])
        results = [
            AppendResult(
                entry_id=text(reply[i]),
                seq=int(reply[i + 1]),
                epoch=int(reply[i + 2]),
                duplicate=int(reply[i + 3]) == 1,
                summary_due=due > 0,
            )
            for i in range(6, len(reply), 4)
        ]
        if reply[4] and reply[5] != b"":  # a TTL: how long the lean form will do
            lean_for = (int(reply[5]) - int(reply[4])) / 1000
            self._lean_until.put(session, time.monotonic() + lean_for)
        else:
            self._lean_until.discard(session)
        self._note_own(session, entries, results)
        # At once when the script took a removed TTL's expiry away (-1: see append.lua):
        # its branches' segments too, which a session with an empty chain may have.
        unbound = reply[5] == -1
        if reply[3] or unbound:  # its history starts in segments: they must outlive it
            await self._lineage.keep_alive(session, reply[3], reply[4], now=unbound)
        if due:
            await self._handoff.due(self._scope.tenant, session, due)
        return results

    def _note_own(
        self, session: str, entries: list[tuple[Any, ...]], results: list[AppendResult]
    ) -> None:
        """Tell the views this process keeps of ``session`` what this append added to it.

        Each as a view reads it from the stream (:meth:`Codec.entry`): the next view
        need not read it back. Not system or pinned messages: those change the
        protected copies, which every view then reads again.
        """
        if not self._warm.holds(self._scope.tenant, session):
            return
        codec = self._scope.codec
        added = []
        epoch = -1
        for (data, tokens, kind, *fields), result in zip(entries, results, strict=True):
            if result.duplicate:
                continue
            if kind:
                return
            epoch = result.epoch
            added.append(codec.appended(session, result.entry_id, data, tokens, *fields))
        self._warm.add_own(self._scope.tenant, session, epoch, added)

    async def rewrite(
        self,
        session: str,
        messages: Sequence[dict[str, Any]],
        *,
        expected_seq: int | None,
        lease: Lease | None,
    ) -> WriteResult:
        """Replace the whole history under the lease (see ``ContextStore.replace``)."""
        keys = self._scope.keys(session)
        check_messages(messages, session)
        check_int(expected_seq, "expected_seq", low=0, optional=True, session=session)
        limits = await self._quotas.resolved(session)
        entries = self._entries(session, messages, limits, pinned=False)
        async with fenced(self._scope, session, lease) as held:
            reply = await self._rewrite(session, keys, entries, limits, held, expected_seq)
            status = text(reply[0])
            if status == Reply.LEASE_LOST:
                raise held.mark_lost()
            if status != Reply.OK:
                raise self._refusal(reply, expected_seq, session, keys.meta)
            held.consumed()
        await self._lineage.release(held_segments(reply[5]))
        return WriteResult(
            epoch=int(reply[1]),
            seq=int(reply[2]),
            count=int(reply[3]),
            superseded=int(reply[4]),
            entry_ids=tuple(text(r) for r in reply[6:]),
        )

    async def _rewrite(
        self,
        session: str,
        keys: SessionKeys,
        entries: list[tuple[Any, ...]],
        limits: Limits,
        held: Lease,
        expected_seq: int | None,
    ) -> Any:
        """Run ``rewrite.lua`` under ``held``, listed in the tenant's index first."""
        args: list[Any] = [
            held.token,
            held.fence,
            held.now_arg(),
            "" if expected_seq is None else expected_seq,
            limits.ttl_arg,
            len(entries),
            limits.session_bytes,
            limits.session_tokens,
            secrets.token_urlsafe(9),  # this call's id: its retries are answered, not refused
            limits.appends_per_second,
            limits.append_burst,
        ]
        for entry in entries:
            args.extend(entry)

        async def run(reservation: tuple[str, int], after: Commands) -> Any:
            return await self._scope.connection.script(
                SCRIPTS.rewrite,
                (
                    *(keys.log, keys.meta, keys.keep, keys.view, keys.lease, keys.gone),
                    *(keys.anchor, keys.idem, keys.idem_old, keys.index),
                    *(keys.checkpoints, keys.checkpoint_summaries, keys.branches),
                ),
                (*args[:11], *reservation, self._scope.period_ms, *args[11:]),
                session=session,
                replicas=self._scope.settings.replica_acks,
                refused=_refused,
                after=after,
            )

        return await self.listed(session, limits, run)

    async def listed(self, session: str, limits: Limits, run: ListedWrite) -> Any:
        """Run a write that may create the session, keeping the tenant's index true around it.

        The write runs first without a reservation: a session that exists needs
        none. One that would create the session is refused by its script; it
        is then reserved (listed, within the session quota) and run again. A
        refused write (conflict, quota, lost lease) that found the session
        absent gives its reservation back and unlists it (unless another write
        may still create it).

        The session's activity touch, when due, goes with the first run
        (``TenantIndex.touching``).

        Raises:
            StoreUnavailableError: The write kept reaching Redis after its
                reservation had run out (nothing was written).
        """
        reply = await self._index.touching(session, lambda after: run(NO_RESERVATION, after))
        reservation: Reservation | None = None
        for _ in range(RESERVE_ATTEMPTS):
            if text(reply[0]) != Reply.RESERVE:
                break
            reservation = await self._index.reserve(session, limits)
            reply = await run(reservation.args, ())
        status = text(reply[0])
        if status == Reply.OK:
            return reply
        if reservation is not None:
            if status == Reply.RESERVE:
                # Each reservation ran out before the write reached Redis (a stalled
                # connection): give the last back; the index is left true.
                await self._index.unlist(await self._index.now_ms(), [(session, reservation.token)])
                raise StoreUnavailableError(
                    f"the write reached Redis after its index reservation ran out, "
                    f"{RESERVE_ATTEMPTS} times; nothing was written",
                    tenant=self._scope.tenant,
                    session=session,
                )
            fresh, seen_at = int(reply[-2]), int(reply[-1])
            if fresh:  # refused, and the session is absent: give the reservation back
                await self._index.unlist(seen_at, [(session, reservation.token)])
        return reply

    async def pop(self, session: str) -> StoredMessage | None:
        """Take the newest message off the session (see ``ContextStore.pop``)."""
        keys = self._scope.keys(session)
        limits = await self._quotas.resolved(session)
        call = secrets.token_urlsafe(9)  # this call's id: a retry gets the same message
        chained: tuple[Any, ...] = ()
        for _ in range(RESERVE_ATTEMPTS):
            reply = await self._scope.connection.script(
                SCRIPTS.pop,
                (
                    *(keys.log, keys.meta, keys.keep, keys.view, keys.anchor, keys.idem),
                    *(keys.idem_old, keys.checkpoints, keys.checkpoint_summaries),
                ),
                (
                    call,
                    self._scope.period_ms,
                    limits.appends_per_second,
                    limits.append_burst,
                    *chained,
                ),
                session=session,
                replicas=self._scope.settings.replica_acks,
                refused=_refused,
            )
            if text(reply[0]) != Reply.BASE:
                break
            # The live log is empty: the newest message is the chain's (a fork's history).
            chained = await self._chain_tail(session, reply[1])
        else:
            raise StoreUnavailableError(
                "pop: the session's chain kept changing", tenant=self._scope.tenant, session=session
            )
        if text(reply[0]) == Reply.QUOTA:
            raise self._refusal(reply, None, session, keys.meta)
        if int(reply[0]) == 0:
            return None
        entry_id = text(reply[1])
        return self._scope.codec.stored(session, [entry_id, [b"m", reply[4], b"t", reply[5]]])

    async def _chain_tail(self, session: str, raw: Any) -> tuple[Any, ...]:
        """``pop.lua``'s arguments to take the newest entry of the chain ``raw``."""
        chain = Chain.parse(raw)
        newest = await self._lineage.read_back(chain, 2)
        owner, row = newest[0]
        fields = row_fields(row)
        before = text(newest[1][1][0]) if len(newest) > 1 else ""
        return (
            text(raw),
            text(row[0]),
            self._scope.codec.reseal(owner, session, fields[b"m"]),
            fields[b"t"],
            str(chain.upto(before)),
            before,
        )

    async def pin(self, session: str, entry_id: str, pinned: bool) -> bool:
        """Pin or unpin a stored message; False when no entry has that id.

        Raises:
            QuotaExceededError: The pinned copy would take the session past
                its byte quota, or the pin past its write rate.
        """
        keys = self._scope.keys(session)
        if not isinstance(pinned, bool):  # "no" or 2 would pin: a truthy value is not a yes
            raise InvalidInputError(
                f"pinned must be True or False, not {pinned!r}",
                tenant=self._scope.tenant,
                session=session,
            )
        entry_id = check_entry_id(entry_id, session)
        limits = await self._quotas.resolved(session)
        given: tuple[Any, ...] = ()
        for _ in range(RESERVE_ATTEMPTS):
            reply = await self._scope.connection.script(
                SCRIPTS.pin,
                (keys.log, keys.keep, keys.meta),
                (
                    entry_id,
                    "1" if pinned else "0",
                    limits.session_bytes,
                    limits.appends_per_second,
                    limits.append_burst,
                    *given,
                ),
                session=session,
            )
            if text(reply[0]) == Reply.QUOTA:
                raise self._refusal(reply, None, session, keys.meta)
            if int(reply[0]) == 1:
                return True
            # Not in the live log: it may be in the chain (a fork's older history).
            ((raw_chain,),) = await self._scope.connection.transaction(
                [("HMGET", keys.meta, Meta.CHAIN)], session=session, key=keys.meta
            )
            found = await self._lineage.entry(Chain.parse(raw_chain), entry_id)
            if found is None:
                return False
            owner, row = found
            fields = row_fields(row)
            given = (
                text(raw_chain),
                self._scope.codec.reseal(owner, session, fields[b"m"]),
                fields[b"t"],
                fields.get(b"c", b""),
                fields.get(b"r", b""),
            )
        return False

    async def set_ttl(self, session: str, seconds: int | None) -> None:
        """Give the session its own TTL, or none (see ``ContextStore.set_ttl``)."""
        keys = self._scope.keys(session)
        check_int(seconds, "seconds", low=1, high=MAX_TTL_SECONDS, optional=True, session=session)
        ttl_ms = 0 if seconds is None else seconds * 1000
        found, *read = await self._scope.connection.script(
            SCRIPTS.set_ttl,
            (
                *(keys.log, keys.meta, keys.keep, keys.view, keys.anchor, keys.index),
                *(keys.checkpoints, keys.checkpoint_summaries, keys.branches),
            ),
            (ttl_ms,),
            session=session,
        )
        if not int(found):
            raise SessionNotFoundError(
                "no such session", tenant=self._scope.tenant, session=session
            )
        chain, *records = read
        await self._lineage.keep_alive(session, chain, ttl_ms, now=True, branches=records)

    async def delete(self, session: str) -> bool:
        """Delete a session, leaving a tombstone; True if it existed.

        The tombstone carries the epoch and sequence number on to a session
        written again under this id (for ``tombstone_seconds``). A retried
        delete whose reply was lost answers as it was applied.
        """
        keys = self._scope.keys(session)
        existed, spent, seen_at, segments = await self._scope.connection.script(
            SCRIPTS.delete,
            keys.all(),
            (
                secrets.token_urlsafe(9),
                self._scope.settings.tombstone_seconds * 1000,
                clock_arg(self._scope.clock),
                self._scope.period_ms,
            ),
            session=session,
        )
        # Then the index: unless another write may create the session again.
        settings = self._scope.settings
        until = int(seen_at) + max(settings.tombstone_seconds * 1000, 2 * self._scope.period_ms)
        await self._index.unlist(int(seen_at), [(session, text(spent))], deleted_until=until)
        await self._lineage.release(held_segments(segments))
        return int(existed) == 1

    def _entries(
        self, session: str, messages: Sequence[Any], limits: Limits, *, pinned: bool
    ) -> list[tuple[Any, ...]]:
        """Validate, count and serialize every message before anything is sent.

        Returns:
            Per message: (data, tokens, kind, call ids, result ids, preview,
            preview tokens), as the append and rewrite scripts take them.

        Raises:
            InvalidMessageError: One is malformed; its index is in the error
                when there is more than one.
        """
        glued = _reasoning_glue(messages)
        return [
            self.entry(
                session,
                message,
                limits,
                pinned=pinned,
                calls=glued.get(("calls", index), ()),
                results=glued.get(("results", index), ()),
                index=index if len(messages) > 1 else None,
            )
            for index, message in enumerate(messages)
        ]

    def entry(
        self,
        session: str,
        message: Any,
        limits: Limits,
        *,
        pinned: bool,
        calls: tuple[str, ...] = (),
        results: tuple[str, ...] = (),
        index: int | None = None,
    ) -> tuple[Any, ...]:
        """One message validated, counted and serialized, as the write scripts take it.

        Args:
            session: The session it is for (its values are sealed for it).
            message: The message.
            limits: The tenant's limits (the message size cap).
            pinned: Every view must send it.
            calls: Ids it "calls" beyond its tool calls (a reasoning item's tie).
            results: Ids it "answers" beyond its tool results.
            index: Its position in a batch, for the error.

        Raises:
            InvalidMessageError: It is malformed.
        """
        scope = self._scope
        settings = scope.settings
        try:
            checked = check_message(message, max_bytes=limits.message_bytes, index=index)
        except InvalidMessageError as exc:
            exc.tenant, exc.session = scope.tenant, session
            raise
        tokens = count_message(scope.counter, checked.raw)
        if checked.role in _PROTECTED_ROLES:
            kind = Kind.SYSTEM
        else:
            kind = Kind.PINNED if pinned else Kind.PLAIN
        preview = make_preview(
            checked.raw,
            tokens,
            scope.counter,
            threshold=settings.offload_threshold_tokens,
            preview_tokens=settings.offload_preview_tokens,
        )
        preview_data, preview_tokens = preview if preview is not None else (b"", 0)
        # Counted above, sealed here: tokens are never sealed.
        return (
            scope.codec.seal(session, checked.data),
            tokens,
            kind.value,
            join_ids(checked.call_ids + calls),
            join_ids(checked.result_ids + results),
            scope.codec.seal(session, preview_data) if preview_data else b"",
            preview_tokens,
        )

    def _refusal(
        self, reply: list[Any], expected_seq: int | None, session: str, key: str
    ) -> CtxstoreError:
        """The error for a write script's ``conflict`` or ``quota`` reply."""
        tenant = self._scope.tenant
        if text(reply[0]) == Reply.CONFLICT:
            return ConflictError(
                expected_seq if expected_seq is not None else -1,
                int(reply[1]),
                tenant=tenant,
                session=session,
                key=key,
            )
        return quota_error(reply, tenant=tenant, session=session, key=key)

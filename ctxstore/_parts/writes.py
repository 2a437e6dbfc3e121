"""Writes: appends (lock-free, idempotent), and what every write shares.

An append counts each message's tokens once, validates and serializes it,
and runs ``append.lua``: it drops retries whose idempotency key it has seen,
refuses a stale append-if or a write over a quota, adds the entries and
bumps the counters, all in one step; Redis orders concurrent appends.

Every write that may create its session (an append, a replace, a fork, an
import) first puts the session in the tenant's index (it lives in another
slot) and takes it out again if the write was refused and the session does
not exist (:meth:`Writer.listed`); every write serializes its messages as
:meth:`Writer.entry` does. The writes that change a session other than by
appending are :mod:`ctxstore._parts.edits`'.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ctxstore._layout.codec import Kind, Reply, join_ids, text
from ctxstore._layout.formats import REASONING, REASONING_TIE, item_type
from ctxstore._layout.memo import Memo
from ctxstore._layout.messages import check_message
from ctxstore._layout.validate import check_idempotency_keys, check_int, check_messages
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.scope import Scope
from ctxstore._plan.offload import make_preview
from ctxstore._plan.warm import WarmViews
from ctxstore._redis.connection import Commands
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.index import NO_RESERVATION, Reservation, TenantIndex
from ctxstore._tenant.quotas import Limits, Quotas, quota_error
from ctxstore.errors import ConflictError, CtxstoreError, InvalidMessageError, StoreUnavailableError
from ctxstore.lease import clock_arg
from ctxstore.models import AppendResult
from ctxstore.summary_queue import Handoff
from ctxstore.tokens import count_message

__all__ = ["RESERVE_ATTEMPTS", "ListedWrite", "Writer", "refused"]

_PROTECTED_ROLES = frozenset({"system", "developer"})

_REFUSALS = frozenset({Reply.RESERVE, Reply.CONFLICT, Reply.QUOTA, Reply.LEASE_LOST, Reply.KEYS})

ListedWrite = Callable[[tuple[str, int], Commands], Awaitable[Any]]
"""A write run by ``Writer.listed``: given a reservation (or none) and commands to send after."""


def _reasoning_glue(messages: Sequence[Any]) -> dict[tuple[str, int], tuple[str, ...]]:
    """Bind each OpenAI Responses reasoning item to the item after it.

    The API refuses a reasoning item sent without the item it led to (and
    that item without its reasoning), so the pair is stored as an exchange:
    the reasoning "calls" an id of its own that the next item "answers".
    Views and summaries then never cut between them, as between a tool call
    and its result. A reasoning item that ends its batch still calls its id:
    the item after it in the history answers it when there is one
    (:func:`ctxstore._plan.pairs.bind_ties`), and until then it is an
    unanswered call, never sent. Returns the extra (call or result) ids by
    message index.
    """
    glue: dict[tuple[str, int], tuple[str, ...]] = {}
    for index, message in enumerate(messages):
        if isinstance(message, dict) and item_type(message) == REASONING:
            tie = f"{REASONING_TIE}{secrets.token_urlsafe(9)}"
            glue[("calls", index)] = (tie,)
            if index + 1 < len(messages):
                glue[("results", index + 1)] = (tie,)
    return glue


def refused(reply: Any) -> bool:
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
    """One tenant's appends, and the listing and serialization every write shares.

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
        entries = self.entries(session, messages, limits, pinned=pinned)
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
                refused=refused,
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
            raise self.refusal(reply, expected_seq, session, keys.meta)
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

    def entries(
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

    def refusal(
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

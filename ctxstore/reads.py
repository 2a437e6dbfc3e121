"""Reads: history pages, single entries, and a session's counters.

The full history is read a page at a time (``XRANGE``), each page with the
epoch it was read in, so a reader never mixes two histories. The request
view is :mod:`ctxstore.anchor`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ctxstore._codec import Entry, Meta, current_covers, pairs, raw_pairs, text
from ctxstore._formats import entry_order
from ctxstore._keys import SessionKeys
from ctxstore._scope import Scope
from ctxstore._validate import check_entry_id, check_int
from ctxstore.errors import CorruptEntryError, EpochChangedError
from ctxstore.models import HistoryPage, SessionInfo, StoredMessage

__all__ = ["Reader"]


class Reader:
    """One tenant's reads.

    Args:
        scope: The tenant's scope.
    """

    def __init__(self, scope: Scope) -> None:
        self._scope = scope

    async def page(self, session: str, *, after: str | None, limit: int) -> HistoryPage:
        """One page of the full history, oldest first (see ``ContextStore.read``)."""
        page, _ = await self._page(session, after=after, limit=limit)
        return page

    async def _page(
        self, session: str, *, after: str | None, limit: int
    ) -> tuple[HistoryPage, str]:
        """One page, and the life of the session it was read in (see ``history``)."""
        keys = self._scope.keys(session)
        check_int(limit, "limit", low=1, high=10_000, session=session)
        low = "-" if after is None else "(" + check_entry_id(after, session)
        (epoch, life), rows = await self._scope.connection.transaction(
            [
                ("HMGET", keys.meta, Meta.EPOCH, Meta.LIFE),
                ("XRANGE", keys.log, low, "+", "COUNT", limit),
            ],
            session=session,
            key=keys.log,
        )
        entries = [self._scope.codec.stored(session, row) for row in rows]
        next_after = entries[-1].entry_id if len(entries) == limit else None
        return HistoryPage(entries, int(epoch or 0), next_after), text(life or b"")

    async def tail(self, session: str, limit: int) -> list[StoredMessage]:
        """The newest ``limit`` messages, oldest first (see ``ContextStore.tail``)."""
        keys = self._scope.keys(session)
        check_int(limit, "limit", low=1, high=10_000, session=session)
        (rows,) = await self._scope.connection.transaction(
            [("XREVRANGE", keys.log, "+", "-", "COUNT", limit)], session=session, key=keys.log
        )
        return [self._scope.codec.stored(session, row) for row in reversed(rows)]

    async def history(self, session: str) -> AsyncIterator[StoredMessage]:
        """Every stored message, oldest first, a page at a time.

        A page read in another life of the session (a replace or clear bumps
        the epoch; a delete or an expiry and a new first write start a new
        life, even at the same epoch) ends the walk.

        Raises:
            EpochChangedError: The history changed between two pages.
        """
        after: str | None = None
        first: tuple[int, str] | None = None
        while True:
            page, life = await self._page(
                session, after=after, limit=self._scope.settings.history_page_size
            )
            if first is not None and (page.epoch, life) != first:
                raise EpochChangedError(
                    first[0], page.epoch, tenant=self._scope.tenant, session=session
                )
            first = (page.epoch, life)
            for stored in page.messages:
                yield stored
            if page.next_after is None:
                return
            after = page.next_after

    async def messages(self, session: str) -> list[dict[str, Any]]:
        """The full history as dicts; a replace during the read restarts it (three tries)."""
        for attempt in range(3):
            try:
                return [s.message async for s in self.history(session)]
            except EpochChangedError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def entry(self, session: str, entry_id: str) -> StoredMessage | None:
        """One stored message by entry id."""
        keys = self._scope.keys(session)
        entry_id = check_entry_id(entry_id, session)
        (rows,) = await self._scope.connection.transaction(
            [("XRANGE", keys.log, entry_id, entry_id, "COUNT", 1)], session=session, key=keys.log
        )
        return self._scope.codec.stored(session, rows[0]) if rows else None

    async def entries_after(
        self, session: str, keys: SessionKeys, after: str
    ) -> AsyncIterator[Entry]:
        """The entries after ``after`` (``""``: all), oldest first, a page at a time."""
        low = "(" + after if after else "-"
        size = self._scope.settings.history_page_size
        while True:
            (rows,) = await self._scope.connection.transaction(
                [("XRANGE", keys.log, low, "+", "COUNT", size)], session=session, key=keys.log
            )
            for row in rows:
                yield self._scope.codec.entry(session, row)
            if len(rows) < size:
                return
            low = "(" + text(rows[-1][0])

    async def info(self, session: str, *, pins: bool) -> SessionInfo:
        """The session's counters, times, pins and summary state (see ``ContextStore.info``)."""
        keys = self._scope.keys(session)
        tenant = self._scope.tenant
        meta_raw, view_raw, pttl, *keep = await self._scope.connection.transaction(
            [
                ("HGETALL", keys.meta),
                ("HMGET", keys.view, "covers", "n1", "n2", "epoch", "model"),
                ("PTTL", keys.meta),
                *([("HGETALL", keys.keep)] if pins else []),
            ],
            session=session,
            key=keys.meta,
        )
        meta = pairs(meta_raw)
        if Meta.SEQ not in meta:
            return SessionInfo(tenant, session, exists=False)
        # A tenant's own ACL user may write any value in its own meta: a bad one is
        # a CorruptEntryError here, never a crash of whoever reads it (the sweep).
        try:
            pinned = [text(k) for k, v in raw_pairs(keep[0]) if v[:1] == b"p"] if keep else []
            ttl = int(meta.get(Meta.TTL) or 0)  # 0: the session's own "never", or none of its own
            tokens = int(meta.get(Meta.TOKENS, 0))
            wm_tokens = int(meta.get(Meta.WATERMARK_TOKENS) or 0)
            first, last = meta.get(Meta.FIRST_ID) or None, meta.get(Meta.LAST_ID) or None
            wm = meta.get(Meta.WATERMARK)
            covers = current_covers(
                view_raw[0],
                view_raw[3],
                meta.get(Meta.EPOCH, "0").encode(),
                wm.encode() if wm else None,
            )
            summary_tokens = int(view_raw[2] or 0) or int(view_raw[1] or 0) if covers else 0

            def number(name: str) -> int | None:
                return int(meta[name]) if meta.get(name) else None

            return SessionInfo(
                tenant=tenant,
                session=session,
                exists=True,
                epoch=int(meta.get(Meta.EPOCH, 0)),
                seq=int(meta[Meta.SEQ]),
                count=int(meta.get(Meta.COUNT, 0)),
                tokens=tokens,
                first_at_ms=entry_order(first)[0] if first else None,
                last_at_ms=entry_order(last)[0] if last else None,
                ttl_seconds=ttl // 1000 if ttl else (int(pttl) // 1000 if int(pttl) > 0 else None),
                pinned=tuple(sorted(pinned, key=entry_order)),
                summary_covers=covers,
                summary_tokens=summary_tokens,
                tokens_unsummarized=tokens - wm_tokens,
                tokens_saved=max(0, wm_tokens - summary_tokens) if covers else 0,
                summary_model=text(view_raw[4]) if covers and view_raw[4] else None,
                summary_due=meta.get(Meta.SUMMARY_DUE) == "1",
                summary_runs=int(meta.get(Meta.SUMMARY_RUNS, 0)),
                summary_failures=int(meta.get(Meta.SUMMARY_FAILURES, 0)),
                summary_error=meta.get(Meta.SUMMARY_ERROR) or None,
                summary_last_at_ms=number(Meta.SUMMARY_AT),
                summary_last_seconds=int(meta[Meta.SUMMARY_MS]) / 1000
                if meta.get(Meta.SUMMARY_MS)
                else None,
                summary_last_outcome=meta.get(Meta.SUMMARY_OUTCOME) or None,
                summary_generation=int(meta.get(Meta.SUMMARY_GENERATION, 0)),
                summary_due_since_ms=number(Meta.SUMMARY_DUE_AT),
                summary_failed_at_ms=number(Meta.SUMMARY_FAILED_AT),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptEntryError(
                f"the session's counters cannot be read: {exc}",
                tenant=tenant,
                session=session,
                key=keys.meta,
            ) from exc

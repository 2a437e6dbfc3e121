"""Reads: history pages, single entries, and a session's counters.

The full history is read a page at a time, each page with the epoch it was
read in, so a reader never mixes two histories. A history that starts in
frozen segments (a fork's, or after a rewind into them: :mod:`ctxstore._parts.lineage`)
is read from them first, in later round trips, then from the live log: the
chain is read with the epoch, and segments never change. The request view
is :mod:`ctxstore._parts.anchor`'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ctxstore._layout.chain import Chain, Row
from ctxstore._layout.codec import Entry, Meta, current_covers, pairs, raw_pairs, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.keys import SessionKeys
from ctxstore._layout.memo import Memo
from ctxstore._layout.validate import check_entry_id, check_int
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.scope import Scope
from ctxstore.errors import CorruptEntryError, EpochChangedError
from ctxstore.models import HistoryPage, SessionInfo, StoredMessage

__all__ = ["Reader"]


class Reader:
    """One tenant's reads.

    Args:
        scope: The tenant's scope.
    """

    def __init__(self, scope: Scope, lineage: Lineage) -> None:
        self._scope = scope
        self.lineage = lineage
        self._bases: Memo[str, str] = Memo()  # session -> its chain's end, as last read here

    async def page(self, session: str, *, after: str | None, limit: int) -> HistoryPage:
        """One page of the full history, oldest first (see ``ContextStore.read``)."""
        page, _ = await self._page(session, after=after, limit=limit)
        return page

    async def rows(
        self, session: str, keys: SessionKeys, after: str | None, limit: int
    ) -> tuple[tuple[Any, Any], list[Row]]:
        """Up to ``limit`` raw entries of the whole history after ``after`` (``None``: all).

        Returns the (epoch, life) they were read in, and each row with the
        session its values are sealed for (a segment's owner, or ``session``).
        A page in the chain reads from the segments; the live log is read for
        it only when the page goes on past the chain (what this process last
        saw of the session's chain says which is likely, and is checked).

        Raises:
            EpochChangedError: The history kept changing between the reads of one page.
        """
        guess = self._bases.get(session)
        in_chain = guess is not None and (after is None or entry_order(after) < entry_order(guess))
        for _ in range(3):
            count = 1 if in_chain else limit
            state, chain, rows = await self._log_rows(session, keys, after, count)
            if chain and (after is None or entry_order(after) < entry_order(chain.base)):
                self._bases.put(session, chain.base)
                early = await self.lineage.read(chain, after, limit)
                need = limit - len(early)
                if not need or not in_chain:
                    return state, early + rows[:need]
                # On past the chain, into the live log: read the rest of the page there.
                again, same, rows = await self._log_rows(session, keys, None, need)
                if (again, same) == (state, chain):  # no rewrite, no freeze in between
                    return state, early + rows
            else:
                self._bases.discard(session)
                if not in_chain:
                    return state, rows
            in_chain = False  # the guess was wrong, or the history changed: read it whole
        raise EpochChangedError(-1, -1, tenant=self._scope.tenant, session=session)

    async def _log_rows(
        self, session: str, keys: SessionKeys, after: str | None, count: int
    ) -> tuple[tuple[Any, Any], Chain, list[Row]]:
        """The (epoch, life), the chain, and up to ``count`` live log entries after ``after``."""
        low = "-" if after is None else "(" + after
        (epoch, life, chain), rows = await self._scope.connection.transaction(
            [
                ("HMGET", keys.meta, Meta.EPOCH, Meta.LIFE, Meta.CHAIN),
                ("XRANGE", keys.log, low, "+", "COUNT", count),
            ],
            session=session,
            key=keys.log,
        )
        return (epoch, life), Chain.parse(chain), [(session, row) for row in rows]

    async def _page(
        self, session: str, *, after: str | None, limit: int
    ) -> tuple[HistoryPage, str]:
        """One page, and the life of the session it was read in (see ``history``)."""
        keys = self._scope.keys(session)
        check_int(limit, "limit", low=1, high=10_000, session=session)
        if after is not None:
            check_entry_id(after, session)
        (epoch, life), rows = await self.rows(session, keys, after, limit)
        entries = [self._scope.codec.stored(owner, row) for owner, row in rows]
        next_after = entries[-1].entry_id if len(entries) == limit else None
        return HistoryPage(entries, int(epoch or 0), next_after), text(life or b"")

    async def tail(self, session: str, limit: int) -> list[StoredMessage]:
        """The newest ``limit`` messages, oldest first (see ``ContextStore.tail``)."""
        keys = self._scope.keys(session)
        check_int(limit, "limit", low=1, high=10_000, session=session)
        chain, rows = await self._scope.connection.transaction(
            [("HGET", keys.meta, Meta.CHAIN), ("XREVRANGE", keys.log, "+", "-", "COUNT", limit)],
            session=session,
            key=keys.log,
        )
        found: list[Row] = [(session, row) for row in rows]
        older = Chain.parse(chain)
        if older and len(found) < limit:
            found += await self.lineage.read_back(older, limit - len(found))
        return [self._scope.codec.stored(owner, row) for owner, row in reversed(found)]

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
        found = await self.raw_entry(session, self._scope.keys(session), entry_id)
        return self._scope.codec.stored(*found) if found is not None else None

    async def raw_entry(self, session: str, keys: SessionKeys, entry_id: str) -> Row | None:
        """One raw entry of the history by id, with the session it is sealed for."""
        entry_id = check_entry_id(entry_id, session)
        chain, rows = await self._scope.connection.transaction(
            [
                ("HGET", keys.meta, Meta.CHAIN),
                ("XRANGE", keys.log, entry_id, entry_id, "COUNT", 1),
            ],
            session=session,
            key=keys.log,
        )
        if rows:
            return session, rows[0]
        return await self.lineage.entry(Chain.parse(chain), entry_id)

    async def entries_after(
        self, session: str, keys: SessionKeys, after: str
    ) -> AsyncIterator[Entry]:
        """The entries after ``after`` (``""``: all), oldest first, a page at a time."""
        size = self._scope.settings.history_page_size
        cursor: str | None = after or None
        while True:
            _, rows = await self.rows(session, keys, cursor, size)
            for owner, row in rows:
                yield self._scope.codec.entry(owner, row)
            if len(rows) < size:
                return
            cursor = text(rows[-1][1][0])

    async def info(self, session: str, *, pins: bool) -> SessionInfo:
        """The session's counters, times, pins and summary state (see ``ContextStore.info``)."""
        keys = self._scope.keys(session)
        tenant = self._scope.tenant
        (
            meta_raw,
            view_raw,
            pttl,
            own,
            points,
            branches,
            *keep,
        ) = await self._scope.connection.transaction(
            [
                ("HGETALL", keys.meta),
                ("HMGET", keys.view, "covers", "n1", "n2", "epoch", "model"),
                ("PTTL", keys.meta),
                ("XLEN", keys.log),
                ("HLEN", keys.checkpoints),
                ("HLEN", keys.branches),
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

            origin = (meta.get(Meta.ORIGIN) or " ").split(" ", 1)

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
                forked_from=origin[0] or None,
                fork_point=origin[1] or None,
                shared_messages=max(0, int(meta.get(Meta.COUNT, 0)) - int(own))
                if meta.get(Meta.BASE)
                else 0,
                checkpoints=int(points),
                branches=int(branches),
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptEntryError(
                f"the session's counters cannot be read: {exc}",
                tenant=tenant,
                session=session,
                key=keys.meta,
            ) from exc

"""A session's lineage: the frozen segments its history starts with, and who reads them.

A session's history is its *chain* (older entries, in frozen segments) followed
by its live log. A *segment* is a stream that is never written again: a
session's log, renamed when a fork had to share it, or the tail a rewind
abandoned. It stays in the slot of the session it was frozen from (its
*owner*, whose key its values are sealed with), under a random id::

    <prefix>:{<tenant>:<owner>}:seg:<id>      stream: the entries
    <prefix>:{<tenant>:<owner>}:seg:<id>:i    hash: end, n, k (its last entry, the history's
                                              messages and tokens there), h:<session> holders

The chain is kept in the session's meta (``chain``: ``owner:id:high``, one per
segment, by a space; ``base``: the last one's ``high``). Segment *i* gives the
entries after segment *i-1*'s ``high`` up to its own; the live log holds only
entries after ``base``. So a fork of a long session shares the source's
entries instead of copying them, and reads them in later round trips (another
slot, on a cluster); its request view reads its own log alone, as any view.

A segment lasts as long as the sessions that read it: each is recorded in its
``h:`` fields (:meth:`Lineage.hold`, before it can read it), which also
stretch its TTL to the reader's; a delete gives them back
(:meth:`Lineage.release`), and the last one deletes it. The tenant's sorted
set of segments lets ``forget_tenant`` find every one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import aclosing
from typing import Any

from ctxstore._layout import keys as _keys
from ctxstore._layout.chain import Chain, Row, Segment, row_fields, segments_of
from ctxstore._layout.codec import Meta, pairs, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.memo import Memo
from ctxstore._parts.scope import Scope
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.errors import CorruptEntryError, InvalidIdError

__all__ = ["Lineage"]

KEEP_ALIVE_MS = 60_000
"""The longest a process leaves a written session's segments without stretching their TTL."""
CLOCK_MARGIN_MS = 1_000
"""How far two nodes' clocks may differ, for a pending holder's deadline."""


class Lineage:
    """One tenant's segments: read them, hold them, let them go.

    Args:
        scope: The tenant's scope.
    """

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self.registry = _keys.tenant_segments_key(scope.prefix, scope.tenant)
        # session -> when its segments were last stretched, and for which TTL
        self._stretched: Memo[str, tuple[float, int]] = Memo()

    def keys(self, owner: str, segment: str) -> _keys.SegmentKeys:
        """The keys of one segment."""
        return _keys.segment_keys(self._scope.prefix, self._scope.tenant, owner, segment)

    # -- reading -----------------------------------------------------------------

    async def read(self, chain: Chain, after: str | None, limit: int) -> list[Row]:
        """Up to ``limit`` entries of the chain after ``after`` (``None``: from the first).

        Segments never change: no check of the session is needed between pages.

        Raises:
            CorruptEntryError: A segment the chain names is gone.
        """
        found: list[Row] = []
        start = entry_order(after) if after else None
        for segment, low in chain.ranges():
            if start is not None and entry_order(segment.high) <= start:
                continue
            lo = after or "" if start is not None and (not low or entry_order(low) < start) else low
            while len(found) < limit:
                want = limit - len(found)
                rows = await self._range(segment, "(" + lo if lo else "-", want)
                found += [(segment.owner, row) for row in rows]
                if len(rows) < want:
                    break  # this segment's part is read
                lo = text(rows[-1][0])
            if len(found) >= limit:
                break
        return found

    async def read_back(self, chain: Chain, limit: int) -> list[Row]:
        """Up to ``limit`` of the chain's newest entries, newest first."""
        found: list[Row] = []
        async with aclosing(self.newest_first(chain, page=min(limit, 1_000))) as rows:
            async for row in rows:
                found.append(row)
                if len(found) >= limit:
                    break
        return found

    async def newest_first(self, chain: Chain, *, page: int = 200) -> AsyncGenerator[Row, None]:
        """The chain's entries, newest first, ``page`` at a time."""
        for segment, low in reversed(list(chain.ranges())):
            hi = segment.high
            while True:
                keys = self.keys(segment.owner, segment.segment)
                exists, rows = await self._scope.connection.transaction(
                    [
                        ("EXISTS", keys.info),
                        ("XREVRANGE", keys.log, hi, "(" + low if low else "-", "COUNT", page),
                    ],
                    key=keys.log,
                )
                self._check(exists, segment)
                for row in rows:
                    yield segment.owner, row
                if len(rows) < page:
                    break
                hi = "(" + text(rows[-1][0])

    async def older(self, chain: Chain, before: str, limit: int) -> list[Row]:
        """Up to ``limit`` entries of the chain before ``before``, newest first.

        ``before``: an entry id (``""``: from the chain's last entry on).
        """
        found: list[Row] = []
        if not chain:
            return found
        upto = chain.upto(before) if before else chain
        async with aclosing(self.newest_first(upto, page=min(limit + 1, 1_000))) as rows:
            async for owner, row in rows:
                if before and text(row[0]) == before:
                    continue  # the entry itself: only those before it
                found.append((owner, row))
                if len(found) >= limit:
                    break
        return found

    async def bridge(
        self, chain: Chain, upto: str, *, tokens: int, entries: int
    ) -> tuple[list[Row], str]:
        """The newest entries of the history up to ``upto``, for a live log made from the chain.

        What a fork's (or a rewind's into the chain) views read most: back
        from ``upto``, at most ``tokens`` and ``entries``, at least ``upto``
        itself. A view that needs more reads on into the segments. Its cost
        follows those bounds, not the history's length.

        Returns:
            The rows, oldest first, and the entry just before the first of
            them (``""`` when they reach back to the history's first entry):
            the chain ends there.
        """
        rows: list[Row] = []
        used = 0
        async with aclosing(self.newest_first(chain.upto(upto))) as newest:
            async for owner, row in newest:
                size = int(row_fields(row).get(b"t", b"0"))
                if rows and (len(rows) >= entries or used + size > tokens):
                    rows.reverse()
                    return rows, text(row[0])
                rows.append((owner, row))
                used += size
        rows.reverse()
        return rows, ""

    async def entry(self, chain: Chain, entry_id: str) -> Row | None:
        """The chain's entry ``entry_id``, or ``None`` when it holds none."""
        segment = chain.holding(entry_id)
        if segment is None:
            return None
        keys = self.keys(segment.owner, segment.segment)
        exists, rows = await self._scope.connection.transaction(
            [("EXISTS", keys.info), ("XRANGE", keys.log, entry_id, entry_id, "COUNT", 1)],
            key=keys.log,
        )
        self._check(exists, segment)
        return (segment.owner, rows[0]) if rows else None

    async def counts_at(self, chain: Chain, entry_id: str) -> tuple[int, int] | None:
        """The history's messages and tokens up to ``entry_id`` (in the chain), or ``None``.

        An entry written before entries carried them (fields ``n``, ``k``) is
        counted back from its segment's end: only what follows it there is read.
        """
        found = await self.entry(chain, entry_id)
        if found is None:
            return None
        fields = row_fields(found[1])
        if b"n" in fields and b"k" in fields:
            return int(fields[b"n"]), int(fields[b"k"])
        segment = chain.holding(entry_id)
        assert segment is not None
        keys = self.keys(segment.owner, segment.segment)
        (info,) = await self._scope.connection.transaction(
            [("HMGET", keys.info, "n", "k")], key=keys.info
        )
        count, tokens = int(info[0] or 0), int(info[1] or 0)
        low = entry_id
        while True:
            rows = await self._range_raw(keys.log, "(" + low, "+", 1_000)
            for row in rows:
                count -= 1
                tokens -= int(row_fields(row).get(b"t", b"0"))
            if len(rows) < 1_000:
                return count, tokens
            low = text(rows[-1][0])

    async def _range(self, segment: Segment, low: str, count: int) -> list[Any]:
        keys = self.keys(segment.owner, segment.segment)
        exists, rows = await self._scope.connection.transaction(
            [("EXISTS", keys.info), ("XRANGE", keys.log, low, segment.high, "COUNT", count)],
            key=keys.log,
        )
        self._check(exists, segment)
        return list(rows)

    async def _range_raw(self, key: str, low: str, high: str, count: int) -> list[Any]:
        (rows,) = await self._scope.connection.transaction(
            [("XRANGE", key, low, high, "COUNT", count)], key=key
        )
        return list(rows)

    def _check(self, exists: Any, segment: Segment) -> None:
        if not int(exists):
            raise CorruptEntryError(
                f"segment {segment.segment} of the history (frozen from {segment.owner}) is gone",
                tenant=self._scope.tenant,
                key=self.keys(segment.owner, segment.segment).log,
            )

    def bridge_args(
        self, session: str, rows: list[Row], counts: tuple[int, int]
    ) -> tuple[Any, ...]:
        """Rows as the scripts take them for a new live log: ``m``, then 9 per entry.

        Each is sealed for ``session``; its ``n`` and ``k`` (the history's
        messages and tokens up to it) are counted back from ``counts``, the
        last one's, so entries written before they were stored get them too.
        """
        reseal = self._scope.codec.reseal
        out: list[Any] = [len(rows)]
        count, tokens = counts
        numbered = []
        for owner, row in reversed(rows):
            fields = row_fields(row)
            numbered.append((owner, row, fields, count, tokens))
            count -= 1
            tokens -= int(fields.get(b"t", b"0"))
        for owner, row, fields, n, k in reversed(numbered):
            out += [
                text(row[0]),
                reseal(owner, session, fields.get(b"m", b"")),
                fields.get(b"t", b"0"),
                fields.get(b"c", b""),
                fields.get(b"r", b""),
                reseal(owner, session, fields.get(b"v", b"")),
                fields.get(b"vt", b"0"),
                n,
                k,
            ]
        return tuple(out)

    # -- holding and letting go ----------------------------------------------------

    async def hold(
        self,
        segments: Iterable[Segment | tuple[str, str]],
        holder: str,
        *,
        ttl_ms: int | None,
        pending_until: int = 0,
    ) -> bool:
        """Record ``holder`` as a reader of ``segments`` and make them last as long as it.

        Args:
            segments: Segments (or ``(owner, id)``).
            holder: The session that reads them ("": change the TTLs only).
            ttl_ms: The holder's TTL; ``None``: it never expires (nor do they).
            pending_until: For a session not written yet (a fork), the time
                (ms) it will have been written by; ``0``: it exists.

        Returns:
            False when one of them is gone (the rest may have been held); with no
            ``holder`` (TTLs only), those gone are skipped and the rest stretched.
        """
        by_owner: dict[str, list[str]] = {}
        for each in segments:
            owner, segment = (each.owner, each.segment) if isinstance(each, Segment) else each
            if segment not in by_owner.setdefault(owner, []):
                by_owner[owner].append(segment)
        for owner, ids in by_owner.items():
            keys = [k for s in ids for k in (self.keys(owner, s).log, self.keys(owner, s).info)]
            reply = await self._scope.connection.script(
                SCRIPTS.segment_hold,
                tuple(keys),
                (holder, pending_until, 0 if ttl_ms is None else ttl_ms),
                session=holder or None,
            )
            if text(reply[0]) != "ok":
                return False
        return True

    async def keep_alive(
        self,
        session: str,
        chain: Any,
        ttl: Any,
        *,
        now: bool = False,
        branches: Sequence[Any] | None = None,
    ) -> None:
        """Make the segments of ``session``'s chain outlast it, after a write refreshed its TTL.

        At most once per ``KEEP_ALIVE_MS`` (a tenth of the TTL, if shorter) per
        process, session and TTL, each time to the TTL plus two such periods: the
        segments then outlive the session whatever the writes between (an append
        moves the session's expiry to at most the TTL plus one period: see
        append.lua's ``stretch``). A TTL other than the last one's stretches them
        at once: a raised one moves the session's expiry past the last hold.

        Args:
            session: The session that was written.
            chain: Its chain, as stored.
            ttl: Its TTL in ms (``0`` or ``""``: none; its segments never expire then).
            now: The session's TTL was just set, raised or removed: stretch them
                whatever this process did last, and the segments its branches read
                too, which a rewind gave the TTL then in force.
            branches: With ``now``, the session's branches' records, if the caller
                read them with the TTL's change (else one more round trip reads them).
        """
        ttl_ms = int(text(ttl) or 0)
        every = min(KEEP_ALIVE_MS, ttl_ms // 10) if ttl_ms else KEEP_ALIVE_MS
        clock = time.monotonic()
        last = self._stretched.get(session)
        if not now and last is not None and last[1] == ttl_ms and clock - last[0] < every / 1000:
            return
        self._stretched.put(session, (clock, ttl_ms))
        records: Sequence[Any] = branches or []
        if now and branches is None:
            key = self._scope.keys(session).branches
            (records,) = await self._scope.connection.batch(
                [("HVALS", key)], session=session, key=key
            )
        # A branch's segment may be gone (it lasted its rewind's TTL): a hold without a
        # reader skips it and stretches the rest.
        until = ttl_ms + 2 * every if ttl_ms else None
        await self.hold(segments_of(chain, records), "", ttl_ms=until)

    async def register(self, segments: Iterable[tuple[str, str]]) -> None:
        """List new segments in the tenant's registry (``forget_tenant`` walks it)."""
        members = [f"{owner}:{s}" for owner, s in segments]
        if not members:
            return
        now = self._scope.wall_ms()
        await self._scope.connection.transaction(
            [("ZADD", self.registry, *(x for m in members for x in (now, m)))], key=self.registry
        )

    async def release(self, segments: Iterable[tuple[str, str]]) -> int:
        """Delete those of ``segments`` no session reads any more; how many went.

        A holder is gone when its session no longer exists, or no longer
        names the segment in its chain or branches (and is not a fork still
        being made). Holders recorded meanwhile keep it (the delete compares).
        """
        deleted = 0
        for owner, segment in dict.fromkeys(segments):
            keys = self.keys(owner, segment)
            now, info = await self._scope.connection.transaction(
                [("TIME",), ("HGETALL", keys.info)], key=keys.info
            )
            now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
            holders = {
                name[2:]: value for name, value in pairs(info).items() if name.startswith("h:")
            }
            gone = []
            for holder, value in holders.items():
                if value != "0" and int(value) + CLOCK_MARGIN_MS >= now_ms:
                    continue  # a fork that may still be written
                if not await self._holds(holder, segment):
                    gone += [holder, value]
            if 2 * len(holders) > len(gone):
                if gone:  # forget those that are gone; the segment stays for the rest
                    await self._scope.connection.script(
                        SCRIPTS.segment_release, (keys.log, keys.info), ("0", *gone)
                    )
                continue
            if int(
                await self._scope.connection.script(
                    SCRIPTS.segment_release, (keys.log, keys.info), ("1", *gone)
                )
            ):
                deleted += 1
                await self._scope.connection.transaction(
                    [("ZREM", self.registry, f"{owner}:{segment}")], key=self.registry
                )
        return deleted

    async def delete(self, segments: Iterable[tuple[str, str]]) -> None:
        """Delete segments whoever reads them (``forget_tenant``: every reader goes too)."""
        for owner, segment in dict.fromkeys(segments):
            keys = self.keys(owner, segment)
            await self._scope.connection.transaction(
                [("UNLINK", keys.log, keys.info)], key=keys.log
            )

    async def delete_registered(self) -> None:
        """Delete every segment the tenant's registry lists, then the registry."""
        while True:
            (members,) = await self._scope.connection.transaction(
                [("ZRANGE", self.registry, 0, 199)], key=self.registry
            )
            if not members:
                return
            named = [tuple(text(m).split(":")) for m in members]
            await self.delete([(n[0], n[1]) for n in named if len(n) == 2 and _valid(n[0])])
            await self._scope.connection.transaction(
                [("ZREM", self.registry, *members)], key=self.registry
            )

    async def _holds(self, holder: str, segment: str) -> bool:
        """True when session ``holder`` exists and reads ``segment`` (chain or branches)."""
        try:
            keys = self._scope.keys(holder)
        except InvalidIdError:
            return False
        meta, branches = await self._scope.connection.transaction(
            [("HMGET", keys.meta, Meta.SEQ, Meta.CHAIN), ("HVALS", keys.branches)], key=keys.meta
        )
        if meta[0] is None:
            return False
        mark = f":{segment}:".encode()
        return mark in (meta[1] or b"") or any(mark in value for value in branches)


def _valid(owner: str) -> bool:
    """True for a session id (a registry member written by hand may hold anything)."""
    try:
        _keys.validate_id(owner, "session")
    except InvalidIdError:
        return False
    return True

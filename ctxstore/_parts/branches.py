"""Rewinds and the branches they leave: a history cut back, with nothing destroyed.

``rewind(session, to)`` ends the history at an entry (or a checkpoint's), for
every pod at once, in one script fenced by the lease (``rewind.lua``), as a
replace is: the epoch is bumped, the entries after it leave the live log for
a new segment (:mod:`ctxstore._parts.lineage`) that a *branch* names, and the
counters, protected copies, checkpoints, summary, anchors and search index
follow. The branch stays readable (:meth:`Branches.read`) until it expires
(the session's TTL from the rewind on), is pushed out by newer ones
(``max_branches``) or the session goes; until then the entries it moved out
of the live log stay charged to the session's ``session_bytes`` (a rewind
gives no room back, a branch pushed out does), so what a session holds,
branches included, stays within its quota.

A target older than the live log (in the chain a fork left) is reached by
reading, from the immutable segments, the newest entries up to it (the
*bridge*, bounded by ``bridge_tokens`` and ``bridge_entries``); the script then
makes them the new live log, if the chain is still the one read.

A rewind costs what it abandons from the live log (each entry is moved once),
plus the bridge for a target in the chain; never a pass over the history.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from ctxstore._layout.chain import Chain
from ctxstore._layout.codec import Meta, Reply, raw_pairs, text
from ctxstore._layout.formats import entry_order
from ctxstore._layout.validate import check_entry_id, check_int, check_numbered_id
from ctxstore._parts.checkpoints import Checkpoints
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.scope import Scope
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.quotas import Quotas
from ctxstore.errors import (
    CorruptEntryError,
    EntryNotFoundError,
    EpochChangedError,
    SessionNotFoundError,
)
from ctxstore.lease import Lease, fenced
from ctxstore.models import Branch, Checkpoint, HistoryPage, RewindResult

__all__ = ["Branches"]

_ATTEMPTS = 4
"""Rewinds tried when a fork keeps freezing the log between the read and the write."""


class Branches:
    """One tenant's rewinds and branches.

    Args:
        scope: The tenant's scope.
        quotas: The tenant's limits (its default TTL).
        lineage: The tenant's segments.
        checkpoints: The tenant's checkpoints.
    """

    def __init__(
        self, scope: Scope, quotas: Quotas, lineage: Lineage, checkpoints: Checkpoints
    ) -> None:
        self._scope = scope
        self._quotas = quotas
        self._lineage = lineage
        self._checkpoints = checkpoints

    async def rewind(
        self, session: str, to: str | Checkpoint, *, lease: Lease | None
    ) -> RewindResult:
        """End the history at ``to`` (see ``ContextStore.rewind``)."""
        keys = self._scope.keys(session)
        target, point = await self._checkpoints.resolve(session, to)
        checkpoint = point.checkpoint_id if point is not None else ""
        limits = await self._quotas.resolved(session)
        call = secrets.token_urlsafe(9)  # this call's id: its retries are answered, not refused
        async with fenced(self._scope, session, lease) as held:
            for _ in range(_ATTEMPTS):
                segment = secrets.token_urlsafe(9)
                chain, deep = await self._deep_args(session, target)
                seg = self._lineage.keys(session, segment)
                reply = await self._scope.connection.script(
                    SCRIPTS.rewind,
                    (
                        *(keys.log, keys.meta, keys.keep, keys.view, keys.lease, keys.anchor),
                        *(keys.index, keys.idem, keys.idem_old, keys.checkpoints),
                        *(keys.checkpoint_summaries, keys.branches, seg.log, seg.info),
                    ),
                    (
                        *(held.token, held.fence, held.now_arg(), call, self._scope.period_ms),
                        *(target, checkpoint, session, segment, limits.ttl_arg),
                        *(self._scope.settings.max_branches, str(chain), *deep),
                    ),
                    session=session,
                    replicas=self._scope.settings.replica_acks,
                )
                if text(reply[0]) != Reply.RELAYOUT:
                    break
            else:
                raise EpochChangedError(-1, -1, tenant=self._scope.tenant, session=session)
            status = text(reply[0])
            if status == Reply.LEASE_LOST:
                raise held.mark_lost()
            if status == Reply.ABSENT:
                raise SessionNotFoundError(
                    "no such session", tenant=self._scope.tenant, session=session, key=keys.meta
                )
            if status != Reply.OK:
                raise EntryNotFoundError(
                    f"entry {target} is not in the history",
                    tenant=self._scope.tenant,
                    session=session,
                    key=keys.log,
                )
            held.consumed()
        branch = text(reply[5]) or None
        if branch is not None and int(reply[7]):
            await self._lineage.register([(session, segment)])
        evicted = [tuple(word.split(":")) for word in text(reply[6]).split()]
        if evicted:
            await self._lineage.release([(owner, seg_id) for owner, seg_id in evicted])
        if reply[8]:  # its TTL was refreshed: the chain's segments must outlast it
            await self._lineage.keep_alive(session, reply[8], reply[9], now=True)
        return RewindResult(
            epoch=int(reply[1]),
            seq=int(reply[2]),
            count=int(reply[3]),
            abandoned=int(reply[4]),
            branch=branch,
        )

    async def _deep_args(self, session: str, target: str) -> tuple[Chain, tuple[Any, ...]]:
        """The chain read, and the script's arguments for a target in it (the bridge).

        Raises:
            EntryNotFoundError: The target is not in the chain's history.
        """
        keys = self._scope.keys(session)
        ((raw_chain,),) = await self._scope.connection.transaction(
            [("HMGET", keys.meta, Meta.CHAIN)], session=session, key=keys.meta
        )
        chain = Chain.parse(raw_chain)
        if not chain or (target and entry_order(target) > entry_order(chain.base)):
            return chain, ("",)
        if not target:
            return chain, ("1", 0, 0, "", 0)
        counts = await self._lineage.counts_at(chain, target)
        if counts is None:
            raise EntryNotFoundError(
                f"entry {target} is not in the history",
                tenant=self._scope.tenant,
                session=session,
                key=keys.log,
            )
        settings = self._scope.settings
        rows, bound = await self._lineage.bridge(
            chain, target, tokens=settings.bridge_tokens, entries=settings.bridge_entries
        )
        upto = chain.upto(bound) if bound else Chain()
        return chain, ("1", *counts, str(upto), *self._lineage.bridge_args(session, rows, counts))

    # -- branches ----------------------------------------------------------------

    async def read_all(self, session: str) -> list[Branch]:
        """The session's branches, oldest first (see ``ContextStore.branches``)."""
        keys = self._scope.keys(session)
        (raw,) = await self._scope.connection.transaction(
            [("HGETALL", keys.branches)], session=session, key=keys.branches
        )
        found = []
        for name, value in raw_pairs(raw):
            branch_id, record = text(name), self._record(session, text(name), value)
            readable = await self._readable(Chain.parse(record["chain"]), record["at"])
            found.append(
                Branch(
                    branch_id=branch_id,
                    at=record["at"],
                    end=record["end"],
                    count=int(record["count"]),
                    tokens=int(record["tokens"]),
                    created_ms=int(record["made"]),
                    epoch=int(record["epoch"]),
                    readable=readable,
                    bytes=int(record["bytes"]),
                )
            )
        return sorted(found, key=lambda b: int(b.branch_id[3:]))

    async def read(
        self, session: str, branch: str, *, after: str | None, limit: int
    ) -> HistoryPage:
        """One page of a branch's messages, oldest first (see ``ContextStore.read_branch``).

        Raises:
            EntryNotFoundError: The session has no such branch.
            CorruptEntryError: Its entries have expired.
        """
        keys = self._scope.keys(session)
        check_numbered_id(branch, "br", "branch", session)
        check_int(limit, "limit", low=1, high=10_000, session=session)
        if after is not None:
            check_entry_id(after, session)
        raw = await self._scope.named(session, keys.branches, branch, "branch")
        record = self._record(session, branch, raw)
        start = after if after is not None else record["at"] or None
        if start and entry_order(start) < entry_order(record["at"] or "0-0"):
            start = record["at"]
        rows = await self._lineage.read(Chain.parse(record["chain"]), start, limit)
        entries = [self._scope.codec.stored(owner, row) for owner, row in rows]
        next_after = entries[-1].entry_id if len(entries) == limit else None
        return HistoryPage(entries, int(record["epoch"]), next_after)

    async def _readable(self, chain: Chain, at: str) -> bool:
        """True while every segment holding entries of the branch (after ``at``) exists."""
        for segment, _ in chain.ranges():
            if at and entry_order(segment.high) <= entry_order(at):
                continue
            keys = self._lineage.keys(segment.owner, segment.segment)
            (exists,) = await self._scope.connection.transaction(
                [("EXISTS", keys.info)], key=keys.info
            )
            if not int(exists):
                return False
        return True

    def _record(self, session: str, branch: str, raw: Any) -> dict[str, str]:
        """A branch's record (``rewind.lua``'s JSON).

        Raises:
            CorruptEntryError: It is not one.
        """
        try:
            record = json.loads(raw)
            fields = {
                name: str(record[name])
                for name in ("at", "end", "count", "tokens", "chain", "made", "epoch")
            }
            fields["bytes"] = str(int(record.get("bytes", 0)))  # none: given back at its rewind
            return fields
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptEntryError(
                f"branch {branch} cannot be read: {exc}",
                tenant=self._scope.tenant,
                session=session,
                key=self._scope.keys(session).branches,
            ) from exc

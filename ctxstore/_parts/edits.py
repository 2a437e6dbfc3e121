"""Edits: the writes that change a session other than by appending to it.

Replace and clear run ``rewrite.lua`` under the session's lease: the epoch
is bumped and the cached summary dropped in the same step, and what a
history's segments held is given back after. Pop takes the newest message
off (lock-free, as an append: one step reads and deletes it, and a retry
gets the same message), reaching into the chain when the live log is
empty. Pin marks a stored message as sent by every view; a TTL moves every
key's expiry (and its segments'); delete leaves a tombstone and takes the
session out of the tenant's index.

A replace may create its session: it runs through :meth:`Writer.listed`,
which keeps the tenant's index true around it, and its messages are
serialized as an append's are (:meth:`Writer.entries`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from ctxstore._layout.chain import Chain, row_fields
from ctxstore._layout.chain import held as held_segments
from ctxstore._layout.codec import Meta, Reply, text
from ctxstore._layout.keys import SessionKeys
from ctxstore._layout.validate import MAX_TTL_SECONDS, check_entry_id, check_int, check_messages
from ctxstore._parts.lineage import Lineage
from ctxstore._parts.scope import Scope
from ctxstore._parts.writes import RESERVE_ATTEMPTS, Writer, refused
from ctxstore._plan.warm import WarmViews
from ctxstore._redis.connection import Commands
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.index import TenantIndex
from ctxstore._tenant.quotas import Limits, Quotas
from ctxstore._tenant.staged import StagedImports
from ctxstore.errors import InvalidInputError, SessionNotFoundError, StoreUnavailableError
from ctxstore.lease import Lease, clock_arg, fenced
from ctxstore.models import StoredMessage, WriteResult

__all__ = ["Editor"]


class Editor:
    """One tenant's edits: replace, clear, pop, pin, TTL and delete.

    Args:
        scope: The tenant's scope.
        quotas: The tenant's limits.
        index: The tenant's index of sessions.
        lineage: The tenant's frozen segments.
        writer: Serializes messages and lists a session a write may create.
        warm: The views this process keeps (a deleted session's are dropped).
    """

    def __init__(
        self,
        scope: Scope,
        quotas: Quotas,
        index: TenantIndex,
        lineage: Lineage,
        writer: Writer,
        warm: WarmViews,
    ) -> None:
        self._scope = scope
        self._quotas = quotas
        self._index = index
        self._lineage = lineage
        self._writer = writer
        self._warm = warm

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
        entries = self._writer.entries(session, messages, limits, pinned=False)
        async with fenced(self._scope, session, lease) as held:
            reply = await self._rewrite(session, keys, entries, limits, held, expected_seq)
            status = text(reply[0])
            if status == Reply.LEASE_LOST:
                raise held.mark_lost()
            if status != Reply.OK:
                raise self._writer.refusal(reply, expected_seq, session, keys.meta)
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
                refused=refused,
                after=after,
            )

        return await self._writer.listed(session, limits, run)

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
                refused=refused,
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
            raise self._writer.refusal(reply, None, session, keys.meta)
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
                raise self._writer.refusal(reply, None, session, keys.meta)
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
        delete whose reply was lost answers as it was applied. No view of it
        stays in this process.
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
        await StagedImports(self._scope).drop(session)  # an import of it a dead pod left
        self._warm.discard(self._scope.tenant, session)  # no copy of it stays in this pod
        return int(existed) == 1

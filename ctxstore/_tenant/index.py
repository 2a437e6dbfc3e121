"""The tenant's index: its sessions by last activity, kept true beside them.

The tenant's keys carry the tag ``{tenant}`` and so live in another slot than
its sessions' keys: the index is maintained beside the session scripts, in
its own round trips, and kept true by pruning sessions whose keys are gone.
:class:`TenantIndex` is the sorted set of the tenant's sessions (session ->
last activity, ms), for listing, the session quota, the workers' sweep and
forgetting the tenant; a write that may create a session first takes a
:class:`Reservation` in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import Meta, scored, text
from ctxstore._layout.memo import Memo
from ctxstore._layout.validate import INT64, check_int
from ctxstore._redis.connection import Commands
from ctxstore._redis.scripts import SCRIPTS
from ctxstore._tenant.acl import TENANT_USER_PREFIX
from ctxstore.errors import (
    CtxstoreError,
    InvalidIdError,
    PermissionDeniedError,
    QuotaExceededError,
    StoreFullError,
)
from ctxstore.lease import clock_arg
from ctxstore.models import SessionSummary

if TYPE_CHECKING:
    from ctxstore._parts.scope import Scope
    from ctxstore._tenant.quotas import Limits

__all__ = [
    "CLOCK_MARGIN_MS",
    "NO_RESERVATION",
    "RESERVATION_MS",
    "Reservation",
    "TenantIndex",
    "valid_id",
]

log = logging.getLogger("ctxstore.tenancy")  # the name it had before the split: log configs use it

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Reservation:
    """A place in the tenant's index that a write may create the session under.

    Attributes:
        token: Names it in the index's pending reservations.
        deadline_ms: A write may create the session until then (the index's time).
    """

    token: str
    deadline_ms: int

    @property
    def args(self) -> tuple[str, int]:
        """As the write scripts take it."""
        return self.token, self.deadline_ms


NO_RESERVATION = ("", 0)
"""The write scripts' arguments when no reservation is held."""


class TenantIndex:
    """The tenant's sessions, scored by last activity: listing, session quota, pruning.

    The index and the sessions live in different slots, so they cannot change
    in one step; a protocol keeps them true instead (see ``reserve.lua`` and
    ``unlist.lua``): a write may create a session only under a live
    reservation, which lists it first; a session seen gone is taken out only
    when no reservation that could still create it is pending. So a session
    whose keys exist is always listed (listing, the session quota, the
    workers' sweep and ``forget_tenant`` see it), and one listed but gone is
    found and pruned when the index is read.
    """

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self.key = _keys.tenant_sessions_key(scope.prefix, scope.tenant)
        self.tenants_key = _keys.tenants_key(scope.prefix)
        self._pending = _keys.tenant_pending_keys(scope.prefix, scope.tenant)
        self.deleted_key = _keys.tenant_deleted_key(scope.prefix, scope.tenant)
        self._known: Memo[str, float] = Memo()  # sessions this process touched, and when
        self._unlisted = False  # its user may not write the tenants set

    @property
    def keys(self) -> tuple[str, str, str, str]:
        """The index, its pending reservations and deleted sessions, as its scripts take them."""
        return (self.key, *self._pending, self.deleted_key)

    def touch_due(self, session: str) -> tuple[Any, ...] | None:
        """The command refreshing the session's last activity, if due here; it is then counted sent.

        Due on this process's first write of the session, then at most once per
        ``index_interval`` (the scope's clock when it has one), however often it
        writes. Only a listed session's score is changed (``XX``): listing is
        the reservation's job, under the quota, and a touch of a session that
        does not exist (yet) changes nothing. A score only moves forward
        (``GT``): a touch that lands late, or from a pod whose clock is behind,
        never makes a session look idle.
        """
        clock = self._scope.clock
        now = clock.now_ms() / 1000 if clock is not None else time.monotonic()
        last = self._known.get(session)
        if last is not None and 0 <= now - last < self._scope.settings.index_interval:
            return None
        self._known.put(session, now)
        return ("ZADD", self.key, "XX", "GT", self._scope.wall_ms(), session)

    async def touching(self, session: str, write: Callable[[Commands], Awaitable[T]]) -> T:
        """Run ``write`` with the session's activity touch, when due (:meth:`touch_due`).

        On a standalone Redis the touch rides in the write's round trip:
        ``write`` gets it as the commands to send after its script. At a turn
        every few seconds, each write would otherwise pay a round trip of its
        own for it. In a cluster the index may live on another node: the touch
        goes there in a round trip of its own, alongside the write's, and is
        cancelled if the write fails.
        """
        touch = self.touch_due(session)
        if touch is None:
            return await write(())
        if not self._scope.connection.cluster:
            return await write((touch,))
        sending = asyncio.create_task(self.send_touch(session, touch))
        try:
            result = await write(())
        except BaseException:
            sending.cancel()
            raise
        await sending  # best effort: it raises nothing of its own
        return result

    async def send_touch(self, session: str, command: tuple[Any, ...]) -> None:
        """Send ``command`` (from :meth:`touch_due`) in a round trip of its own.

        Best effort, as it comes with a write that may have landed: a failure
        is logged, never raised, and the touch is due again on the next write.
        """
        try:
            await self._scope.connection.batch([command], session=session, key=self.key)
        except CtxstoreError as exc:
            self._known.discard(session)
            log.warning("the index touch of session %r failed: %s", session, exc)

    async def reserve(self, session: str, limits: Limits) -> Reservation:
        """List the session, within the session quota, for a write that may create it.

        Raises:
            QuotaExceededError: The tenant has as many sessions as it may.
        """
        await self._register()
        token = secrets.token_urlsafe(9)
        reply = await self._reserve_once(session, limits, token)
        if int(reply[0]) != 1:
            # Full: some listed sessions may be gone (expired, deleted). Prune, ask again.
            (members,) = await self._scope.connection.transaction(
                [("ZRANGE", self.key, 0, -1)], key=self.key
            )
            if await self.prune([text(m) for m in members]):
                reply = await self._reserve_once(session, limits, token)
        if int(reply[0]) != 1:
            raise QuotaExceededError(
                "sessions",
                limits.sessions,
                int(reply[1]) + 1,
                tenant=self._scope.tenant,
                session=session,
                key=self.key,
            )
        return Reservation(token, int(reply[1]))

    async def _reserve_once(self, session: str, limits: Limits, token: str) -> Any:
        return await self._scope.connection.script(
            SCRIPTS.reserve,
            self.keys,
            (
                session,
                clock_arg(self._scope.clock),
                limits.sessions,
                token,
                RESERVATION_MS,
                CLOCK_MARGIN_MS,
            ),
            session=session,
        )

    async def _register(self) -> None:
        """Put the tenant in the tenants set (the workers' sweep walks it).

        On every reservation, not once per process: ``forget_tenant`` (on any
        pod) takes the tenant out, and its next session must bring it back.
        """
        if self._unlisted:
            return
        try:
            await self._scope.connection.transaction(
                [("SADD", self.tenants_key, self._scope.tenant)], key=self.tenants_key
            )
        except PermissionDeniedError:
            # A tenant's own user may touch no shared key: the sweep finds the tenant by
            # the user's name instead (see tenants()).
            self._unlisted = True

    async def unlist(
        self,
        seen_at: int,
        gone: list[tuple[str, str]],
        *,
        force: bool = False,
        deleted_until: int = 0,
    ) -> int:
        """Take sessions seen gone at ``seen_at`` (ms) out of the index (see unlist.lua).

        Args:
            seen_at: When they were seen gone, in the index's time (or earlier).
            gone: (session, its reservation that is spent or given up, or "").
            force: Remove them whatever is pending (forget_tenant, writers stopped).
            deleted_until: For a delete: when the keys it leaves (tombstone,
                idempotency records) expire, ms; ``forget_tenant`` finds them
                by it until then.

        Returns:
            How many were removed.
        """
        if not gone:
            return 0
        for session, _ in gone:
            self._known.discard(session)
        removed = await self._scope.connection.script(
            SCRIPTS.unlist,
            self.keys,
            (
                seen_at,
                CLOCK_MARGIN_MS,
                "1" if force else "0",
                deleted_until,
                *(x for pair in gone for x in pair),
            ),
        )
        return int(removed)

    async def now_ms(self) -> int:
        """The index's time (the injected clock's, if any), in ms."""
        if self._scope.clock is not None:
            return self._scope.clock.now_ms()
        (now,) = await self._scope.connection.transaction([("TIME",)], key=self.key)
        return int(now[0]) * 1000 + int(now[1]) // 1000

    async def prune(self, candidates: list[str], seen_at: int | None = None) -> set[str]:
        """Take the candidates whose keys are gone out of the index; return them.

        A member that is not a valid session id (written by hand, or by a
        tenant's own user) is removed as gone.

        Args:
            candidates: Listed sessions to check.
            seen_at: The index's time read before this call; read here when not given.
        """
        if not candidates:
            return set()
        seen_at = await self.now_ms() if seen_at is None else seen_at
        valid = [s for s in candidates if valid_id(s)]
        metas = [self._scope.keys(session).meta for session in valid]

        def queue(pipe: Any) -> None:
            for meta in metas:
                pipe.hexists(meta, Meta.SEQ)  # a lease alone makes a meta, not a session

        found = await self._scope.connection.pipeline(queue, key=self.key) if valid else []
        gone = {s for s, exists in zip(valid, found, strict=True) if not int(exists)}
        bad = set(candidates) - set(valid)
        if bad:
            log.warning(
                "tenant %s: skipped %d malformed index members", self._scope.tenant, len(bad)
            )
        # A full Redis keeps them listed: the next listing takes them out.
        with contextlib.suppress(StoreFullError):
            await self.unlist(seen_at, [(s, "") for s in sorted(gone | bad)])
        return gone | bad

    async def sessions(self, *, limit: int, before_ms: int | None) -> list[SessionSummary]:
        """The tenant's sessions that exist, most recently active first.

        Raises:
            InvalidInputError: ``limit`` or ``before_ms`` is out of range.
        """
        check_int(limit, "limit", low=1, high=10_000)
        check_int(before_ms, "before_ms", low=0, high=INT64, optional=True)
        high: str | int = "+inf" if before_ms is None else f"({before_ms}"
        seen_at, rows = await self._scope.connection.transaction(
            [
                ("TIME",),
                ("ZREVRANGEBYSCORE", self.key, high, "-inf", "WITHSCORES", "LIMIT", 0, limit),
            ],
            key=self.key,
        )
        if self._scope.clock is not None:
            now = self._scope.clock.now_ms()
        else:
            now = int(seen_at[0]) * 1000 + int(seen_at[1]) // 1000
        listed = scored(rows)
        gone = await self.prune([session for session, _ in listed], now)
        return [
            SessionSummary(session, _score_ms(score))
            for session, score in listed
            if session not in gone
        ]

    async def members(self) -> list[str]:
        """Every session the index lists (valid ids only), in no order.

        ``ZSCAN`` a batch at a time: a session listed throughout the walk is
        returned, whatever its activity does to its place meanwhile.
        """
        found: dict[str, None] = {}
        cursor: Any = 0
        while True:
            (reply,) = await self._scope.connection.transaction(
                [("ZSCAN", self.key, cursor, "COUNT", 500)], key=self.key
            )
            cursor, items = reply
            names = [text(m) for m, _ in scored(items)]
            found.update(dict.fromkeys(n for n in names if valid_id(n)))
            if text(cursor) == "0":
                return list(found)

    async def tenants(self) -> list[str]:
        """Every tenant that has written a session (for operators and the workers' sweep).

        The tenants set holds those whose pods run as the shared pod user;
        those with a Redis user of their own are found by its name
        (``ACL USERS``, where this user may list them). Names that are not
        valid tenant ids are left out, and logged. The set is read in pages,
        so no one reply holds all of it.
        """
        connection = self._scope.connection
        names: set[str] = set()
        cursor: Any = 0
        while True:  # no MULTI: a full Redis refuses to queue even a read in one
            ((cursor, members),) = await connection.batch(
                [("SSCAN", self.tenants_key, cursor, "COUNT", 1000)], key=self.tenants_key
            )
            names.update(text(m) for m in members)
            if text(cursor) == "0":
                break
        with contextlib.suppress(PermissionDeniedError):  # a pod's user may not list users
            (users,) = await connection.batch([("ACL", "USERS")], key=self.tenants_key)
            names.update(
                text(u).removeprefix(TENANT_USER_PREFIX)
                for u in users
                if text(u).startswith(TENANT_USER_PREFIX)
            )
        valid = sorted(name for name in names if valid_id(name))
        if len(valid) < len(names):
            log.warning(
                "skipped %d malformed members of %s", len(names) - len(valid), self.tenants_key
            )
        return valid

    def forget(self) -> None:
        """Forget what this process remembers of the index."""
        self._known.clear()


RESERVATION_MS = 10_000
"""How long a reservation lets a write create its session: the write's retries fit."""
CLOCK_MARGIN_MS = 1_000
"""How far the clocks of two Redis nodes may differ (a session's and its tenant's index)."""


def valid_id(name: str) -> bool:
    """True for a valid id (an index member written by hand may hold anything)."""
    try:
        _keys.validate_id(name, "session")
    except InvalidIdError:
        return False
    return True


def _score_ms(score: Any) -> int:
    """A last-activity score as ms; 0 for one that is not a finite number."""
    value = float(score)
    return int(value) if math.isfinite(value) else 0

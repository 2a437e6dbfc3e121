"""Token-owned, fenced leases on a session.

A lease is held by a random token and carries a *fencing number* that grows
with every acquisition (it lives in the session's meta, so it outlives the
lease key). Renew and release compare the token in Lua; every write made
under a lease (replace, clear, summary commits) compares token and fence in
the same script that writes, so a holder that paused past its expiry and
lost the lease to someone else is refused, and learns it by
:class:`~ctxstore.errors.LeaseLostError`.

Time comes from a :class:`Clock`. By default it is the Redis server's clock
(read inside the scripts, so pods with skewed clocks agree); tests inject a
:class:`~ctxstore.testing.ManualClock` and need no sleeps.

This is not redis-py's ``Lock``: its token is shared by every task of a
thread, and a cancelled release can leave it stuck in the versions arq allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Literal, Protocol, get_args

from ctxstore._layout.validate import check_seconds
from ctxstore._redis.scripts import SCRIPTS
from ctxstore.errors import CtxstoreError, InvalidInputError, LeaseHeldError, LeaseLostError

if TYPE_CHECKING:
    from ctxstore._layout.keys import SessionKeys
    from ctxstore._parts.scope import Scope
    from ctxstore._redis.connection import Connection

__all__ = ["Clock", "Lease", "LeaseKind", "clock_arg", "fenced", "take_lease"]

LeaseKind = Literal["write", "summary"]

_DAY = 86_400.0

log = logging.getLogger(__name__)


class Clock(Protocol):
    """A source of the current time for leases."""

    def now_ms(self) -> int:
        """The current time, in milliseconds since the epoch."""
        ...


class Lease:
    """A held lease on one session. Get one from :meth:`ContextStore.lease`.

    Attributes:
        session: The session it is on.
        token: The holder's random token.
        fence: The fencing number of this acquisition.
        expires_ms: When it expires unless renewed (in the clock's time).
        kind: ``"write"`` (replace, clear) or ``"summary"`` (a worker).
    """

    def __init__(
        self,
        connection: Connection,
        keys: SessionKeys,
        *,
        session: str,
        token: str,
        fence: int,
        expires_ms: int,
        ttl_ms: int,
        kind: LeaseKind,
        clock: Clock | None,
    ) -> None:
        self._connection = connection
        self._keys = keys
        self._ttl_ms = ttl_ms
        self._clock = clock
        self._lost = False
        self._released = False
        self.session = session
        self.token = token
        self.fence = fence
        self.expires_ms = expires_ms
        self.kind = kind

    @classmethod
    async def acquire(
        cls,
        connection: Connection,
        keys: SessionKeys,
        *,
        session: str,
        ttl_ms: int,
        wait_s: float,
        kind: LeaseKind,
        clock: Clock | None,
    ) -> Lease:
        """Take the lease, waiting up to ``wait_s`` for the current holder.

        A ``"write"`` lease takes over a live ``"summary"`` lease at once: the
        worker's commit will be refused, which is what a replace wants.

        Raises:
            LeaseHeldError: Another holder kept it for longer than ``wait_s``.
        """
        token = secrets.token_hex(16)
        preempt = "summary" if kind == "write" else ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        pause = 0.005
        while True:
            reply = await connection.script(
                SCRIPTS.lease_acquire,
                (keys.lease, keys.meta),
                (token, ttl_ms, clock_arg(clock), kind, preempt),
                session=session,
            )
            if int(reply[0]) == 1:
                return cls(
                    connection,
                    keys,
                    session=session,
                    token=token,
                    fence=int(reply[1]),
                    expires_ms=int(reply[2]),
                    ttl_ms=ttl_ms,
                    kind=kind,
                    clock=clock,
                )
            left = deadline - loop.time()
            if left <= 0:
                holder = reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
                raise LeaseHeldError(
                    f"the lease is held by a {holder} holder", session=session, key=keys.lease
                )
            await asyncio.sleep(min(left, random.uniform(0, pause)))
            pause = min(pause * 2, 0.25)

    @property
    def released(self) -> bool:
        """True once given back, or consumed by a fenced write: it can write no more."""
        return self._released

    @property
    def lost(self) -> bool:
        """True once a renew or a fenced write found the lease gone."""
        return self._lost

    def now_arg(self) -> int | str:
        """The time argument scripts take: the injected clock's, or ``''`` for the server's."""
        return clock_arg(self._clock)

    def mark_lost(self) -> LeaseLostError:
        """Record that the lease is gone; return the error to raise."""
        self._lost = True
        return LeaseLostError(
            f"lease (fence {self.fence}) expired or was taken over",
            session=self.session,
            key=self._keys.lease,
        )

    async def renew(self) -> None:
        """Extend the lease by its time to live.

        Raises:
            LeaseLostError: It expired or another holder has it now.
        """
        if self._lost or self._released:
            raise self.mark_lost()
        reply = await self._connection.script(
            SCRIPTS.lease_renew,
            (self._keys.lease, self._keys.meta),
            (self.token, self.fence, self._ttl_ms, self.now_arg()),
            session=self.session,
        )
        if int(reply[0]) != 1:
            raise self.mark_lost()
        self.expires_ms = int(reply[1])

    async def release(self) -> bool:
        """Give the lease back; False if it was no longer ours (nothing is deleted then)."""
        if self._released:
            return False
        self._released = True
        released = await self._connection.script(
            SCRIPTS.lease_release,
            (self._keys.lease, self._keys.meta),
            (self.token,),
            session=self.session,
        )
        return int(released) == 1

    def consumed(self) -> None:
        """Record that a fenced write released the lease in its own script."""
        self._released = True

    @contextlib.asynccontextmanager
    async def kept_alive(self, every_s: float | None = None) -> AsyncIterator[Lease]:
        """Renew the lease in the background while the block runs.

        If a renewal finds the lease lost, the task stops and :attr:`lost`
        becomes True; the next fenced write raises LeaseLostError.

        Args:
            every_s: Seconds between renewals; a third of the TTL by default.
        """
        interval = every_s if every_s is not None else self._ttl_ms / 3000

        async def renew_forever() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.renew()
                except LeaseLostError:
                    return
                except CtxstoreError as exc:
                    # Redis unreachable for now: the lease may still be ours; try again.
                    log.warning("lease renewal failed: %s", exc)

        task = asyncio.create_task(renew_forever())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._released:
            await self.release()


def clock_arg(clock: Clock | None) -> int | str:
    """The time argument scripts take: the clock's, or ``''`` for the server's."""
    return clock.now_ms() if clock is not None else ""


async def take_lease(
    scope: Scope,
    session: str,
    *,
    kind: LeaseKind = "write",
    ttl_s: float | None = None,
    wait_s: float | None = None,
) -> Lease:
    """Take a session's lease, with the settings' TTL and wait unless given.

    Raises:
        InvalidInputError: ``kind`` is not ``"write"`` or ``"summary"``, or a
            time is not a number of seconds up to a day.
        LeaseHeldError: Another holder kept it for longer than ``wait_s``.
    """
    if kind not in get_args(LeaseKind):
        raise InvalidInputError(f"kind must be 'write' or 'summary', not {kind!r}", session=session)
    settings = scope.settings
    ttl = check_seconds(
        settings.lease_ttl_seconds if ttl_s is None else ttl_s, "ttl_s", low=0.001, high=_DAY
    )
    wait = check_seconds(
        settings.lease_wait_seconds if wait_s is None else wait_s, "wait_s", low=0, high=_DAY
    )
    return await Lease.acquire(
        scope.connection,
        scope.keys(session),
        session=session,
        ttl_ms=max(1, int(ttl * 1000)),
        wait_s=wait,
        kind=kind,
        clock=scope.clock,
    )


@contextlib.asynccontextmanager
async def fenced(scope: Scope, session: str, lease: Lease | None) -> AsyncIterator[Lease]:
    """The write lease a fenced write (replace, clear, rewind) runs under.

    The one given (if it can still write), else one taken here; a lease taken
    here is given back when the block raises, unless it was lost or the write
    consumed it (:meth:`Lease.consumed`). A lease given stays the caller's.

    Raises:
        LeaseLostError: The lease given was consumed by an earlier write, or given back.
        LeaseHeldError: Another holder kept the lease for longer than we would wait.
    """
    if lease is not None and lease.released:
        raise lease.mark_lost()  # consumed by an earlier write, or given back
    held = lease or await take_lease(scope, session, kind="write")
    try:
        yield held
    except BaseException:
        if lease is None and not held.released and not held.lost:
            await held.release()
        raise

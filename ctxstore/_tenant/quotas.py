"""A tenant's quotas: its own limits (set by an operator) over the settings' defaults.

:class:`Quotas` reads the tenant's own limits from its hash, resolves them over
the settings' defaults into :class:`Limits` (what the write scripts take) and
caches them for ``LIMITS_TTL`` seconds per process, so that an operator's
change applies everywhere within that time. :func:`quota_error` turns a
script's quota refusal into the error the caller sees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import pairs, text
from ctxstore.errors import CorruptEntryError, InvalidInputError, QuotaExceededError
from ctxstore.models import TenantLimits

if TYPE_CHECKING:
    from ctxstore._parts.scope import Scope

__all__ = ["LIMITS_TTL", "Limits", "Quotas", "quota_error"]

LIMITS_TTL = 30.0
"""Seconds a tenant's limits are cached by a process."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits in force for one tenant, resolved; 0 means no limit."""

    message_bytes: int
    session_bytes: int
    session_tokens: int
    sessions: int
    appends_per_second: float
    append_burst: int
    ttl_ms: int
    checkpoints: int = 0

    @property
    def ttl_arg(self) -> int | str:
        """The default TTL as the scripts take it."""
        return self.ttl_ms or ""

    @property
    def bound_writes(self) -> bool:
        """A default TTL or a write quota is in force (an append must carry it)."""
        return bool(
            self.ttl_ms or self.session_bytes or self.session_tokens or self.appends_per_second
        )


def quota_error(
    reply: list[Any], *, tenant: str, session: str | None, key: str | None
) -> QuotaExceededError:
    """The error for a script's ``{'quota', name, limit, value, ...}`` refusal."""
    return QuotaExceededError(
        text(reply[1]), float(reply[2]), float(reply[3]), tenant=tenant, session=session, key=key
    )


class Quotas:
    """A tenant's limits: its own (set by an operator) over the settings' defaults."""

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self._key = _keys.tenant_limits_key(scope.prefix, scope.tenant)
        self._cached: tuple[float, Limits] | None = None

    async def own(self, session: str | None = None) -> TenantLimits:
        """The tenant's own limits, as stored (``None`` fields: the settings' defaults).

        Raises:
            CorruptEntryError: The stored limits cannot be read.
        """
        key = self._key
        (raw,) = await self._scope.connection.transaction(
            [("HGETALL", key)], key=key, session=session
        )
        fields = pairs(raw)
        try:
            return TenantLimits.model_validate_json(fields["limits"]) if fields else TenantLimits()
        except (KeyError, ValueError) as exc:
            raise CorruptEntryError(f"the tenant's limits cannot be read: {exc}", key=key) from exc

    async def set(self, limits: TenantLimits) -> None:
        """Store the tenant's own limits (applies within ``LIMITS_TTL`` everywhere)."""
        if not isinstance(limits, TenantLimits):
            raise InvalidInputError("limits must be a TenantLimits")
        await self._scope.connection.transaction(
            [("HSET", self._key, "limits", limits.model_dump_json(exclude_none=True))],
            key=self._key,
        )
        self._cached = None

    async def resolved(self, session: str | None = None) -> Limits:
        """The limits in force: the tenant's own over the settings', cached 30 s."""
        now = time.monotonic()
        cached = self._cached
        if cached is not None and now - cached[0] < LIMITS_TTL:
            return cached[1]
        own = await self.own(session)
        s = self._scope.settings

        def pick(mine: Any, default: Any) -> Any:
            return mine if mine is not None else default

        ttl = pick(own.ttl_seconds, s.session_ttl_seconds)
        limits = Limits(
            message_bytes=min(pick(own.message_bytes, s.max_message_bytes), s.max_message_bytes),
            session_bytes=pick(own.session_bytes, s.session_bytes) or 0,
            session_tokens=pick(own.session_tokens, s.session_tokens) or 0,
            sessions=pick(own.sessions, s.max_sessions) or 0,
            appends_per_second=pick(own.appends_per_second, s.appends_per_second) or 0,
            append_burst=pick(own.append_burst, s.append_burst),
            ttl_ms=ttl * 1000 if ttl else 0,
            checkpoints=pick(own.checkpoints, s.max_checkpoints) or 0,
        )
        self._cached = (now, limits)
        return limits

    def forget(self) -> None:
        """Drop the cached limits (they were deleted or changed)."""
        self._cached = None

    @property
    def key(self) -> str:
        """The hash holding the tenant's own limits."""
        return self._key

"""What the parts of one tenant's store share: the tenant and its scope.

A :class:`ContextStore` is a facade over parts (writes, reads, summaries,
tenancy, the queue hand-off), each owning one concept. They share one
:class:`Scope`: the tenant, the settings, the tenant's view of the process's
connection, the codec, the token counter and the clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import Codec
from ctxstore._redis.connection import Connection
from ctxstore.errors import EntryNotFoundError
from ctxstore.lease import Clock
from ctxstore.settings import Settings
from ctxstore.tokens import TokenCounter

__all__ = ["Scope"]


@dataclass(frozen=True, slots=True)
class Scope:
    """The tenant, and what every part of its store uses.

    Attributes:
        tenant: The tenant (validated).
        settings: The settings.
        connection: The process's connection, naming this tenant in errors.
        codec: Decodes and seals this tenant's values.
        counter: Counts tokens at append.
        clock: The time leases and the index use; ``None``: the server's
            clock in scripts, the wall clock elsewhere.
    """

    tenant: str
    settings: Settings
    connection: Connection
    codec: Codec
    counter: TokenCounter
    clock: Clock | None

    @property
    def prefix(self) -> str:
        """The first part of every key."""
        return self.settings.key_prefix

    def keys(self, session: str) -> _keys.SessionKeys:
        """The keys of one of this tenant's sessions.

        Raises:
            InvalidIdError: ``session`` is not a valid id.
        """
        if type(session) is not str:  # refused, or its characters as an exact str
            session = _keys.validate_id(session, "session")
        return _keys.valid_session_keys(self.prefix, self.tenant, session)

    @property
    def period_ms(self) -> int:
        """How long a call's reply is kept for its retries (``idempotency_seconds``), ms."""
        return int(self.settings.idempotency_seconds * 1000)

    async def named(self, session: str, key: str, name: str, what: str) -> Any:
        """The value of field ``name`` of one of the session's hashes (a checkpoint's record).

        Raises:
            EntryNotFoundError: There is none: no ``what`` of that name.
        """
        (value,) = await self.connection.transaction(
            [("HGET", key, name)], session=session, key=key
        )
        if value is None:
            raise EntryNotFoundError(
                f"no {what} {name}", tenant=self.tenant, session=session, key=key
            )
        return value

    def wall_ms(self) -> int:
        """Now, in ms: the injected clock's time, else this machine's."""
        return self.clock.now_ms() if self.clock is not None else int(time.time() * 1000)

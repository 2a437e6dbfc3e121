"""The tenant's imports in progress, so that delete and forget leave none of them behind.

An import stages a session's messages under keys of their own (a random token
in the session's slot) and renames them into place at its end line. One that
dies before then leaves them until they expire (an hour): messages in clear,
where nothing lists them. Each import registers its staging here first, in a
sorted set in the tenant's slot (``session token`` -> when its keys expire),
and takes it out when it commits or gives up; ``delete`` and ``forget_tenant``
read it and remove what it names.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from ctxstore._layout import keys as _keys
from ctxstore._layout.codec import scored, text
from ctxstore._tenant.index import valid_id

if TYPE_CHECKING:
    from ctxstore._parts.scope import Scope

__all__ = ["StagedImports"]


class StagedImports:
    """The registry of one tenant's imports in progress.

    Args:
        scope: The tenant's scope.
    """

    def __init__(self, scope: Scope) -> None:
        self._scope = scope
        self.key = _keys.tenant_staging_key(scope.prefix, scope.tenant)

    async def register(self, session: str, token: str, ttl_ms: int) -> None:
        """Name an import's staging, its keys lasting ``ttl_ms`` more; drop expired entries.

        Called at each batch it stages, as each moves its keys' expiry on.
        """
        now = int(time.time() * 1000)  # bookkeeping only: an entry outlives its keys a while
        await self._scope.connection.transaction(
            [
                ("ZREMRANGEBYSCORE", self.key, "-inf", f"({now - _MARGIN_MS}"),
                ("ZADD", self.key, now + ttl_ms, f"{session} {token}"),
            ],
            key=self.key,
        )

    async def unregister(self, session: str, token: str) -> None:
        """An import committed or gave up: its staging is gone."""
        await self._scope.connection.transaction(
            [("ZREM", self.key, f"{session} {token}")], key=self.key
        )

    async def drop(self, session: str | None = None) -> int:
        """Remove the staged keys of ``session``'s imports (every session's if None).

        Returns:
            How many imports' keys were removed.
        """
        connection = self._scope.connection
        pattern = "*" if session is None else f"{session} *"
        found: list[str] = []
        cursor: object = 0
        while True:
            ((cursor, items),) = await connection.batch(
                [("ZSCAN", self.key, cursor, "MATCH", pattern, "COUNT", 500)], key=self.key
            )
            found += [text(member) for member, _ in scored(items)]
            if text(cursor) == "0":
                break
        for member in found:
            owner, _, token = member.partition(" ")
            if not (valid_id(owner) and _TOKEN.fullmatch(token)):
                continue  # not the store's (a tenant's own user may write here): named no key
            stage = _keys.staging_keys(self._scope.prefix, self._scope.tenant, owner, token)
            await connection.transaction([("UNLINK", *stage)], session=owner, key=stage[0])
        if found:
            await connection.transaction([("ZREM", self.key, *found)], key=self.key)
        return len(found)


_MARGIN_MS = 60_000
"""How long an entry outlives its keys' expiry (clocks differ): then it is dropped."""
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""An import's token (``secrets.token_urlsafe``)."""

"""Faults injected at the connection's edge: a reply lost after Redis applied the script.

The SDK then retries the same call (same arguments, ids and keys), as it would after
a connection cut between the request and its reply.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis import exceptions as rex

from ctxstore import ContextStore
from ctxstore._redis.scripts import Script

Action = Callable[[], Awaitable[Any]]


def drop_reply(
    store: ContextStore,
    monkeypatch: pytest.MonkeyPatch,
    script: Script,
    between: Action | None = None,
    *,
    keys: int | None = None,
) -> list[bool]:
    """Lose the first reply of ``script`` after Redis applied it; run ``between``, then fail.

    The SDK then retries the same call (same arguments, ids and keys). A NOSCRIPT
    reply is not a script that ran, so it is passed through. Works for EVALSHA,
    EVAL and FCALL. Returns a list that holds True once a reply was dropped.
    ``keys``: only a call declaring that many keys (one of the append's two forms).
    """
    real = store._connection.node_call
    names = {script.sha, script.function, script.source}
    dropped: list[bool] = []

    async def node_call(key: str, commands: Any, **kwargs: Any) -> Any:
        replies = await real(key, commands, **kwargs)
        first = commands[0]
        if (
            not dropped
            and first[0] in ("EVALSHA", "EVAL", "FCALL")
            and first[1] in names
            and (keys is None or int(first[2]) == keys)
            and applied(replies[0])
        ):
            dropped.append(True)
            if between is not None:
                await between()
            raise rex.ConnectionError("the reply was lost after Redis applied the script")
        return replies

    monkeypatch.setattr(store._connection, "node_call", node_call)
    return dropped


def applied(reply: Any) -> bool:
    """True unless the reply is an error or a write script's refusal (nothing was written)."""
    if isinstance(reply, Exception):
        return False
    refusals = (b"conflict", b"quota", b"reserve", b"lease_lost", b"stale", b"keys")
    return not (isinstance(reply, list) and reply and reply[0] in refusals)

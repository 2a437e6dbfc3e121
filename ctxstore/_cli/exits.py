"""How a ``ctxstore`` command fails: a line naming what to fix, a status from one table.

The table is the same for every command:

```
0    done
1    it ran, and the answer is no: what it names is not there, or what it
     asked for did not happen (no such session, checkpoint, entry or tenant;
     a session that exists already; a summary that failed or timed out; no
     fresh health check)
2    it could not run: fix the command, a setting or the server (a bad flag
     or file, a malformed setting or URL, Redis unreachable, a permission the
     Redis user lacks, a feature the server lacks); argparse's own usage
     errors exit 2 too
130  interrupted (Ctrl-C)
```

The README's table is this one (a test keeps the two the same). A command
reports a failure by raising a :class:`~ctxstore.errors.CtxstoreError`;
:func:`status_of` is the one place its exit status is decided.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ctxstore.errors import (
    ConfigurationError,
    CtxstoreError,
    EntryNotFoundError,
    ForgetIncompleteError,
    InvalidInputError,
    PermissionDeniedError,
    SessionNotFoundError,
    StoreUnavailableError,
)

if TYPE_CHECKING:
    from ctxstore.settings import Settings

__all__ = ["ExitStatus", "address", "explain", "status_of"]


class ExitStatus(IntEnum):
    """What a ``ctxstore`` command's exit status says."""

    OK = 0
    """Done."""
    FAILED = 1
    """It ran, and the answer is no: not there, or it did not happen."""
    CANNOT_RUN = 2
    """It could not run: fix the command, a setting or the server."""
    INTERRUPTED = 130
    """Interrupted (Ctrl-C), as a shell reports SIGINT."""


_CANNOT_RUN: tuple[type[CtxstoreError], ...] = (
    ConfigurationError,
    InvalidInputError,
    StoreUnavailableError,
    PermissionDeniedError,
    ForgetIncompleteError,  # what is left, its Redis user may not delete
)
"""The errors that say the command, a setting or the server must change before it can run."""


def status_of(exc: CtxstoreError) -> ExitStatus:
    """The exit status a command that raised ``exc`` ends with."""
    if isinstance(exc, EntryNotFoundError):
        return ExitStatus.FAILED  # input, by its class; to a user, not there as a session is
    if isinstance(exc, _CANNOT_RUN):
        return ExitStatus.CANNOT_RUN
    return ExitStatus.FAILED


# -- the one line a failure is reported with ----------------------------------------


def explain(exc: CtxstoreError, settings: Settings | None) -> str:
    """The one line an error is reported with, naming what to fix (its status: ``status_of``)."""
    message = str(exc)
    variable, where = _url_setting(message, settings)
    if isinstance(exc, ForgetIncompleteError):
        line = f"forget of tenant {exc.tenant!r} is incomplete: {_bare(exc)}"
        if isinstance(exc.__cause__, PermissionDeniedError):
            line += f" (the Redis user of {variable} may not delete the rest)"
        return line
    if isinstance(exc, PermissionDeniedError):
        # errors.py has one class for both; the connection's edge words them apart.
        if "refused the credentials" in message:
            return f"{message}; check the user and password in {variable}"
        return f"{message}; run it as a Redis user that may ({variable})"
    if isinstance(exc, StoreUnavailableError):
        # Which key the call was for says nothing about a Redis that does not answer.
        return f"{_bare(exc).rstrip('. ')}; is Redis running at {where}? Check {variable}"
    if isinstance(exc, SessionNotFoundError) and None not in (exc.session, exc.tenant):
        return f"no session {exc.session!r} for tenant {exc.tenant!r}"
    if isinstance(exc, EntryNotFoundError) and None not in (exc.session, exc.tenant):
        return f"{_bare(exc)} in session {exc.session!r} of tenant {exc.tenant!r}"
    return message


def _bare(exc: CtxstoreError) -> str:
    """The error's message without the ``(tenant=..., key=...)`` that ``CtxstoreError`` adds."""
    where = [
        f"{name}={value!r}"
        for name, value in (("tenant", exc.tenant), ("session", exc.session), ("key", exc.key))
        if value is not None
    ]
    return str(exc).removesuffix(f" ({', '.join(where)})" if where else "")


def _url_setting(message: str, settings: Settings | None) -> tuple[str, str]:
    """The setting naming the Redis an error is about, and that Redis's address (no password)."""
    if settings is None:
        return "CTXSTORE_REDIS_URL", "its URL"
    if settings.queue_url is not None and message.startswith("the summary queue's"):
        return "CTXSTORE_QUEUE_URL", address(settings.queue_url)
    if settings.redis_url is None:
        return "CTXSTORE_REDIS_URL (unset: the embedded Redis)", "the embedded Redis"
    return "CTXSTORE_REDIS_URL", address(settings.redis_url)


def address(url: str) -> str:
    """Where a URL points, without its user or password."""
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return parts.path
        return f"{parts.hostname}:{parts.port or 6379}"
    except ValueError:
        return "its URL"

"""The ``ctxstore`` command's exit statuses: one table, the same for every command.

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

from ctxstore.errors import (
    ConfigurationError,
    CtxstoreError,
    EntryNotFoundError,
    ForgetIncompleteError,
    InvalidInputError,
    PermissionDeniedError,
    StoreUnavailableError,
)

__all__ = ["ExitStatus", "status_of"]


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
